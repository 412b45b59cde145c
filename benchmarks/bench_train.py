"""The training planner's part of ``benchmarks/bench.py``: a Llama-3.1-70B-sized config (config.json only) fine-tuned
over 8 x 80 GiB, every strategy compared (``nbhw.train_plan(strategy="auto", devices=8)``), against the inference
plan of the same model in the same process (``nbhw.plan`` with its generate() dry run, 8 x 80 GiB, 4k tokens).

One fresh interpreter per round. "first" is the first plan after the imports (meta builds included); "warm" is the
same plan asked again (the dry runs are remembered per process). Each strategy row's own seconds come from the first
plan. Target (issue 18): every strategy compared <= 3 s warm.

    python -m benchmarks.bench_train [--method lora|full|qlora] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from tests.support import published

MODEL = "Llama-3.1-70B"
TARGET_S = 3.0

SCRIPT = """
import gc, json, sys, time, warnings
warnings.simplefilter("ignore")
gc.disable()  # as nbhw's CLI runs: a one-shot process
t = time.perf_counter()
import torch, transformers, accelerate, peft
import nbhw
imports = time.perf_counter() - t
folder, method = sys.argv[1], sys.argv[2]
budget = {i: "80GiB" for i in range(8)}

def timed(f):
    t = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t

def inference():
    p = nbhw.plan(folder, max_memory=budget, context=4096)
    return p.estimate

def train():
    return nbhw.train_plan(folder, method=method, batch=1, context=4096, gradient_checkpointing=True,
                           dtype="bfloat16", lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                           devices=8, device_memory="80GiB", device_type="cuda")

_, inference_first = timed(inference)
_, inference_warm = timed(inference)
plan, first = timed(train)
rows = [[r.label, r.device_bytes, r.host_bytes, r.seconds, r.problems[:1]] for r in plan.rows]
_, warm = timed(train)
print(json.dumps({"imports": imports, "inference_first": inference_first, "inference_warm": inference_warm,
                  "first": first, "warm": warm, "rows": rows, "recommended": plan.recommended.label,
                  "why": plan.why, "verdict": plan.verdict}))
"""


def measure(folder: str, method: str) -> dict[str, Any]:
    argv = [sys.executable, "-c", textwrap.dedent(SCRIPT), folder, method]
    proc = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=1800)
    found: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


def compare(method: str, rounds: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as root:
        folder = published.folder(MODEL, Path(root))
        return [measure(folder, method) for _ in range(rounds)]


def report(method: str, runs: list[dict[str, Any]]) -> list[str]:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    gib = 2**30
    last = runs[-1]
    lines = [
        f"{MODEL}-sized, {method}, batch 1 x 4,096 tokens, checkpointing, bf16, 8 x 80 GiB (median of {len(runs)})",
        f"  imports {med('imports'):.2f} s; inference plan first {med('inference_first'):.2f} s, warm "
        f"{med('inference_warm'):.3f} s",
        f"  train plan, every strategy: first {med('first'):.1f} s, warm {med('warm'):.3f} s "
        f"(target <= {TARGET_S:.0f} s warm: {'met' if med('warm') <= TARGET_S else 'NOT met'}); "
        f"first / inference first = {med('first') / med('inference_first'):.1f}x",
    ]
    for label, device, host, seconds, problems in last["rows"]:
        held = f"{device / gib:8.2f} GiB" + (f" (+{host / gib:.2f} GiB host)" if host else "")
        lines.append(f"    {label:38s} {held if not problems else problems[0][:70]:40s} {seconds:6.1f} s")
    lines.append(f"  recommended: {last['recommended']} ({last['why']}); {last['verdict']}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="lora", choices=("lora", "full", "qlora"))
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    runs = compare(args.method, args.rounds)
    print("\n".join(report(args.method, runs)))
    return 0 if statistics.median(r["warm"] for r in runs) <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
