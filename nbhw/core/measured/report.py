"""``nbhw.loaded()``'s report: every model alive in the namespace, what it holds, and its plan beside it; the
Memory tab's line for the cell that loaded it; and ``nbhw.pin()``'s record of what ran."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from nbhw.core import render
from nbhw.core.argument import to_dict
from nbhw.core.errors import UserError
from nbhw.core.measured.against_plan import Comparison, PeakCheck, compare, exceptions, training_peaks
from nbhw.core.measured.loaded import UNKNOWN, LoadedModel, inspect, is_model, models_in, rows
from nbhw.core.measured.origins import Origin, origin, origins
from nbhw.core.measured.origins import version as origins_version
from nbhw.core.plan.pinned import FORMAT, FORMAT_VERSION, Pin, installed_versions, write_pin


@dataclass(frozen=True)
class Entry:
    """One model: what it holds, where it came from, and its plan beside it."""

    loaded: LoadedModel
    origin: Origin | None
    comparison: Comparison | None
    training: tuple[PeakCheck, ...] = ()  # the training plan's cell: its peak against the plan's step peak

    @property
    def planned(self) -> bool:
        """Whether a plan of nbhw's wrote the cell that loaded the model (a load plan or a training plan)."""
        return self.comparison is not None or (self.origin is not None and self.origin.training is not None)

    def lines(self) -> list[str]:
        """The comparison as lines (nothing without a plan)."""
        c = self.comparison
        if c is None:
            return [p.words for p in self.training]
        out = [d.words for d in c.differences] or ["as planned: attention, dtype, float32 modules, device_map, "
                                                   "bytes per device, quantization and use_kernels"]  # fmt: skip
        return out + [p.words for p in c.peaks] + list(c.pinned)

    def to_dict(self) -> dict[str, Any]:
        o = self.origin
        return {
            **self.loaded.to_dict(),
            "loaded_by_cell": None if o is None else o.execution_count,
            "plan": None if self.comparison is None else self.comparison.to_dict(),
            "training_plan": None if o is None or o.training is None else {
                "model": o.training.model, "verdict": o.training.verdict, "code": o.training.code,
                "peaks": [p.to_dict() for p in self.training],
            },
        }  # fmt: skip


def entry(model: Any, variable: str, interval: float | None = None) -> Entry:
    """One model's entry."""
    found = origin(model)
    asked = found.asked_attention if found is not None else UNKNOWN
    loaded = inspect(model, variable, asked_attention=asked)
    comparison = None
    if found is not None and found.plan is not None:
        comparison = compare(found.plan, loaded, exceptions(model), found, interval)
    training = training_peaks(found.training, found, interval) if found and found.training else []
    return Entry(loaded, found, comparison, tuple(training))


class Loaded(render.Shown):
    """Every transformers model alive in the namespace; renders as a report."""

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, variable: str) -> Entry:
        for e in self.entries:
            if e.loaded.variable == variable:
                return e
        raise KeyError(variable)

    def to_dict(self) -> dict[str, Any]:
        return {"models": [e.to_dict() for e in self.entries]}

    def _origin_words(self, e: Entry) -> str:
        o = e.origin
        if o is None:
            return "a cell nbhw did not record (load nbhw before loading the model)"
        plan = "not a cell nbhw's plan wrote"
        if o.plan is not None or o.training is not None:
            plan = f"the cell nbhw's {'plan' if o.plan is not None else 'training plan'} wrote"
        return f"cell [{o.execution_count}]: {o.first_line} ({plan})"

    def text(self) -> str:
        if not self.entries:
            return "nbhw loaded: no transformers model in this session's variables\n"
        out = [f"nbhw loaded: {len(self.entries)} model{'s' if len(self.entries) > 1 else ''}", ""]
        for e in self.entries:
            facts = [*rows(e.loaded), ("loaded by", self._origin_words(e))]
            out += [e.loaded.variable, *render.field_lines(facts)]
            if e.planned:
                out += ["  plan beside it:", *(f"    - {line}" for line in e.lines())]
            out.append("")
        return "\n".join(out).rstrip() + "\n"

    def html(self) -> str:
        esc = render.esc
        if not self.entries:
            return "<div class='nbhw-loaded'>nbhw loaded: no transformers model in this session's variables</div>"
        parts = [f"<div class='nbhw-loaded'><p><b>nbhw loaded: {len(self.entries)} model(s)</b></p>"]
        for e in self.entries:
            facts = [[k, v] for k, v in rows(e.loaded)] + [["loaded by", self._origin_words(e)]]
            parts.append(f"<p><b>{esc(e.loaded.variable)}</b></p>" + render.html_table(("", ""), facts))
            if e.planned:
                items = "".join(f"<li>{esc(line)}</li>" for line in e.lines())
                parts.append(f"<p>plan beside it:</p><ul class='nbhw-loaded-plan'>{items}</ul>")
        return "".join(parts) + "</div>"


def loaded(namespace: Mapping[str, Any], interval: float | None = None) -> Loaded:
    """Every transformers model in ``namespace`` (``nbhw.loaded()`` passes the notebook's variables)."""
    return Loaded([entry(model, name, interval) for name, model in models_in(namespace).items()])


# ---------------------------------------------------------------- the Memory tab's line


def cell_lines() -> dict[int, list[str]]:
    """Per cell that loaded a model alive now: one line with the model and, with a plan, the peak against it."""
    found: dict[int, list[str]] = {}
    for model, o in origins():
        if o.execution_count is None:
            continue
        found.setdefault(o.execution_count, []).append(_cell_line(entry(model, o.variable), o))
    return found


def _cell_line(e: Entry, o: Origin) -> str:
    devices = ", ".join(d.device for d in e.loaded.devices)
    line = f"loaded {o.variable}: {e.loaded.model_class} {render.size(e.loaded.total_bytes)} ({devices}), "
    line += f"attention {e.loaded.main_attention}"
    if e.loaded.silent_fallback and o.asked_attention is None:
        line += " (silent fallback from sdpa)"
    if e.training:
        return line + "; trained: " + _peak_words(e.training[0])
    if e.comparison is None:
        return line + ("" if o.plan is not None or o.training is not None else "; not a cell nbhw's plan wrote")
    diffs = len(e.comparison.differences)
    line += "; as planned" if not diffs else f"; {diffs} difference{'s' if diffs > 1 else ''} from the plan"
    first = [p for p in e.comparison.peaks if p.cell == o.execution_count]
    if first:
        line += "; " + _peak_words(first[0])
    return line


def _peak_words(p: PeakCheck) -> str:
    pct = "" if p.percent is None else f" ({p.percent:+.0f} %)"
    return f"peak {render.size(p.measured)} vs planned {render.size(p.planned)}{pct}"


# The lines as of the last cell that changed an origin, computed on the main thread after that cell (the memory
# graph's thread only reads them): (origins' version they were made at, the lines).
_noted: list[Any] = [None, {}]
_noted_count = [0]


def note_cell_lines() -> None:
    """Recompute the Memory tab's lines if a cell loaded or ran a model, or a model was deleted, since last time."""
    now = (origins_version(), len(origins()))
    if now != _noted[0]:
        _noted[:] = [now, cell_lines()]
        _noted_count[0] += 1


def noted_cell_lines() -> tuple[int, dict[int, list[str]]]:
    """The lines as last noted, and how many times they were noted (never computes)."""
    return _noted_count[0], dict(_noted[1])


# ---------------------------------------------------------------- pin


def _peaks(e: Entry) -> list[dict[str, Any]]:
    if e.comparison is not None:
        return [{"cell": p.cell, "what": p.what, "device": p.device, "bytes": p.measured, "measured_by": p.measured_by}
                for p in e.comparison.peaks]  # fmt: skip
    o = e.origin
    if o is None or o.record is None:
        return []
    return [{"cell": o.execution_count, "what": "loading", "device": m.device, "bytes": m.used,
             "measured_by": m.trace} for m in o.record.memory.values()]  # fmt: skip


def pin_data(e: Entry) -> dict[str, Any]:
    """What ran, as the pin file holds it."""
    m, o = e.loaded, e.origin
    plan = o.plan if o is not None else None
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": installed_versions(),
        "model": plan.model if plan is not None else m.name_or_path,
        "model_class": m.model_class,
        "arguments": to_dict(plan.args) if plan is not None else None,
        "attention": {a.config: a.implementation for a in m.attention},
        "use_kernels": m.use_kernels,
        "kernels": [{"layer": k.layer, "modules": k.modules, "kernel": k.kernel} for k in m.kernels],
        "dtype": m.dtype,
        "float32_modules": list(m.float32.modules) if m.float32 else [],
        "device_map": m.device_map,
        "quantization": m.quantization.method if m.quantization else None,
        "devices": {d.device: d.bytes for d in _merged(m)},
        "peaks": _peaks(e),
    }


@dataclass(frozen=True)
class _Merged:
    device: str
    bytes: int


def _merged(m: LoadedModel) -> list[_Merged]:
    found: dict[str, int] = {}
    for d in m.devices:
        found[d.device] = found.get(d.device, 0) + d.bytes
    return [_Merged(k, v) for k, v in found.items()]


def pick(namespace: Mapping[str, Any], model: Any) -> tuple[str, Any]:
    """The model to pin: the object given, a variable's name, or the only model there is."""
    models = models_in(namespace)
    if isinstance(model, str):
        if model not in models:
            raise UserError(f"no transformers model named {model!r}; valid: {', '.join(models) or 'none loaded'}")
        return model, models[model]
    if model is not None:
        for name, value in models.items():
            if value is model:
                return name, value
        if not is_model(model):
            raise UserError(f"nbhw.pin: {type(model).__name__} is not a transformers model")
        return "model", model
    if len(models) != 1:
        raise UserError(f"nbhw.pin: name the model; loaded: {', '.join(models) or 'none'}")
    return next(iter(models.items()))


def pin(namespace: Mapping[str, Any], model: Any, path: str, interval: float | None = None) -> Pin:
    """Write what ran with ``model`` to ``path`` (JSON); returns the pin as it will be read back."""
    variable, found = pick(namespace, model)
    return write_pin(pin_data(entry(found, variable, interval)), path)
