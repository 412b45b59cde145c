"""The load planner's part of ``benchmarks/bench.py``: plan a Llama-3-70B-sized model (meta build + estimate +
placement), first and warm, against doing the same with accelerate's own estimate helpers.

Each side runs in a fresh interpreter per round, the rounds alternating, so "first" includes the one-off cost of
transformers' Llama modules but not the imports of torch, transformers.modeling_utils and accelerate (reported
apart: every load pays them). Targets (issue 10): first <= 1.2 s, warm <= 0.3 s.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from typing import Any

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
}
BUDGET = {0: "80GiB", 1: "80GiB", "cpu": "200GiB"}

PRELUDE = """
import json, sys, time
t = time.perf_counter()
import torch, transformers, accelerate, accelerate.utils, transformers.modeling_utils
from transformers import AutoConfig, AutoModelForCausalLM
imports = time.perf_counter() - t
folder, repeat, budget = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
budget = {int(k) if k.isdigit() else k: v for k, v in budget.items()}
"""

NBHW = (
    PRELUDE
    + """
t = time.perf_counter()
import nbhw
imports += time.perf_counter() - t

def run(max_memory):
    p = nbhw.plan(folder, device_map="auto", max_memory=max_memory)
    return p.estimate, p.placement

times = {}
for label, max_memory in (("live", None), ("max_memory", budget)):
    from nbhw.core.plan import stages as plan_module
    plan_module.clear_cache()
    t = time.perf_counter(); est, placed = run(max_memory); first = time.perf_counter() - t
    warm = []
    for _ in range(repeat):
        t = time.perf_counter(); run(max_memory); warm.append(time.perf_counter() - t)
    times[label] = {"first": first, "warm": warm, "bytes": est.total_bytes, "largest": est.largest_layer_bytes,
                    "verdict": placed.verdict, "map": {k: str(v) for k, v in placed.device_map.items()}}
print(json.dumps({"imports": imports, "times": times}))
"""
)

ACCELERATE = (
    PRELUDE
    + """
from accelerate import init_empty_weights
from accelerate.commands.estimate import estimate_training_usage
from accelerate.utils import calculate_maximum_sizes, get_balanced_memory, infer_auto_device_map

def run(max_memory):
    config = AutoConfig.from_pretrained(folder)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    total, largest = calculate_maximum_sizes(model)
    estimate_training_usage(total * 2, "bfloat16")
    no_split = model._no_split_modules
    memory = get_balanced_memory(model, max_memory=dict(max_memory) if max_memory else None,
                                 no_split_module_classes=no_split)
    device_map = infer_auto_device_map(model, max_memory=memory, no_split_module_classes=no_split)
    return total, largest, device_map

times = {}
for label, max_memory in (("live", None), ("max_memory", budget)):
    t = time.perf_counter(); total, largest, device_map = run(max_memory); first = time.perf_counter() - t
    warm = []
    for _ in range(repeat):
        t = time.perf_counter(); run(max_memory); warm.append(time.perf_counter() - t)
    times[label] = {"first": first, "warm": warm, "bytes": total, "largest": largest[0],
                    "verdict": "", "map": {k: str(v) for k, v in device_map.items()}}
print(json.dumps({"imports": imports, "times": times}))
"""
)


def measure(script: str, folder: str, repeat: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One fresh interpreter running one side: its imports, and per budget the first and the warm runs."""
    argv = [sys.executable, "-c", textwrap.dedent(script), folder, str(repeat), json.dumps(BUDGET)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=True, env=env)
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@dataclass
class Side:
    """One way to plan, over several fresh processes."""

    name: str
    script: str
    runs: list[dict[str, Any]] = field(default_factory=list)

    def imports(self) -> float:
        return statistics.median(r["imports"] for r in self.runs)

    def first(self, budget: str) -> float:
        return statistics.median(r["times"][budget]["first"] for r in self.runs)

    def warm(self, budget: str) -> float:
        return statistics.median(w for r in self.runs for w in r["times"][budget]["warm"])

    def result(self, budget: str) -> dict[str, Any]:
        times: dict[str, Any] = self.runs[-1]["times"][budget]
        return times


def compare(rounds: int, repeat: int, env: dict[str, str] | None = None) -> tuple[Side, Side]:
    """nbhw.plan and accelerate's helpers, each in a fresh process per round, alternating which goes first."""
    ours, theirs = Side("nbhw.plan", NBHW), Side("accelerate helpers", ACCELERATE)
    with tempfile.TemporaryDirectory() as folder:
        with open(f"{folder}/config.json", "w") as f:
            json.dump(CONFIG, f)
        for i in range(rounds):
            for side in (ours, theirs) if i % 2 == 0 else (theirs, ours):
                side.runs.append(measure(side.script, folder, repeat, env))
    return ours, theirs


BUDGETS = {"live": "this machine's free memory", "max_memory": "max_memory for 2 x 80 GiB GPUs + 200 GiB CPU"}
HEADERS = ("planner", "budget", "imports", "first", "warm", "GiB", "verdict")


def rows(ours: Side, theirs: Side) -> list[list[str]]:
    """The table: per side and budget, seconds and what it found."""
    found = []
    for side in (ours, theirs):
        for budget in BUDGETS:
            r = side.result(budget)
            found.append(
                [
                    side.name,
                    budget,
                    f"{side.imports():.2f} s",
                    f"{side.first(budget):.3f} s",
                    f"{side.warm(budget):.3f} s",
                    f"{r['bytes'] / 2**30:.2f}",
                    r["verdict"] or "-",
                ]
            )
    return found


def same_map(ours: Side, theirs: Side, budget: str) -> bool:
    """Whether both sides put every module on the same device."""
    return bool(ours.result(budget)["map"] == theirs.result(budget)["map"])
