"""Real loads on this CPU with the quantization packages of the test environment: what from_pretrained really holds
equals nbhw's estimate within 5 %, both the quantization row's weight bytes and the plan's estimate.

optimum-quanto is in the venv (the test extra); bitsandbytes and torchao are installed beside it
(tests/support/dists.py), so their cases run again in a child process whose sys.path has them, and this process never
imports them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

import nbhw
from nbhw.core.advice.quantization_methods import build_config
from nbhw.core.advice.quantization_sizes import SizingQuantizer, loaded_weight_bytes, weight_bytes
from nbhw.core.hf import meta_build, model_config
from tests.support.dists import QUANTIZATION_DISTS

TOLERANCE = 0.05
ROOT = Path(__file__).resolve().parents[3]
CHILD = "NBHW_QUANT_CHILD"  # set in the child process, which must not start another
# What the child runs: these loads and the quantization rows' tests that need the package (gate, dry run, sizes).
CHILD_TESTS = ["tests/core/advice/test_quant_loads.py", "tests/core/advice/test_quantization.py"]
CHILD_SELECTION = "loaded_bytes or absmax or packed or t4_gates or dry_run_accepts or weight_bytes_say or environment"


def _needs(module: str) -> Any:
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"{module} is not installed")


def _config(method: str, **arguments: Any) -> Any:
    import transformers

    if method == "torchao":
        config, problem = build_config("torchao", "bfloat16")  # the one nbhw's cell writes
        assert config is not None, problem
        return config
    name = "QuantoConfig" if method == "quanto" else "BitsAndBytesConfig"
    return getattr(transformers, name)(**arguments)


CASES = [
    pytest.param("torchao", {}, "torchao", marks=_needs("torchao"), id="torchao-int8-weight-only"),
    pytest.param("quanto", {"weights": "int8"}, "quanto", marks=_needs("optimum"), id="quanto-int8"),
    pytest.param("quanto", {"weights": "int4"}, None, marks=_needs("optimum"), id="quanto-int4"),
    pytest.param(
        "bitsandbytes_4bit", {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "4bit", marks=_needs("bitsandbytes"),
        id="bitsandbytes-nf4",
    ),
    pytest.param(
        "bitsandbytes_4bit", {"load_in_4bit": True, "bnb_4bit_use_double_quant": True}, None,
        marks=_needs("bitsandbytes"), id="bitsandbytes-double-quant",
    ),
    pytest.param(
        "bitsandbytes_8bit", {"load_in_8bit": True}, "8bit", marks=_needs("bitsandbytes"), id="bitsandbytes-8bit"
    ),
]  # fmt: skip


def _load(folder: str, config: Any) -> Any:
    with meta_build.quiet():
        return AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.bfloat16, quantization_config=config, device_map="cpu"
        )


@pytest.mark.slow
@pytest.mark.parametrize(("method", "arguments", "word"), CASES)
def test_loaded_bytes_match_the_estimate(
    tiny_llama: str, method: str, arguments: dict[str, Any], word: str | None
) -> None:
    config = _config(method, **arguments)
    real = loaded_weight_bytes(_load(tiny_llama, config))
    of_model = model_config.load(tiny_llama, offline=True).config
    row = weight_bytes(method, of_model, config, "bfloat16")
    assert row.bytes is not None and abs(row.bytes - real) / real < TOLERANCE, (row, real)
    print(f"{method} {arguments}: loaded {real:,} B, nbhw {row.bytes:,} B ({(row.bytes - real) / real:+.2%})")
    if word is not None:  # the plan's estimate for the same method, through its quantization= word
        estimate = nbhw.plan(tiny_llama, quantization=word, dtype="bfloat16", device_map="cpu").estimate
        assert estimate is not None and abs(estimate.total_bytes - real) / real < TOLERANCE, (estimate, real)


@pytest.mark.slow
@_needs("bitsandbytes")
def test_transformers_sizes_alone_miss_bitsandbytes_absmax(tiny_llama: str) -> None:
    from transformers import BitsAndBytesConfig
    from transformers.integrations.accelerate import compute_module_sizes

    config = BitsAndBytesConfig(load_in_4bit=True)
    model = _load(tiny_llama, config)
    real = loaded_weight_bytes(model)
    built = meta_build.build(model_config.load(tiny_llama, offline=True).config, dtype="bfloat16")
    sizer = SizingQuantizer("bitsandbytes_4bit", config)
    assert built.model is not None and sizer.element == 0.5  # transformers' quantized_element_size
    without_scales = sum(
        p.numel() * sizer.element if sizer.param_needs_quantization(built.model, n) else p.numel() * 2
        for n, p in built.model.named_parameters()
    )
    assert (real - without_scales) / real > TOLERANCE  # quantized_element_size=0.5 leaves out the absmax
    assert model.get_memory_footprint() < real  # transformers' own footprint leaves it out too
    sizes, _ = compute_module_sizes(built.model, sizer)
    assert abs(sizes[""] - real) / real < TOLERANCE


@pytest.mark.slow
@_needs("torchao")
def test_packed_storage_is_counted_as_stored_not_at_the_logical_dtype(tiny_llama: str) -> None:
    model = _load(tiny_llama, _config("torchao"))
    logical = sum(p.numel() * 2 for p in model.parameters())
    assert loaded_weight_bytes(model) < logical
    assert model.get_memory_footprint() > loaded_weight_bytes(model)  # transformers counts the bf16 shape


def _beside_the_venv() -> dict[str, Path]:
    """The quantization wheels set up beside the venv that this process can't import."""
    return {m: f for m, f in QUANTIZATION_DISTS.items() if f.is_dir() and importlib.util.find_spec(m) is None}


@pytest.mark.slow
@pytest.mark.skipif(CHILD in os.environ, reason="this is the child process")
def test_the_wheels_beside_the_venv_load_for_real_in_a_child_process() -> None:
    beside = _beside_the_venv()
    if not beside:
        pytest.skip(
            "no quantization wheel beside the venv that this process lacks (scripts/setup.sh test sets them up)"
        )
    path = [*map(str, beside.values()), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), CHILD: "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *CHILD_TESTS]
    proc = subprocess.run(
        [*command, "-k", CHILD_SELECTION], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    for module in beside:  # each wheel's cases ran, none skipped as not installed
        assert f"{module} is not installed" not in out and "its check imports bitsandbytes" not in out, out[-6000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed is not None and int(passed.group(1)) >= 6, out[-3000:]
    assert not {"bitsandbytes", "torchao"} & set(sys.modules)  # this process never imported them
    print(f"child process with {', '.join(beside)}: {out.strip().splitlines()[-1]}")
