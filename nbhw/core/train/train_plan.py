"""``nbhw.train_plan()``: can I fine-tune this model here (or on N devices), at what batch, and what do I type?

The figures are the training step itself run on the meta device (:mod:`nbhw.core.train.step`), per rank under each
strategy (:mod:`nbhw.core.train.strategies`); the code is the cell or the launch files (:mod:`nbhw.core.train.launch`).
Around them: the device's budget (this machine's accelerator, or ``device_memory``), the framework reserve the run
planner states (:func:`nbhw.core.plan.outside_tensors.framework_reserve`), and the precision advice
(:mod:`nbhw.core.advice`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbhw.core import argument, render
from nbhw.core.advice import precision
from nbhw.core.cache import Recent
from nbhw.core.errors import UserError
from nbhw.core.hardware import backends
from nbhw.core.hardware.data import DeviceInfo
from nbhw.core.hardware.targets import target_of
from nbhw.core.hf import meta_build, model_config
from nbhw.core.hf.tiny_model import tiny_model_path
from nbhw.core.plan import headroom, outside_tensors
from nbhw.core.render import Shown, size
from nbhw.core.train import launch, strategies
from nbhw.core.train.arguments import TRAIN_ARGUMENTS, TrainArgs, train_args
from nbhw.core.train.step import StepMemory
from nbhw.core.train.strategies import RankEstimate

# The recommendation: the first of these that fits. Plain data parallelism first (no sharding traffic), then the
# shardings torch and DeepSpeed run without host memory, then tensor parallelism, then offload (slowest).
PREFERENCE: tuple[tuple[str, bool], ...] = (
    ("ddp", False),
    ("fsdp2", False),
    ("zero2", False),
    ("zero3", False),
    ("tp", False),
    ("fsdp2", True),
    ("zero3", True),
    ("zero2", True),
)
MOST_BATCH = 4096  # the batch search's ceiling
FP16_MASTER_WEIGHTS = (
    "full fine-tuning keeps float32 weights under fp16 autocast: torch's GradScaler refuses float16 gradients "
    "('Attempting to unscale FP16 gradients'); the dry run computes in float32 (meta has no autocast), so the "
    "activations are counted at float32, an upper bound"
)
WRITTEN_PLANS = 32  # training cells remembered, so the cell that ran one is matched to its plan
_WRITTEN: Recent[TrainPlan] = Recent(WRITTEN_PLANS)


def written_plans() -> list[TrainPlan]:
    """The training plans whose notebook cell nbhw wrote in this process, newest first."""
    return list(reversed(_WRITTEN.values()))


@dataclass
class Device:
    """What one device of the plan is and holds: its type, its memory (None: unknown), and where that came from."""

    device_type: str
    total: int | None
    source: str
    info: DeviceInfo | None = None
    backend: str | None = None  # transformers' device type when it is not device_type ('rocm' for AMD)


def _this_machine() -> Device:
    """The first usable accelerator here, else the CPU."""
    for row in backends.probe_all():
        if row.usable and row.key in ("cuda", "rocm") and row.devices:
            info = row.devices[0]
            return Device("cuda", info.total_memory, f"this machine's {info.name or row.key} ({info.device})", info)
    return Device("cpu", None, "this machine's CPU")


def device_of(args: TrainArgs) -> Device:
    """The devices trained on: a catalog target's, this machine's accelerator (else its CPU), device_memory."""
    target = target_of(args.target)
    if target is not None:
        info = target.devices()[0]
        return Device("cuda", info.total_memory, f"the {target.label}'s memory (nbhw's catalog)", info,
                      target.device_type)  # fmt: skip
    here = _this_machine()
    kind = here.device_type if args.device_type == "auto" else args.device_type
    found = here if kind == here.device_type else Device(kind, None, f"{kind} (not this machine's)")
    if args.device_memory is not None:
        found = dataclasses.replace(found, total=args.device_memory_bytes, source=f"device_memory={args.device_memory}")
    return found


def _dtype(args: TrainArgs, device: Device) -> tuple[str, str]:
    """The dtype trained in, and why: the advisor's choice for the device unless given."""
    if args.dtype != "auto":
        return args.dtype, "as asked"
    kind = device.backend or device.device_type
    advice = precision.advise(kind, kind, device.info)
    if device.device_type == "cpu":
        if args.method == "qlora":
            return "bfloat16", "QLoRA computes in a half dtype; bfloat16 runs on CPUs"
        return "float32", "float32 on a CPU: " + advice.training_reason
    return advice.dtype, advice.training_reason


@dataclass
class TrainPlan(Shown):
    """One training plan: the per-device estimate, the strategies compared, the verdict, and the code."""

    model: str
    asked: TrainArgs  # as given
    args: TrainArgs  # resolved: dtype, device type and strategy decided
    config_source: str
    device: Device
    dtype_reason: str
    reserve: outside_tensors.Reserve
    compared: Compared  # every strategy's row, each estimated when first asked
    recommended: RankEstimate
    why: str
    _config: Any = field(repr=False, default=None)
    notes: list[str] = field(default_factory=list)

    @property
    def rows(self) -> list[RankEstimate]:
        """Every strategy's per-rank estimate, in the comparison's order (those the recommendation didn't need are
        dry-run now)."""
        return self.compared.rows()

    @property
    def estimate(self) -> StepMemory | None:
        """The step one rank runs under the recommended strategy (None when it could not run)."""
        return self.recommended.memory

    @property
    def peak_bytes(self) -> int:
        """What one device holds at its worst: the step's peak plus the framework reserve."""
        return self.recommended.device_bytes + self.reserve.bytes

    @property
    def fits(self) -> bool | None:
        """Whether the peak fits the device's memory (None: the memory is unknown)."""
        if self.device.total is None or not self.recommended.ok:
            return None
        return self.peak_bytes <= self.device.total

    @property
    def headroom_bytes(self) -> int | None:
        """What a device has left at the step's peak and the reserve (negative: over; None: memory unknown)."""
        return None if self.device.total is None else self.device.total - self.peak_bytes

    @property
    def margin(self) -> headroom.Margin | None:
        """What the device's allocator needs left free beyond the peak: one more segment of the step's largest
        block (a gradient or optimizer state of the largest trained weight, or an activation)."""
        memory = self.recommended.memory
        if memory is None:
            return None
        return headroom.allocator_margin(self.device.backend or self.device.device_type, memory.largest_block)

    @property
    def tight(self) -> bool:
        """It fits by the tensors, with less room left than the allocator needs."""
        margin = self.margin
        return bool(self.fits) and headroom.is_tight(self.headroom_bytes, margin.bytes if margin else None)

    @property
    def verdict(self) -> str:
        r = self.recommended
        if not r.ok:
            return "does not run: " + "; ".join(r.problems)
        if self.fits is None:
            return f"needs {size(self.peak_bytes)} per device; the device's memory is unknown (pass device_memory)"
        room = f"{size(self.peak_bytes)} of {size(self.device.total)} per device"
        if self.tight and self.margin is not None:
            left = size(self.headroom_bytes)
            return f"tight: {room} ({left} left, the allocator needs {size(self.margin.bytes)})"
        return f"fits: {room}" if self.fits else f"does not fit: {room}"

    @functools.cached_property
    def max_batch(self) -> int | None:
        """The largest per-device batch whose measured peak (+ reserve) fits, under the recommended strategy (None:
        the memory is unknown). Each candidate is a dry run."""
        if self.device.total is None or not self.recommended.ok:
            return None
        margin = self.margin
        budget = self.device.total - self.reserve.bytes - (margin.bytes if margin else 0)
        return search_batch(lambda b: self._rank(b).device_bytes, budget, limit=MOST_BATCH)

    def _rank(self, batch: int) -> RankEstimate:
        r = self.recommended
        args = dataclasses.replace(self.args, batch=batch)
        found = strategies.strategy_estimate(self._config, args, r.strategy, r.world_size, offload=r.offload)
        if not found.ok:
            raise UserError(f"batch {batch}: {'; '.join(found.problems)}")
        return found

    @functools.cached_property
    def launch(self) -> launch.LaunchFiles:
        """The script, the accelerate / DeepSpeed config files and the command that run this plan."""
        return launch.launch_files(self.model, self._launch_args())

    def _launch_args(self) -> TrainArgs:
        return dataclasses.replace(self.args, strategy=self.recommended.strategy, offload=self.recommended.offload)

    @property
    def code(self) -> str:
        """The notebook cell for one device, or the training script for several."""
        if self.args.world_size == 1:
            code = launch.training_cell(self.model, self._launch_args())
            _WRITTEN.put(code, self)  # after the cell runs, nbhw.loaded() finds the plan that wrote it
            return code
        return self.launch.script

    def to_dict(self) -> dict[str, Any]:
        return plan_to_dict(self)

    def text(self) -> str:
        return plan_text(self)

    def html(self) -> str:
        return f"<pre>{render.esc(plan_text(self))}</pre>"


def search_batch(peak: Callable[[int], int], budget: int, *, limit: int) -> int:
    """The largest batch whose ``peak(batch)`` fits ``budget`` (0 when 1 does not): a guess from batches 1 and 2
    (memory grows with the batch), then stepped with real dry runs until the answer is measured on both sides."""
    one = peak(1)
    if one > budget:
        return 0
    per_row = max(peak(2) - one, 1)
    guess = max(1, min(limit, 1 + (budget - one) // per_row))
    while guess > 1 and peak(guess) > budget:
        guess -= 1
    while guess < limit and peak(guess + 1) <= budget:
        guess += 1
    return guess


class Compared:
    """The strategies a plan compares, each row estimated the first time it is asked for: the recommendation asks
    in :data:`PREFERENCE` order and stops at the first that fits, so a search's plans dry-run no strategy after it
    (the rest are run when the plan's table is shown)."""

    def __init__(self, config: Any, args: TrainArgs) -> None:
        self.config, self.args = config, args
        if args.world_size == 1:
            self.choices: tuple[tuple[str, bool], ...] = (("single", False),)
        elif args.strategy != "auto":
            self.choices = ((args.strategy, args.offload),)
        else:
            self.choices = tuple(c for c in strategies.CHOICES if c[0] != "single")
        self._found: dict[tuple[str, bool], RankEstimate] = {}

    def row(self, choice: tuple[str, bool]) -> RankEstimate:
        if choice not in self._found:
            with meta_build.quiet():
                self._found[choice] = self._estimate(*choice)
        return self._found[choice]

    def _estimate(self, strategy: str, offload: bool) -> RankEstimate:
        args, asked = self.args, len(self.choices) == 1
        world = 1 if strategy == "single" else args.devices if strategy == "tp" else args.world_size
        found = strategies.strategy_estimate(self.config, args, strategy, world, offload=offload, mistakes=asked)
        if strategy == "tp" and args.nodes > 1 and not asked:
            found.problems.append("tensor parallelism runs within one node; use fsdp2 or zero3 across nodes")
        return found

    def rows(self) -> list[RankEstimate]:
        return [self.row(c) for c in self.choices]

    def recommend(self, budget: int | None) -> tuple[RankEstimate, str]:
        """The first runnable strategy in :data:`PREFERENCE` that fits ``budget``, and why; with none that fits
        (or the budget unknown), the one that needs the least."""
        if len(self.choices) == 1:
            only = self.row(self.choices[0])
            return only, "as asked" if only.strategy != "single" else "one device"
        runnable: list[RankEstimate] = []
        for choice in (c for c in PREFERENCE if c in self.choices):
            found = self.row(choice)
            if not found.ok:
                continue
            if budget is not None and found.device_bytes <= budget:
                why = "the first that fits, in the order DDP, FSDP2, ZeRO-2, ZeRO-3, TP, then offload"
                if runnable:
                    why += "; " + ", ".join(f"{r.label} needs {size(r.device_bytes)}" for r in runnable)
                return found, why
            runnable.append(found)
        if not runnable:
            return self.rows()[0], "no strategy runs"
        if budget is None:
            least = min((r for r in runnable if not r.offload), key=lambda r: r.device_bytes, default=runnable[0])
            return least, "the device's memory is unknown: the least per rank without offload"
        least = min(runnable, key=lambda r: r.device_bytes)
        return least, f"none fits {size(max(budget, 0))} (the device less the reserve); this one needs the least"


def _config(name: str, offline: bool) -> tuple[Any, str]:
    found = model_config.load(name, offline=offline)
    if found.config is None:
        raise UserError(f"no config for {name!r}: {found.problem}")
    return found.config, str(found.source)


def _reserve(device: Device) -> outside_tensors.Reserve:
    if device.device_type == "cpu":
        return outside_tensors.framework_reserve("cpu")
    cc = device.info.compute_capability if device.info else None
    capability = tuple(int(x) for x in cc.split(".")[:2]) if cc and cc.replace(".", "").isdigit() else None
    return outside_tensors.framework_reserve("cuda", capability=capability, total_memory=device.total)  # type: ignore[arg-type]


def build_plan(name: str, asked: TrainArgs, *, offline: bool = False) -> TrainPlan:
    """The plan for ``asked`` (checked arguments) on the model ``name``."""
    config, source = _config(name, offline)
    device = device_of(asked)
    dtype, dtype_reason = _dtype(asked, device)
    mixed = None
    if asked.method == "full" and dtype == "float16" and device.device_type != "cpu":
        dtype, mixed, dtype_reason = "float32", "fp16", f"{dtype_reason}; {FP16_MASTER_WEIGHTS}"
    strategy = "single" if asked.world_size == 1 and asked.strategy == "auto" else asked.strategy
    args = dataclasses.replace(asked, dtype=dtype, device_type=device.device_type, strategy=strategy,
                               mixed_precision=mixed)  # fmt: skip
    reserve = _reserve(device)
    compared = Compared(config, args)
    budget = None if device.total is None else device.total - reserve.bytes
    chosen, why = compared.recommend(budget)
    args = dataclasses.replace(args, strategy=chosen.strategy, offload=chosen.offload)
    target = target_of(asked.target)
    notes = [target.not_here] if target is not None else []
    return TrainPlan(name, asked, args, source, device, dtype_reason, reserve, compared, chosen, why, config, notes)


def from_words(args: Any) -> TrainPlan:
    """A plan from the parsed words of ``%hw train`` / ``python -m nbhw train``."""
    return train_plan(args.model, offline=args.offline, **argument.given(args, TRAIN_ARGUMENTS))


def train_plan(model: str | Path | None = None, *, offline: bool = False, **arguments: Any) -> TrainPlan:
    """Plan fine-tuning ``model``: full, LoRA or QLoRA, on this machine's accelerator (or ``device_memory``), on
    ``devices`` x ``nodes`` with a ``strategy`` (auto: the first that fits).

    The keywords are :class:`~nbhw.core.train.arguments.TrainArgs`' (``method``, ``batch``, ``context``,
    ``gradient_checkpointing``, ``optimizer``, ``lora_r``, ``lora_target_modules``, ``devices``, ``strategy``, ...).
    Mistakes raise a one-line :class:`~nbhw.core.errors.UserError`. Same words on the command line:
    ``python -m nbhw train MODEL --method qlora --batch 4 --context 2048 --gradient-checkpointing``.

    >>> p = nbhw.train_plan("Qwen/Qwen3-0.6B", method="lora", batch=4, context=2048)   # doctest: +SKIP
    >>> p.verdict; p.max_batch; print(p.code); p.launch.command                          # doctest: +SKIP
    """
    return build_plan(model_name(model), train_args(**arguments), offline=offline)


def model_name(model: str | Path | None) -> str:
    """The model as plans name it (nbhw's tiny local model when None); a path that is no model is a UserError."""
    name = str(tiny_model_path() if model is None else model)
    model_config.kind(name)
    return name


train_plan.__signature__ = argument.signature(  # type: ignore[attr-defined]
    train_plan, TRAIN_ARGUMENTS, keep=("model", "offline")
)


# ---------------------------------------------------------------- text and data


def _room(plan: TrainPlan) -> list[tuple[str, str]]:
    """The headroom a device keeps at the peak, and what its allocator needs (with why)."""
    room, margin = plan.headroom_bytes, plan.margin
    out = [] if room is None else [("headroom", size(room) if room >= 0 else f"-{size(-room)}")]
    if margin is not None and margin.bytes:
        out.append(("allocator margin", f"{size(margin.bytes)}: {margin.why}"))
    return out


def _parts(m: StepMemory) -> list[tuple[str, str]]:
    return [
        ("weights", size(m.weights)),
        ("trainable parameters", f"{m.trainable_parameters:,} of {m.parameters:,} ({size(m.trainable_bytes)})"),
        ("gradients", size(m.gradients)),
        ("optimizer state", size(m.optimizer_states)),
        ("activations", size(m.activations)),
        ("step peak", f"{size(m.peak)} (in the {m.peak_phase})"),
    ]


def _first_step(r: RankEstimate) -> list[tuple[str, str]]:
    """Step 1 as Trainer.train() runs it, where it was measured apart (FSDP2 prepares the whole model first)."""
    if not (r.first_step_bytes or r.first_step_host_bytes) or r.memory is None:
        return []
    steady = r.memory.peak if not r.offload else r.device_bytes
    higher = "higher than" if r.first_step_bytes > steady else "within"
    said = f"{size(r.first_step_bytes)} on the device ({higher} the steady state)"
    if r.first_step_host_bytes:
        said += (
            f"; {size(r.first_step_host_bytes)} on the host per process: each loads the whole model and accelerate "
            "shards it from there"
        )
    return [("first step", said)]


def _strategy_rows(plan: TrainPlan) -> list[list[str]]:
    rows = []
    for r in plan.rows:
        mark = "→" if r is plan.recommended else ""
        if r.ok:
            how = r.source.split(":")[0].split(", ")[0]  # the whole source is in to_dict()
            rows.append([mark, r.label, size(r.device_bytes), size(r.host_bytes) if r.host_bytes else "", how])
        else:
            rows.append([mark, r.label, "-", "", r.problems[0]])  # every problem: in to_dict()
    return rows


def plan_text(plan: TrainPlan) -> str:
    a = plan.args
    lines = [
        f"nbhw train plan: {plan.model} ({plan.config_source})",
        f"  {a.method}, batch {a.batch} x {a.context:,} tokens, {a.dtype} ({plan.dtype_reason}), "
        f"gradient checkpointing {'on' if a.gradient_checkpointing else 'off'}, optim {a.optimizer}",
        f"  devices: {a.nodes} x {a.devices} {plan.device.device_type}, memory {size(plan.device.total)} "
        f"({plan.device.source}); reserve {size(plan.reserve.bytes)} ({plan.reserve.what})",
        "",
    ]
    m = plan.estimate
    if m is not None:
        width = max(len(k) for k, _ in _parts(m))
        lines += [f"Per device ({plan.recommended.label}, one rank)"]
        lines += [f"  {k.ljust(width)}  {v}" for k, v in _parts(m)]
        lines += [f"  {k.ljust(width)}  {v}" for k, v in _first_step(plan.recommended)]
        lines += [f"  {'rank peak'.ljust(width)}  {size(plan.recommended.device_bytes)} + reserve"]
        lines += [f"  {k.ljust(width)}  {v}" for k, v in _room(plan)] + [""]
    lines += [f"Verdict: {plan.verdict}"]
    if len(plan.compared.choices) > 1:
        lines += ["", "Strategies (per rank)"]
        headers = ["", "strategy", "device", "host", "from"]
        lines += [render.text_table(headers, _strategy_rows(plan), indent="  ")]
        lines += [f"  recommended: {plan.recommended.label} ({plan.why})"]
    lines += ["", f"Launch: {plan.launch.command}"]
    lines += [f"  {n}" for n in plan.launch.notes]
    notes = [*(m.notes if m else []), *plan.notes]
    if notes:
        lines += ["", "Notes", *(f"  - {n}" for n in notes)]
    return "\n".join(lines) + "\n"


def plan_to_dict(plan: TrainPlan) -> dict[str, Any]:
    files = plan.launch
    return {
        "model": plan.model,
        "config_source": plan.config_source,
        "asked": argument.to_dict(plan.asked),
        "args": argument.to_dict(plan.args),
        "device": {"device_type": plan.device.device_type, "memory": plan.device.total, "source": plan.device.source},
        "dtype_reason": plan.dtype_reason,
        "reserve": dataclasses.asdict(plan.reserve),
        "estimate": None if plan.estimate is None else plan.estimate.to_dict(),
        "peak_bytes": plan.peak_bytes,
        "fits": plan.fits,
        "tight": plan.tight,
        "headroom_bytes": plan.headroom_bytes,
        "margin_bytes": plan.margin.bytes if plan.margin is not None else None,
        "verdict": plan.verdict,
        "max_batch": plan.max_batch,
        "strategies": [r.to_dict() for r in plan.rows],
        "recommended": {"strategy": plan.recommended.strategy, "offload": plan.recommended.offload, "why": plan.why},
        "launch": {"command": files.command, "commands": files.commands, "notes": files.notes},
        "code": plan.code,
    }
