"""Ground truth for the training planner's tests: a real training step on CPU, measured two independent ways.

- torch's MemTracker on the real tensors (the planner's own tracker class, so this checks the *meta step*: the
  builds, the SDPA routing, the unpacked-rows answer, the optimizer Trainer makes, not the tracker);
- torch.profiler ``profile_memory=True``: the CPU allocator's own events (its public memory timeline export).

The second step is measured (the steady state: the optimizer state already exists), as the plan's peak is.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import torch

from nbhw.core.train import meta_patches, training_build
from nbhw.core.train.arguments import TrainArgs


@dataclass
class RealPeak:
    tracker: int  # MemTracker on the real tensors
    profiler: int  # torch.profiler's memory timeline


def save_tiny(config: Any, path: str, seed: int = 0) -> str:
    """A real checkpoint with random weights (the step needs no tokenizer)."""
    import transformers

    torch.manual_seed(seed)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def profiler_peak(step: Any) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "timeline.json")
        prof.export_memory_timeline(path, device="cpu")
        with open(path) as f:
            _times, sizes = json.load(f)
    return max(sum(row) for row in sizes)


def tracker_peak(step: Any, model: Any, optimizer: Any, extra: list[Any]) -> int:
    tracker = meta_patches.tracker_class()()
    tracker.track_external(model, optimizer, *extra)
    with tracker:
        step()
    return int(tracker.get_tracker_snapshot("peak").get(torch.device("cpu"), {}).get("Total", 0))


def real_peak(path: str, args: TrainArgs, vocab_size: int, *, profiler: bool = True) -> RealPeak:
    """Load the checkpoint as the emitted cell does, take one step, then measure the second one."""
    torch.manual_seed(0)
    model = training_build.load_for_training(path, args)
    optimizer = training_build.create_optimizer(model, args)
    batch = training_build.training_batch(args, vocab_size, device="cpu")
    max_norm = training_build.training_defaults().max_grad_norm

    def step() -> None:
        training_build.train_step(
            model, optimizer, batch, accumulation=args.gradient_accumulation_steps, max_grad_norm=max_norm
        )

    step()  # step 1 creates the optimizer state
    extra = [*training_build.quant_state_tensors(model), batch["input_ids"]]
    tracked = tracker_peak(step, model, optimizer, extra)
    return RealPeak(tracked, profiler_peak(step) if profiler else 0)
