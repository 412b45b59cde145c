"""The run table of docs/reference/examples.md: published models (config-only folders, tests/support/published.py)
at 4k / 32k / 128k tokens.

    .venv/bin/python -m benchmarks.run_table

Per model and context: the weights (the dtype plan transformers applies), the KV cache (or recurrent state) right
after the prefill, and the run's peak on one accelerator, from ``nbhw.plan`` (a dry run of generate() on the meta
device); then the largest context that fits on one 24 GiB and one 80 GiB accelerator at batch 1 (weights, cache,
activations and the CUDA reserve together). Prints a Markdown table.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support import published

CONTEXTS = (4096, 32768, 131072)
BUDGETS = ("24GiB", "80GiB")
MODELS = (*published.TABLE, "T5-11B")  # the published table, and an encoder-decoder


def gib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**30:.1f}"


def one_device(folder: str, context: int, budget: str) -> Any:
    import nbhw

    return nbhw.plan(folder, device_map=0, max_memory={0: budget}, context=context)


def cells(folder: str, context: int) -> list[str]:
    """Weights, cache and peak at one context (GiB), or why there is none."""
    from nbhw import UserError

    try:
        plan = one_device(folder, context, BUDGETS[-1])
    except UserError as e:  # past the model's maximum positions: the message names it
        return [f"past its {str(e).split('at most ')[1].split(' tokens')[0]} positions", "", ""]
    est = plan.estimate
    if est is None or est.peak_bytes is None:
        return ["—", "—", "—"]
    cache = est.cache_bytes if est.cache_bytes else est.state_bytes
    return [gib(est.total_bytes), gib(cache), gib(est.peak_bytes)]


def max_context(folder: str, budget: str) -> str:
    plan = one_device(folder, CONTEXTS[0], budget)
    value = plan.max_context
    if value is None:
        return "—"
    return "weights don't fit" if value == 0 else f"{value:,}"


def table() -> list[str]:
    head = ["model"] + [f"{c // 1024}k: weights / cache / peak (GiB)" for c in CONTEXTS]
    head += [f"max context, 1 x {b}" for b in BUDGETS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    with tempfile.TemporaryDirectory() as root:
        for name in MODELS:
            folder = published.folder(name, Path(root))
            row = [name]
            for context in CONTEXTS:
                found = cells(folder, context)
                row.append(" / ".join(x for x in found if x))
            row += [max_context(folder, b) for b in BUDGETS]
            lines.append("| " + " | ".join(row) + " |")
            print(lines[-1], file=sys.stderr, flush=True)
    return lines


def main() -> int:
    start = time.perf_counter()
    lines = table()
    print("\n".join(lines))
    print(f"\n({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
