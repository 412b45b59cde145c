"""Per-rank memory of each multi-device strategy, and the one to recommend.

Where torch can run the strategy's own sharding in one process, the estimate is the training step run under it
(:mod:`nbhw.core.train.step`: FSDP2 through accelerate's ``fsdp2_prepare_model``, tensor parallelism through
transformers' TP plan, both in torch's fake process group). DDP and DeepSpeed ZeRO are the single-device step plus
the strategy's sharding rule (DDP on meta asks a ``.item()``; DeepSpeed's engine needs a GPU), and ``source`` says
which. Each row is a dry run's answer: a step the libraries refuse becomes the row's problem, not a crash.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from nbhw.core.cache import Recent
from nbhw.core.errors import UserError
from nbhw.core.train import launch, step
from nbhw.core.train.arguments import TrainArgs
from nbhw.core.train.sharded import StepRefused, tp_problems
from nbhw.core.train.step import Setup, StepMemory, dry_run

# Every strategy with its offload choices, in the order the comparison lists them.
CHOICES: tuple[tuple[str, bool], ...] = (
    ("single", False),
    ("ddp", False),
    ("fsdp2", False),
    ("fsdp2", True),
    ("zero2", False),
    ("zero2", True),
    ("zero3", False),
    ("zero3", True),
    ("tp", False),
)
CACHED_STEPS = 32  # dry runs kept per process (a question asked again is answered at once)

STRATEGY_WORDS = {
    "single": "one device",
    "ddp": "DDP (a full replica per device)",
    "fsdp2": "FSDP2 full shard",
    "zero2": "DeepSpeed ZeRO-2",
    "zero3": "DeepSpeed ZeRO-3",
    "tp": "tensor parallelism (tp_plan='auto')",
}


@dataclass
class RankEstimate:
    """One strategy's memory per rank: on the device and, with offload, on the host."""

    strategy: str
    world_size: int
    offload: bool
    device_bytes: int
    host_bytes: int
    source: str  # "dry run ..." or "rule ..." (said, never silent)
    memory: StepMemory | None = None
    problems: list[str] = field(default_factory=list)
    # Step 1 as Trainer.train() runs it (0: not measured apart): the device's and the host's peak, where it differs
    # from the steady state (FSDP2 prepares the whole model first).
    first_step_bytes: int = 0
    first_step_host_bytes: int = 0
    seconds: float = 0.0  # how long this row's dry run took (0 when it came from the cache)

    @property
    def label(self) -> str:
        """The strategy as people say it: "ZeRO-3 + offload"."""
        return STRATEGY_WORDS[self.strategy] + (" + offload" if self.offload else "")

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["memory"] = None if self.memory is None else self.memory.to_dict()
        return out


def strategy_estimate(
    config: Any, args: TrainArgs, strategy: str, world_size: int, *, offload: bool = False, mistakes: bool = False
) -> RankEstimate:
    """As _strategy_estimate; a step the libraries refuse under this strategy becomes the row's problem.
    ``mistakes``: a user mistake (LoRA targets the model lacks) raises its UserError instead (one strategy asked)."""
    started = time.perf_counter()
    try:
        found = _strategy_estimate(config, args, strategy, world_size, offload=offload)
    except StepRefused as exc:
        problem = f"the training step fails under {STRATEGY_WORDS[strategy]}: {exc}"
        found = RankEstimate(strategy, world_size, offload, 0, 0, "dry run refused", problems=[problem])
    except UserError as exc:
        if mistakes:
            raise
        found = RankEstimate(strategy, world_size, offload, 0, 0, "not run", problems=[str(exc)])
    except Exception as exc:  # the dry run is the check: what transformers / peft / torch raise is the answer
        message = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        problem = f"the training step fails under {STRATEGY_WORDS[strategy]}: {message}"
        found = RankEstimate(strategy, world_size, offload, 0, 0, "dry run failed", problems=[problem])
    found.seconds = time.perf_counter() - started
    return found


def _strategy_estimate(
    config: Any, args: TrainArgs, strategy: str, world_size: int, *, offload: bool = False
) -> RankEstimate:
    """Per-rank memory of ``strategy`` over ``world_size`` devices: a dry run under the strategy's own sharding
    where torch can run it (single, FSDP2, TP), else the single-device dry run plus the strategy's sharding rule
    (DDP, ZeRO-2/3, FSDP2 offload), with the rule said in ``source``."""
    if strategy == "tp":
        problems = tp_problems(config, world_size)
        if problems:
            return RankEstimate(strategy, world_size, offload, 0, 0, "not run", problems=problems)
        memory = cached_dry_run(config, args, "tp", world_size)
        return RankEstimate(
            strategy,
            world_size,
            offload,
            memory.peak,
            0,
            f"dry run under transformers' TP plan, fake process group of {world_size}",
            memory,
        )
    if strategy == "fsdp2":
        return _fsdp2_estimate(config, args, world_size, offload)
    single = cached_dry_run(config, args)
    if strategy == "single":
        return RankEstimate(strategy, 1, False, single.peak, 0, "dry run on one device", single)
    if strategy == "ddp":
        # DDP's reducer keeps flat gradient buckets beside .grad (gradient_as_bucket_view=False, what accelerate
        # and Trainer use): one more copy of the trainable gradients for the whole run.
        return RankEstimate(
            strategy,
            world_size,
            offload,
            single.peak + single.trainable_bytes,
            0,
            "single-device dry run + DDP's gradient buckets (one copy of the trainable gradients)",
            single,
        )
    return _zero_rule(single, args, strategy, world_size, offload)


def _fsdp2_estimate(config: Any, args: TrainArgs, world_size: int, offload: bool) -> RankEstimate:
    """FSDP2 per rank: the dry run under accelerate's sharding, then where the run prepares the model (see
    :func:`_first_step` and :func:`_sharded_at_load`) and, with offload, the CPU-offload rule."""
    if args.method == "qlora":
        raise UserError("qlora with FSDP2 is not planned here (needs bnb_4bit_quant_storage in a float dtype); use ddp")
    memory = cached_dry_run(config, args, "fsdp2", world_size)
    if offload:
        return _offloaded(memory, world_size)
    if launch.shards_at_load(args.device_type):
        return _sharded_at_load(memory, world_size)
    device_first, host_first = _first_step(memory)
    return RankEstimate("fsdp2", world_size, False, max(memory.peak, device_first), 0, _fsdp2_source(world_size),
                        memory, first_step_bytes=device_first, first_step_host_bytes=host_first)  # fmt: skip


def _fsdp2_source(world_size: int) -> str:
    return f"dry run under accelerate's FSDP2 sharding, fake process group of {world_size}"


def _sharded_at_load(memory: StepMemory, world_size: int) -> RankEstimate:
    """transformers' FSDP2 at load (what the CPU launch runs) cuts each shard from the loaded tensor with a slice
    and ``.to(cpu)`` (sharding_utils), a view that keeps the whole tensor for the run; a tensor its conversions
    build (MoE experts) or a dtype change is copied. Seen in real 2-rank torchruns: every dense weight kept whole,
    no expert. So at most the whole model less this rank's shards: an upper bound, said in the source."""
    kept = max(memory.whole_model - memory.weights, 0)
    source = (
        f"{_fsdp2_source(world_size)}; sharded at load by transformers on the CPU: + at most the whole loaded "
        "tensors its shards view (kept by the CPU loading's slices)"
    )
    first = max(memory.forward_backward_peak, memory.optimizer_step_peak) + kept
    return RankEstimate("fsdp2", world_size, False, memory.peak + kept, 0, source, memory, first_step_bytes=first)


def _offloaded(memory: StepMemory, world_size: int) -> RankEstimate:
    """CPUOffloadPolicy keeps the sharded parameters, gradients and optimizer state on the host; the device holds
    the gathered units and the activations. Fake tensors here all live on one (CPU) device, so the split is by the
    tracker's categories at the peak: said as a rule."""
    held = memory.weights + memory.optimizer_states + memory.gradients
    return RankEstimate(
        "fsdp2",
        world_size,
        True,
        max(memory.peak - held, 0),
        held,
        "FSDP2 dry run, then the CPU-offload rule: sharded weights, gradients and optimizer state counted on the host",
        memory,
        first_step_host_bytes=max(held, memory.whole_model),
    )


def _first_step(memory: StepMemory) -> tuple[int, int]:
    """The first step's peak on the device and on the host, as Trainer.train() runs it under accelerate's FSDP2.

    Each process loads the whole model on the host (from_pretrained without a device_map; Trainer leaves an FSDP
    model where it is), then accelerate's ``fsdp2_prepare_model`` keeps it (``original_sd``) while ``fully_shard``
    moves each unit to the device and keeps its shard: the dry run's preparation peak is that whole model plus the
    shards. The device's part is the peak less the whole model; step 1 then runs without optimizer state."""
    device = max(memory.forward_backward_peak, memory.optimizer_step_peak, memory.preparation_peak - memory.whole_model)
    return device, memory.whole_model


def _zero_rule(single: StepMemory, args: TrainArgs, strategy: str, world_size: int, offload: bool) -> RankEstimate:
    """DeepSpeed ZeRO per rank from the single-device dry run's parts and ZeRO's partitioning (a rule: DeepSpeed
    needs its engine and a GPU to run a step). Only trainable parameters carry gradients and optimizer state, which
    is where DeepSpeed's own estimators (all parameters) overcount LoRA."""
    n = world_size
    trainable = single.trainable_parameters
    fp32_master = 0 if args.dtype == "float32" else 4 * trainable  # DeepSpeed keeps fp32 master weights for bf16/fp16
    states = single.optimizer_states
    grads = single.gradients
    activations = single.forward_backward_peak - single.weights - grads
    partitioned = (fp32_master + states) // n
    if strategy == "zero2":
        device = single.weights + grads // n + activations + (0 if offload else partitioned)
        host = partitioned if offload else 0
        rule = "ZeRO-2: full weights, gradients and fp32 master + optimizer state split over ranks"
    else:
        device = single.weights // n + grads // n + activations + (0 if offload else partitioned)
        host = (partitioned + single.weights // n) if offload else 0
        if offload:
            device -= single.weights // n
        rule = (
            "ZeRO-3: weights, gradients and fp32 master + optimizer state split over ranks (one layer "
            "gathered at a time, not counted)"
        )
    if offload:
        rule += "; offload moves the split optimizer state (and ZeRO-3 weights) to the host"
    source = "rule from the single-device dry run: " + rule
    return RankEstimate(strategy, n, offload, device, host, source, single)


_STEPS: Recent[StepMemory] = Recent(CACHED_STEPS)


def _step_key(args: TrainArgs) -> TrainArgs:
    """The arguments that change one rank's step (not the launch's topology, budget or strategy choice)."""
    topology = dataclasses.replace(args, strategy="auto", offload=False, devices=1, nodes=1)
    return dataclasses.replace(topology, device_memory=None, target=None)


def cached_dry_run(config: Any, args: TrainArgs, strategy: str = "single", world_size: int = 1) -> StepMemory:
    """The dry run of one rank's step, once per (config, arguments, sharding) in this process (the last few kept):
    DDP and ZeRO share the single-device step, FSDP2 with and without offload share one sharded run."""
    key = (config.to_json_string(use_diff=False), _step_key(args), strategy, world_size)
    setup = Setup(strategy, world_size) if strategy in ("tp", "fsdp2") else None
    return _STEPS.get(key, lambda: dry_run(config, args, setup=setup))


def clear_cache() -> None:
    """Forget every dry run (tests; a transformers upgrade in a running kernel)."""
    _STEPS.clear()
    step.forget_full_depths()
