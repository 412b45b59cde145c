"""A 4-bit bitsandbytes model on the CPU, loaded by nbhw's cell: the quantization really applied and its bytes,
against the plan's. bitsandbytes 0.50.2 (it has a CPU backend) is set up beside the venv by scripts/setup.sh test
and put on sys.path of a child process only, so it changes nothing for the other tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DISTS = Path(os.environ.get("NBHW_TEST_DISTS", ROOT / ".venv" / "nbhw-test-dists"))
if not DISTS.is_dir():  # a worktree shares the main checkout's venv
    DISTS = Path(sys.prefix) / "nbhw-test-dists"
BNB = DISTS / "bitsandbytes-0.50.2"

CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "without":  # a CPU without AVX512-BF16, faked at bitsandbytes' own probe
    import bitsandbytes.nn.modules
    bitsandbytes.nn.modules.has_avx512bf16 = lambda: False
from IPython.testing.globalipapp import start_ipython
import nbhw
ip = start_ipython()
ip.run_line_magic("load_ext", "nbhw")
plan = nbhw.plan(quantization="4bit", device_map="cpu")
ip.run_cell(plan.code, store_history=True).raise_error()
found = nbhw.loaded()["model"]
model = ip.user_ns["model"]
tensors = [*model.parameters(), *model.buffers()]
# bitsandbytes' own view of each 4-bit weight's state: absmax and the code, kept beside the packed data
tensors += [v for p in model.parameters() if getattr(p, "quant_state", None) is not None
            for v in p.quant_state.as_dict().values() if hasattr(v, "untyped_storage")]
truth = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())
absmax = sum(p.quant_state.absmax.numel() for p in model.parameters() if getattr(p, "quant_state", None) is not None)
from bitsandbytes.functional import has_avx512bf16
print(json.dumps({"loaded": found.loaded.to_dict(), "differences": [vars(d) for d in found.comparison.differences],
                  "truth": truth, "truth_absmax": absmax, "native_bf16": bool(has_avx512bf16())}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not BNB.is_dir(), reason=f"bitsandbytes 0.50.2 is not set up in {DISTS} (scripts/setup.sh test)")
@pytest.mark.parametrize("cpu_bf16", ["this CPU", "without"])
def test_a_4bit_model_shows_its_quantization_and_bytes_as_planned(cpu_bf16: str) -> None:
    # bitsandbytes repacks 4-bit weights at the first forward on a CPU with AVX512-BF16 (absmax in bfloat16): the
    # bytes match the plan on such a CPU and on one without, so the README's test command is green on both.
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(BNB), cpu_bf16], check=False, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    loaded = found["loaded"]
    assert loaded["quantization"] == {"method": "bitsandbytes", "replaced": {"Linear4bit": 14}}
    assert loaded["devices"]["cpu"]["bytes"] == found["truth"] and "uint8" in loaded["dtype_bytes"]
    assert found["differences"] == [], found["differences"]
    repacked = loaded["repacked_for_cpu_bytes"]
    if cpu_bf16 == "without" or not found["native_bf16"]:
        assert repacked == {}
    else:  # 14 layers' absmax, one float per 64 weights, 2 B less each in bfloat16
        assert repacked == {"cpu": 2 * (found["truth_absmax"])}, repacked
