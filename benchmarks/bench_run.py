"""The run planner's part of ``benchmarks/bench.py``: a Llama-3.1-70B-sized config (config.json only) at 32k tokens on
2 x 80 GiB, the whole plan with the run (one dry run of generate() on the meta device, the verdict counting it)
against the weights-only plan (what ``nbhw.plan`` computed before issue 16) in the same rounds.

Each side runs in a fresh interpreter per round, the rounds alternating. "first" is the first plan in the process
after the imports of torch, transformers and accelerate (reported apart: every load pays them) and includes the meta
build; "warm" is the same plan asked again (a new LoadPlan: the build and the dry run are remembered); "new size"
is the plan at another context in the same process (a new dry run, the build remembered); max context and max batch
are the searches, timed apart. Targets (issue 16): first <= 1.5 s, warm <= 0.5 s.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import published

MODEL = "Llama-3.1-70B"
BUDGET = {0: "80GiB", 1: "80GiB"}
CONTEXT = 32768

PRELUDE = """
import gc, json, sys, time
gc.disable()  # as nbhw's CLI runs: a one-shot process
t = time.perf_counter()
import torch, transformers, accelerate, accelerate.utils, transformers.modeling_utils
from transformers import AutoConfig, AutoModelForCausalLM
import nbhw
imports = time.perf_counter() - t
folder, repeat, context = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
budget = {0: "80GiB", 1: "80GiB"}

def timed(f):
    t, c = time.perf_counter(), time.process_time()
    out = f()
    return out, time.perf_counter() - t, time.process_time() - c
"""

WEIGHTS = (
    PRELUDE
    + """
def plan():
    p = nbhw.plan(folder, max_memory=budget, context=context)
    return p.weight_estimate, p.weight_placement

(est, placed), first, first_cpu = timed(plan)
warm = [timed(plan)[1] for _ in range(repeat)]
print(json.dumps({"imports": imports, "first": first, "first_cpu": first_cpu, "warm": warm,
                  "verdict": placed.verdict, "weights": est.total_bytes}))
"""
)

RUN = (
    PRELUDE
    + """
def plan(tokens=context):
    p = nbhw.plan(folder, max_memory=budget, context=tokens)
    return p, p.estimate, p.placement

(p, est, placed), first, first_cpu = timed(plan)
warm = [timed(plan)[1] for _ in range(repeat)]
new = [timed(lambda i=i: plan(context + 1024 * (i + 1)))[1:] for i in range(repeat)]
_, searched, _ = timed(lambda: p.context_fit)
_, batched, _ = timed(lambda: p.batch_fit)
print(json.dumps({"imports": imports, "first": first, "first_cpu": first_cpu, "warm": warm,
                  "new": [n[0] for n in new], "new_cpu": [n[1] for n in new], "max_context_s": searched,
                  "max_batch_s": batched, "verdict": placed.verdict, "weights": est.total_bytes,
                  "cache": est.cache_bytes, "activations": est.activation_bytes, "peak": est.peak_bytes,
                  "max_context": p.max_context, "max_batch": p.max_batch, "kernels": p.run.kernels,
                  "context_runs": p.context_fit.dry_runs, "batch_runs": p.batch_fit.dry_runs}))
"""
)


def measure(script: str, folder: str, repeat: int, env: dict[str, str] | None) -> dict[str, Any]:
    argv = [sys.executable, "-c", textwrap.dedent(script), folder, str(repeat), str(CONTEXT)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=True, env=env, timeout=900)
    found: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


@dataclass
class Side:
    """One way to plan, over several fresh processes."""

    name: str
    script: str
    runs: list[dict[str, Any]] = field(default_factory=list)

    def median(self, key: str) -> float:
        values = [v for r in self.runs for v in (r[key] if isinstance(r[key], list) else [r[key]])]
        return statistics.median(values)

    @property
    def last(self) -> dict[str, Any]:
        return self.runs[-1]


def compare(rounds: int, repeat: int, env: dict[str, str] | None = None) -> tuple[Side, Side]:
    """The run plan and the weights-only plan, each in a fresh process per round, alternating which goes first."""
    ours, before = Side("plan with the run", RUN), Side("weights only", WEIGHTS)
    with tempfile.TemporaryDirectory() as root:
        folder = published.folder(MODEL, Path(root))
        for i in range(rounds):
            for side in (ours, before) if i % 2 == 0 else (before, ours):
                side.runs.append(measure(side.script, folder, repeat, env))
    return ours, before


HEADERS = ("plan", "imports", "first", "first (CPU)", "warm", "new size", "new size (CPU)", "verdict")


def rows(ours: Side, before: Side) -> list[list[str]]:
    """The table: per side, seconds and the verdict."""
    found = []
    for side in (ours, before):
        new = f"{side.median('new'):.3f} s" if "new" in side.last else ""
        new_cpu = f"{side.median('new_cpu'):.3f} s" if "new_cpu" in side.last else ""
        found.append([side.name, f"{side.median('imports'):.2f} s", f"{side.median('first'):.3f} s",
                      f"{side.median('first_cpu'):.3f} s", f"{side.median('warm'):.3f} s", new, new_cpu,
                      side.last["verdict"]])  # fmt: skip
    return found


def details(ours: Side) -> list[str]:
    """What the run plan found, in words."""
    r, gib = ours.last, 2**30
    return [
        f"  {MODEL}-sized, bfloat16, {CONTEXT:,} tokens, batch 1, 2 x 80 GiB: weights {r['weights'] / gib:.2f} GiB, "
        f"cache {r['cache'] / gib:.2f} GiB, activations {r['activations'] / gib:.2f} GiB, peak {r['peak'] / gib:.2f}"
        f" GiB; attention sized as {r['kernels']}",
        f"  max context {r['max_context']:,} tokens ({r['context_runs']} dry runs, "
        f"{ours.median('max_context_s'):.2f} s); max batch {r['max_batch']} ({r['batch_runs']} dry runs, "
        f"{ours.median('max_batch_s'):.2f} s)",
    ]
