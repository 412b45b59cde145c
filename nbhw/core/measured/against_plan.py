"""A loaded model beside the plan that wrote its cell: every difference named, and the measured peaks against the
plan's figures in bytes and percent.

Differences are facts that can be equal or not: the attention transformers set (the plan's meta build went
through the same ``__init__``, so a silent fallback it foresaw is no difference), the dtype, the modules kept in
float32, the device of every device_map entry, the weights' bytes per device, the quantization and use_kernels.
Peaks are measurements against estimates and are always shown: the loading cell's peak against the plan's load
peak, and each generate cell's against the plan's run peak at the size that cell really ran (sequences x tokens,
read from what generate() returned; a dry run at that size), and against the pinned run's peaks. The cell that ran a
training plan's notebook cell: its peak against that plan's step peak.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from nbhw.core import render
from nbhw.core.cache import Recent
from nbhw.core.measured.loaded import LoadedModel
from nbhw.core.measured.origins import Origin, Run
from nbhw.core.memory.cell_records import CellMemory, CellRecord
from nbhw.core.plan.load_plan import LoadPlan
from nbhw.core.plan.pinned import Pin, device_key, installed_versions, planned_bytes, signed
from nbhw.core.train.train_plan import TrainPlan

DEFAULT_ATTENTION = "sdpa"
# Plans at the sizes cells really ran (their dry runs are what is slow), by (the plan's id, batch, context).
_SIZED: Recent[LoadPlan] = Recent(16)
SHOWN_NAMES = 4


@dataclass(frozen=True)
class Difference:
    """One thing the loaded model has otherwise than planned."""

    what: str
    planned: str
    measured: str

    @property
    def words(self) -> str:
        return f"{self.what}: planned {self.planned}, loaded {self.measured}"


@dataclass(frozen=True)
class PeakCheck:
    """A cell's measured peak on one device against what the plan (or the pinned run) gives for it."""

    cell: int | None
    what: str  # "loading", "generate at 1 x 26 tokens", "loading and generate at 1 x 26 tokens"
    device: str
    measured: int
    measured_by: str
    planned: int
    planned_as: str

    @property
    def delta(self) -> int:
        return self.measured - self.planned

    @property
    def percent(self) -> float | None:
        return None if self.planned == 0 else 100.0 * self.delta / self.planned

    @property
    def words(self) -> str:
        cell = f"[{self.cell}]" if self.cell is not None else "[ ]"
        pct = "" if self.percent is None else f", {self.percent:+.1f} %"
        return (
            f"cell {cell} {self.what} on {self.device}: measured {render.size(self.measured)} ({self.measured_by}), "
            f"{self.planned_as} {render.size(self.planned)}: {signed(self.delta)}{pct}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**vars(self), "delta": self.delta, "percent": self.percent}


@dataclass(frozen=True)
class Comparison:
    """The plan beside the loaded model."""

    plan: LoadPlan
    differences: tuple[Difference, ...]
    peaks: tuple[PeakCheck, ...]
    pinned: tuple[str, ...]  # the loaded model against the pinned run, one line each

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": {"model": self.plan.model, "code": self.plan.code},
            "differences": [vars(d) for d in self.differences],
            "peaks": [p.to_dict() for p in self.peaks],
            "pinned": list(self.pinned),
        }


# ---------------------------------------------------------------- differences


def planned_attention(plan: LoadPlan) -> dict[str, str | None]:
    """What transformers set on the plan's meta build (its own __init__ resolved the default), per config."""
    build = plan.built.build
    if build is None or not build.ok or build.model is None:
        return {"": plan.args.attn_implementation or DEFAULT_ATTENTION}
    config = build.model.config
    found = {"": config._attn_implementation}
    for key in getattr(config, "sub_configs", None) or {}:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "_attn_implementation"):
            found[str(key)] = sub._attn_implementation
    return found


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN_NAMES])
    return shown + (f" and {len(names) - SHOWN_NAMES} more" if len(names) > SHOWN_NAMES else "")


def exceptions(model: Any) -> set[str]:
    """The floating-point parameters whose dtype is not the model's: the modules a dtype plan kept in float32
    (a quantizer's packed integers are not among them)."""
    dtype = model.dtype
    return {name for name, p in model.named_parameters() if p.dtype.is_floating_point and p.dtype != dtype}


def _kept(plan: LoadPlan, loaded_exceptions: set[str]) -> list[Difference]:
    model = plan.meta_model
    if model is None:
        return []
    planned = exceptions(model)
    if planned == loaded_exceptions:
        return []
    extra, missing = sorted(loaded_exceptions - planned), sorted(planned - loaded_exceptions)
    words = "; ".join(
        part for part in (f"also {_names(extra)}" if extra else "", f"not {_names(missing)}" if missing else "") if part
    )
    return [Difference("parameters kept float32", f"{len(planned)}", f"{len(loaded_exceptions)} ({words})")]


def _device_map(plan: LoadPlan, loaded: LoadedModel) -> list[Difference]:
    placement = plan.weight_placement
    if placement is None:
        return []
    accelerator = plan.placed.live.accelerator
    planned = {k: device_key(v, accelerator) for k, v in placement.device_map.items()}
    measured = dict(loaded.device_map or {})
    if not measured:
        real = [d.device for d in loaded.devices]
        measured = {"": real[0]} if len(real) == 1 else {}
    if set(planned.values()) == set(measured.values()) and len(set(planned.values())) == 1:
        return []  # one device either way, whatever the map's granularity
    if planned == measured:
        return []
    moved = sorted(k for k in set(planned) | set(measured) if planned.get(k) != measured.get(k))
    words = [f"{k or '(whole model)'} {planned.get(k, '-')} -> {measured.get(k, '-')}" for k in moved]
    return [Difference("device_map", f"{len(planned)} entries", f"{len(moved)} placed otherwise: {_names(words)}")]


def _bytes(plan: LoadPlan, loaded: LoadedModel) -> list[Difference]:
    planned = planned_bytes(plan)
    for device, saved in loaded.repacked.items():  # the plan is the weights as loaded; bitsandbytes shrank them since
        planned[device] = planned.get(device, 0) - saved
    measured: dict[str, int] = {}
    for d in loaded.devices:
        measured[d.device] = measured.get(d.device, 0) + d.bytes
    out = []
    for device in sorted(set(planned) | set(measured)):
        was, now = planned.get(device, 0), measured.get(device, 0)
        if was != now:
            out.append(
                Difference(f"bytes on {device}", f"{render.size(was)} ({was:,} B)", f"{render.size(now)} ({now:,} B)")
            )
    return out


def _quantization(plan: LoadPlan, loaded: LoadedModel) -> list[Difference]:
    asked = plan.args.quantization
    method = loaded.quantization.method if loaded.quantization else None
    if (asked is None) == (method is None) and (asked is None or str(method).startswith("bitsandbytes")):
        return []
    return [Difference("quantization", f"bitsandbytes {asked}" if asked else "none", method or "none")]


def differences(plan: LoadPlan, loaded: LoadedModel, loaded_exceptions: set[str]) -> list[Difference]:
    """Every way the loaded model differs from its plan, and nothing else."""
    out: list[Difference] = []
    planned = planned_attention(plan)
    measured = {a.config: a.implementation for a in loaded.attention}
    for key in sorted(set(planned) | set(measured)):
        if planned.get(key) != measured.get(key):
            where = "attention" if key == "" else f"attention of {key}"
            out.append(Difference(where, str(planned.get(key)), str(measured.get(key))))
    if plan.dtype != loaded.dtype:
        out.append(Difference("dtype", plan.dtype, loaded.dtype))
    out += _kept(plan, loaded_exceptions)
    out += _device_map(plan, loaded)
    out += _bytes(plan, loaded)
    out += _quantization(plan, loaded)
    if plan.use_kernels != loaded.use_kernels:
        asked = "unknown" if plan.use_kernels is None else str(plan.use_kernels)
        out.append(Difference("use_kernels", asked, str(loaded.use_kernels)))
    return out


# ---------------------------------------------------------------- peaks


def _measured_by(memory: CellMemory, interval: float | None) -> str:
    if memory.peak_from == "allocator":
        return f"{memory.trace}, the allocator's peak"
    if memory.peak_from == "kernel":
        return f"{memory.trace}, the kernel's peak (VmHWM); it counts all the process allocated, not only tensors"
    every = f" every {interval:g} s" if interval else ""
    what = "; it counts all the process allocated, not only tensors" if memory.device == "host" else ""
    return f"{memory.trace} sampled{every}: a shorter peak can be missed{what}"


def plan_at(plan: LoadPlan, batch: int, tokens: int) -> LoadPlan:
    """The same plan at another size (a dry run at ``batch x tokens``, kept for the next time it is asked)."""
    if batch == plan.batch and tokens == plan.context:
        return plan
    context = max(tokens, 2)
    if plan.inputs.context_limit:
        context = min(context, plan.inputs.context_limit)
    made = LoadPlan(plan.model, replace(plan.args, batch=batch, context=context), offline=plan.offline)
    return _SIZED.get((id(plan), batch, context), lambda: made)


def _run_peak(plan: LoadPlan, device: str) -> int | None:
    placement = plan.placement
    if placement is None:
        return None
    accelerator = plan.placed.live.accelerator
    found = [s.peak_bytes for s in placement.devices if device_key(s.key, accelerator) == device]
    return found[0] if found and found[0] is not None else None


def _device_of(memory: CellMemory) -> str:
    return "cpu" if memory.device == "host" else memory.device


def _run_words(run: Run | None) -> str:
    if run is None or run.batch is None:
        return ""
    return f" at {run.batch} x {run.tokens:,} tokens"


def _loading_peaks(plan: LoadPlan, origin: Origin, interval: float | None) -> list[PeakCheck]:
    record = origin.record
    if record is None:
        return []
    out = []
    sized = plan_at(plan, origin.generated.batch, origin.generated.tokens or 2) if (
        origin.generated and origin.generated.batch) else None  # fmt: skip
    for memory in record.memory.values():
        device = _device_of(memory)
        load = plan.estimate.load_peak_bytes if plan.estimate is not None and device == "cpu" else None
        if load is None:
            load = planned_bytes(plan).get(device)
        if load is None:
            continue
        what, planned, planned_as = "loading", load, "the plan's load peak" if device == "cpu" else "its weights"
        if sized is not None:
            run = _run_peak(sized, device)
            if run is not None and run > planned:
                planned, planned_as = run, f"the plan's run peak{_run_words(origin.generated)}"
            what = f"loading and generate{_run_words(origin.generated)}"
        out.append(PeakCheck(record.execution_count, what, memory.device, memory.used,
                             _measured_by(memory, interval), planned, planned_as))  # fmt: skip
    return out


def _generate_peaks(plan: LoadPlan, loaded: LoadedModel, run: Run, interval: float | None) -> list[PeakCheck]:
    record: CellRecord | None = run.record
    if record is None:
        return []
    sized = plan_at(plan, run.batch, run.tokens or 2) if run.batch else plan
    size_words = _run_words(run) if run.batch else f" (size not seen: the plan's {plan.batch} x {plan.context:,})"
    out = []
    for memory in record.memory.values():
        device = _device_of(memory)
        planned = _run_peak(sized, device)
        if planned is None:
            continue
        # The model was there before the cell: its weights count in the run's peak, not in the cell's rise.
        measured = memory.used + loaded.bytes_on(device)
        out.append(PeakCheck(record.execution_count, f"generate{size_words}", memory.device, measured,
                             _measured_by(memory, interval) + ", plus the weights held before",
                             planned, "the plan's run peak"))  # fmt: skip
    return out


def training_peaks(plan: TrainPlan, origin: Origin, interval: float | None = None) -> list[PeakCheck]:
    """The cell that ran a training plan's notebook cell (loading and training): its measured peak on the device
    trained on against the plan's step peak of one rank (the plan's reserve left out: the process was running)."""
    record = origin.record
    if record is None:
        return []
    a = plan.args
    trained_on = "host" if plan.device.device_type == "cpu" else f"{plan.device.device_type}:0"
    what = f"loading and training ({a.method}) at {a.batch} x {a.context:,} tokens"
    planned, planned_as = plan.recommended.device_bytes, "the training plan's step peak (its reserve left out)"
    return [
        PeakCheck(record.execution_count, what, m.device, m.used, _measured_by(m, interval), planned, planned_as)
        for m in record.memory.values()
        if m.device == trained_on
    ]


def _against_pin(pin: Pin, loaded: LoadedModel, peaks: list[PeakCheck]) -> list[str]:
    lines = pin.version_notes(installed_versions())
    for device in sorted(set(pin.devices) | {d.device for d in loaded.devices}):
        was, now = pin.devices.get(device, 0), loaded.bytes_on(device)
        if was != now:
            lines.append(f"this run's weights take {signed(now - was)} than the pinned one's on {device}")
    pinned_attention = pin.attention
    for a in loaded.attention:
        if a.config in pinned_attention and pinned_attention[a.config] != a.implementation:
            lines.append(f"attention{' of ' + a.config if a.config else ''}: pinned {pinned_attention[a.config]}, "
                         f"this run {a.implementation}")  # fmt: skip
    for peak in peaks:
        match = [p for p in pin.peaks if p.device == peak.device and p.what == peak.what]
        if match:
            lines.append(f"cell [{peak.cell}] {peak.what}: this run used {signed(peak.measured - match[0].bytes)} than "
                         f"the pinned one on {peak.device}")  # fmt: skip
    return lines


def compare(plan: LoadPlan, loaded: LoadedModel, loaded_exceptions: set[str], origin: Origin,
            interval: float | None = None) -> Comparison:  # fmt: skip
    """The plan beside the loaded model: differences, peaks, and the pinned run when the plan has one."""
    peaks = _loading_peaks(plan, origin, interval)
    for run in origin.runs:
        peaks += _generate_peaks(plan, loaded, run, interval)
    pinned = tuple(_against_pin(plan.pinned, loaded, peaks)) if plan.pinned is not None else ()
    return Comparison(plan, tuple(differences(plan, loaded, loaded_exceptions)), tuple(peaks), pinned)
