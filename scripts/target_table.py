"""The table of docs/reference/targets.md: what nbhw advises for a Llama-3-8B-sized model on a handful of targets.

Run from the repository root with bitsandbytes importable, as the page's table was printed:
``PYTHONPATH=.venv/nbhw-test-dists/bitsandbytes-0.50.2 .venv/bin/python scripts/target_table.py``
(tests/core/plan/test_target_plans.py checks that the page holds exactly what it prints). Meta-device builds and dry
runs only: nothing is downloaded and no device is needed.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import nbhw
from nbhw.core.advice.quantization_methods import Loads, build_config
from nbhw.core.advice.quantization_sizes import stated_bits
from nbhw.core.advice.status import Status
from nbhw.core.plan.placement import is_accelerator
from nbhw.core.render import size

TARGETS = ("T4", "A100 80GB", "H100", "MI300X", "M3 Max 128GB", "Gaudi 2")
# meta-llama/Meta-Llama-3-8B's config.json, the fields that size it.
LLAMA_3_8B: dict[str, Any] = {
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "dtype": "bfloat16", "architectures": ["LlamaForCausalLM"],
}  # fmt: skip
HEADERS = (
    "target",
    "capability",
    "dtype (advised)",
    "weights",
    "run at 4,096 tokens + reserve",
    'device_map="auto", counting the run',
    "flash 2 / 3 / 4",
    "4-bit on load",
)


def llama_3_8b(folder: Path) -> str:
    """A folder holding a Llama-3-8B-sized config.json (no weights)."""
    from transformers import LlamaConfig

    LlamaConfig(**LLAMA_3_8B).save_pretrained(folder)
    return str(folder)


def _flash(advice: nbhw.AttentionAdvice) -> str:
    marks = {Status.WORKS: "yes", Status.WONT: "no"}
    return " / ".join(marks.get(advice.row(f"flash_attention_{n}").status, "?") for n in (2, 3, 4))


def _four_bit(target: str, dtype: str) -> str:
    """The 4-bit methods transformers quantizes on load with that pass its checks there (*: after a pip install)."""
    found = []
    for r in nbhw.quantization(target=target, dtype=dtype).rows:
        config, _ = build_config(r.method, dtype)
        bits = stated_bits(r.method, config) if config is not None else None
        usable = r.target is not None and r.target.status in {Status.WORKS, Status.PACKAGE}
        if r.loads is Loads.ON_LOAD and bits is not None and bits[0] == 4 and usable:
            found.append(r.method + ("" if r.shown.status is Status.WORKS else "*"))
    return ", ".join(found) or "none"


def _run(plan: Any) -> str:
    """The fullest accelerator of the placement: the run's peak there plus the backend's reserve, against its budget."""
    shares = [s for s in plan.placement.devices if is_accelerator(s.key) and s.needed_bytes is not None]
    if not shares:
        return "no run on the target"
    fullest = max(shares, key=lambda s: s.needed_bytes / (s.budget or 1))
    reserve = size(fullest.reserve_bytes or 0)
    return f"{size(fullest.needed_bytes)} of {size(fullest.budget or 0)} on {fullest.device} ({reserve} reserve)"


def row(target: str, model: str) -> list[str]:
    """One line of the table: the advice and the plan for ``model`` on ``target``."""
    advice = nbhw.attention(model, target=target, offline=True)
    dtype = advice.precision.dtype
    plan = nbhw.plan(model, target=target, dtype=dtype, offline=True)
    if plan.target is None or plan.estimate is None or plan.placement is None:
        raise SystemExit(f"no plan for {target}: {plan.check()}")
    a = plan.target.accelerator
    return [
        plan.target.label, a.compute_capability or a.arch, dtype, size(plan.weight_estimate.total_bytes), _run(plan),
        plan.placement.verdict, _flash(advice), _four_bit(target, dtype),
    ]  # fmt: skip


def table(model: str) -> str:
    """The markdown table."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row(t, model)) + " |" for t in TARGETS]
    return "\n".join(lines) + "\n"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sys.stdout.write(table(llama_3_8b(Path(tmp) / "llama-3-8b-sized")))


if __name__ == "__main__":
    main()
