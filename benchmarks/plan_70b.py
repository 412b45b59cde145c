"""Benchmark: plan a Llama-3-70B-sized model (meta build + estimate + placement), first and warm, against doing the
same with accelerate's own estimate helpers, in one run. Not a test; prints figures.

    PYTHONPATH=$PWD python benchmarks/plan_70b.py [--repeat 5]

Each side runs in a fresh interpreter, so "first" includes the one-off cost of transformers' Llama modules but not
the imports of torch, transformers.modeling_utils and accelerate (reported apart: every load pays them).
Targets (issue 10): first <= 1.2 s, warm <= 0.3 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap

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
    from nbhw.core import plan as plan_module
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


def measure(script: str, folder: str, repeat: int) -> dict[str, object]:
    argv = [sys.executable, "-c", textwrap.dedent(script), folder, str(repeat), json.dumps(BUDGET)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=True)
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5, help="warm runs per side (median reported)")
    repeat = parser.parse_args().repeat
    with tempfile.TemporaryDirectory() as folder:
        with open(f"{folder}/config.json", "w") as f:
            json.dump(CONFIG, f)
        sides = {"nbhw.plan": measure(NBHW, folder, repeat), "accelerate helpers": measure(ACCELERATE, folder, repeat)}
    print("Llama-3-70B-sized config (80 layers, hidden 8192), bfloat16, device_map='auto'; seconds")
    print(f"{'':19} {'budget':10} {'imports':>7} {'first':>6} {'warm':>6} {'GiB':>7}  verdict")
    for name, data in sides.items():
        for label, t in data["times"].items():  # type: ignore[attr-defined]
            warm = statistics.median(t["warm"])
            row = f"{name:19} {label:10} {data['imports']:7.2f} {t['first']:6.3f} {warm:6.3f} {t['bytes'] / 2**30:7.2f}"
            print(f"{row}  {t['verdict']}")
    ours, theirs = sides["nbhw.plan"]["times"], sides["accelerate helpers"]["times"]  # type: ignore[index]
    for label in ("live", "max_memory"):
        o, a = ours[label], theirs[label]
        first, warm = o["first"] / a["first"], statistics.median(o["warm"]) / statistics.median(a["warm"])
        same = "same" if o["map"] == a["map"] else "different"
        print(f"nbhw / accelerate ({label}): first {first:.2f}x, warm {warm:.2f}x; {same} device_map")
    print("targets: first <= 1.2 s, warm <= 0.3 s (after imports)")


if __name__ == "__main__":
    main()
