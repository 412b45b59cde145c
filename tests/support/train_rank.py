"""Run a training script under torch's MemTracker and write this rank's peak (test helper).

    torchrun --nproc_per_node 2 tests/support/train_rank.py OUT_DIR train_nbhw.py

Everything the script allocates is tracked (the tracker is entered before the script runs); the peak of the
whole run is written to OUT_DIR/rank<RANK>.json with the peak of the training steps alone.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path


def main() -> None:
    import torch
    from transformers import TrainerCallback

    from nbhw.core.hf.tensor_parallel import local_nbytes
    from nbhw.core.train import meta_patches

    out, script = Path(sys.argv[1]), sys.argv[2]
    rank = int(os.environ.get("RANK", "0"))
    tracker = meta_patches.tracker_class()()
    steps: dict[str, int] = {}  # the running peak of the whole run when each step ends
    step_peaks: dict[str, int] = {}  # each step's own peak (what it holds at its worst, from its start)
    running = [0]
    wrapped: dict[str, object] = {}

    class StepPeaks(TrainerCallback):  # type: ignore[misc]
        """The tracker's running peak when each step ends (its peak only grows)."""

        def on_step_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            tracker.reset_mod_stats()  # MemTracker refuses a second forward of a module it has stats for
            running[0] = max(running[0], _running_peak(tracker))
            _restart_peak(tracker)  # this step's own peak from here (the running one is kept in `steps`)

        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            own = _running_peak(tracker)
            running[0] = max(running[0], own)
            steps[str(state.global_step)] = running[0]
            step_peaks[str(state.global_step)] = own
            model = kwargs.get("model")
            wrapped.update(
                model=type(model).__name__,
                fsdp=[c.__name__ for c in type(model).__mro__][:4],
                params=sum(local_nbytes(p) for p in model.parameters()),
                sharded=sum(hasattr(p, "to_local") for p in model.parameters()),  # parameters held as DTensors
                storage_excess=storage_excess(model),
            )

    import transformers

    original_init = transformers.Trainer.__init__

    def init_with_callback(self, *a, **k):  # type: ignore[no-untyped-def]
        k["callbacks"] = [*(k.get("callbacks") or []), StepPeaks()]
        original_init(self, *a, **k)

    transformers.Trainer.__init__ = init_with_callback
    if os.environ.get("NBHW_TEST_FSDP_ON_CPU") == "1":
        _fsdp_on_cpu()
    sys.argv = [script]
    with tracker:
        runpy.run_path(script, run_name="__main__")
    peak = tracker.get_tracker_snapshot("peak").get(torch.device("cpu"), {})
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "peak": max(running[0], int(peak.get("Total", 0))),
                "steps": steps,
                "step_peaks": step_peaks,
                "model": wrapped,
                "breakdown": {str(k): int(v) for k, v in peak.items()},
            }
        )
    )
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # Left to the interpreter's exit, a gloo group's threads were destroyed while joinable now and then
        # ("terminate called without an active exception": SIGABRT after the results were written, the TP case).
        torch.distributed.destroy_process_group()
    # Even then a gloo thread now and then aborts the interpreter's own teardown (CI, under load: SIGABRT after the
    # results were written and the group destroyed). The run is over and reported: leave without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _running_peak(tracker: object) -> int:
    import torch

    snap = tracker.get_tracker_snapshot("peak").get(torch.device("cpu"), {})  # type: ignore[attr-defined]
    return int(snap.get("Total", 0))


def _restart_peak(tracker: object) -> None:
    """Start the tracker's peak again from what is held now: MemTracker's peak only grows, and a step's own peak
    (from its start) is what the plan's figures are."""
    for dev, current in tracker._curr_mem_snap.items():  # type: ignore[attr-defined]
        tracker._peak_mem[dev] = current["Total"]  # type: ignore[attr-defined]
        tracker._peak_mem_snap[dev] = dict(current)  # type: ignore[attr-defined]


def storage_excess(model: object) -> int:
    """Bytes the parameters' storages hold beyond this rank's own shards. transformers 5.24's TP loading keeps each
    colwise shard as a narrow view of the whole loaded tensor when the target is the CPU (on a GPU the shard is
    copied to the device): that excess is the loading's, not the training step's."""
    storages: dict[int, int] = {}
    local = 0
    for p in model.parameters():  # type: ignore[attr-defined]
        t = p.to_local() if hasattr(p, "to_local") else p
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        local += t.nbytes
    return sum(storages.values()) - local


def _fsdp_on_cpu() -> None:
    """The fake at the boundary for the CPU test: accelerate turns FSDP on only for multi-accelerator types
    (MULTI_GPU, MULTI_XPU, ...), never MULTI_CPU, so Trainer(fsdp=True) on CPU silently trains plain DDP.
    After AcceleratorState decides, give it the FSDP plugin as it would on GPUs; torch's fully_shard itself runs on
    CPU with gloo."""
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

    def init(self, *a, **k):  # type: ignore[no-untyped-def]
        original(self, *a, **k)
        plugin = k.get("fsdp_plugin")
        if plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = plugin

    AcceleratorState.__init__ = init

    # Tensor parallelism: accelerate validates Trainer's ParallelismConfig against the same multi-accelerator list.
    from accelerate.parallelism_config import ParallelismConfig

    validate = ParallelismConfig._validate_accelerator

    def validate_on_cpu(self, accelerator):  # type: ignore[no-untyped-def]
        if accelerator.distributed_type == DistributedType.MULTI_CPU:
            return None
        return validate(self, accelerator)

    ParallelismConfig._validate_accelerator = validate_on_cpu


if __name__ == "__main__":
    main()
