"""Where from_pretrained would put each module: transformers' own device_map logic on the meta model.

For "auto" / "balanced" / "balanced_low_0" / "sequential", :func:`place` calls transformers' ``_get_device_map``
(get_balanced_memory + infer_auto_device_map) exactly as ``from_pretrained`` does. When the user gives no
``max_memory``, transformers would ask accelerate's ``get_max_memory``, which creates a context on every GPU to read
free memory; nbhw hands it the same budget read from NVML and the other probes instead, so transformers' own
adjustments (90% of CPU RAM, the buffer on a single GPU) still apply and no context is created.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from nbhw.core import render
from nbhw.core.hardware import backends, presence, who_picks
from nbhw.core.hardware.data import BackendStatus
from nbhw.core.hf import library_source, meta_build, module_sizes
from nbhw.core.plan.arguments import DISK, PlanArgs, strategy_names

_patch_lock = threading.Lock()


@dataclass
class DeviceShare:
    """What one device gets: the device_map entries placed there and their bytes, against its budget.

    ``bytes`` are the weights; the run's figures (``cache_bytes``, ``activation_bytes``, ``reserve_bytes`` and
    ``peak_bytes``, the weights, cache and activations at the device's worst moment) are None until the plan's dry
    run fills them in (``plan.placement`` always has; the Load tab shows the weights first).
    """

    device: str
    key: int | str
    modules: int
    bytes: int
    budget: int | None = None
    layers: int = 0
    names: list[str] = field(default_factory=list)
    cache_bytes: int | None = None
    activation_bytes: int | None = None
    reserve_bytes: int | None = None
    peak_bytes: int | None = None
    margin_bytes: int | None = None  # what the device's allocator needs left free (nbhw.core.plan.headroom)

    @property
    def needed_bytes(self) -> int | None:
        """The run's peak on this device and the framework's reserve: what its budget must hold."""
        return None if self.peak_bytes is None else self.peak_bytes + (self.reserve_bytes or 0)

    @property
    def over_bytes(self) -> int | None:
        """How far the run goes past this device's budget (negative: room left); None when either is unknown."""
        needed = self.needed_bytes
        return None if needed is None or self.budget is None else needed - self.budget

    @property
    def headroom_bytes(self) -> int | None:
        """What the budget has left at the run's peak (negative: over); None when either is unknown."""
        over = self.over_bytes
        return None if over is None else -over

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return {
            "device": self.device, "key": self.key, "modules": self.modules, "bytes": self.bytes,
            "budget": self.budget, "layers": self.layers, "cache_bytes": self.cache_bytes,
            "activation_bytes": self.activation_bytes, "reserve_bytes": self.reserve_bytes,
            "peak_bytes": self.peak_bytes, "needed_bytes": self.needed_bytes, "headroom_bytes": self.headroom_bytes,
            "margin_bytes": self.margin_bytes,
        }  # fmt: skip


@dataclass
class LiveMemory:
    """The budget accelerate would read for device_map="auto" on this machine, read without a CUDA context."""

    max_memory: dict[int | str, int]
    accelerator: str | None
    notes: list[str] = field(default_factory=list)
    source: str = "this machine's free memory"  # what a placement says it was planned against


@dataclass
class Placement:
    """The device_map transformers would compute, per-device totals, and a one-line verdict."""

    device_map: dict[str, int | str]
    strategy: str | None
    budget_source: str
    budget: dict[int | str, int] | None
    devices: list[DeviceShare]
    verdict: str
    kind: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    run_kind: str | None = None  # fits, tight, fits_shorter, does_not_fit, not_covered; None: weights only

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return {
            "device_map": dict(self.device_map),
            "strategy": self.strategy,
            "budget_source": self.budget_source,
            "budget": {str(k): v for k, v in (self.budget or {}).items()} or None,
            "devices": [d.to_dict() for d in self.devices],
            "verdict": self.verdict,
            "kind": self.kind,
            "run_kind": self.run_kind,
            "problems": list(self.problems),
            "notes": list(self.notes),
        }


UNREAD_ORDER = (
    "could not read which devices accelerate's get_max_memory budgets from the installed accelerate: only the CPU "
    "is budgeted here; pass max_memory to name the accelerators"
)


def live_memory(rows: list[BackendStatus] | None = None) -> LiveMemory:
    """Free memory per device that device_map="auto" would fill here, from nbhw's probes (NVML for NVIDIA)."""
    rows = backends.probe_all() if rows is None else rows
    order = library_source.auto_memory_order()
    picked = who_picks.auto_devices(rows, order) if order is not None else ["cpu"]
    devices = {d.device: d for row in rows if row.usable for d in row.devices}
    cpu = devices.get("cpu")
    memory: dict[int | str, int] = {}
    notes: list[str] = []
    if order is None:
        notes.append(UNREAD_ORDER)
    else:
        notes += who_picks.one_device_notes(rows, order)
    accelerator = None
    for name in picked:
        info = cpu if name == "mps" else devices.get(name)  # accelerate budgets mps with host RAM
        free = None if info is None else info.free_memory if info.free_memory is not None else info.total_memory
        if free is None:
            notes.append(f"free memory of {name} is unknown here; it is left out of the budget")
            continue
        if info is not None and info.free_memory is None:
            notes.append(f"free memory of {name} is unknown here; its total is used")
        if name in {"cpu", "mps"}:
            memory[name] = int(free)
        else:
            accelerator, _, index = name.partition(":")
            memory[int(index or 0)] = int(free)
    return LiveMemory(memory, accelerator, notes)


@contextlib.contextmanager
def _budget(live: LiveMemory) -> Iterator[bool]:
    """Make transformers' device_map code read ``live`` where it would call accelerate's get_max_memory()."""
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.integrations import accelerate as hf_accelerate

    original = getattr(hf_accelerate, "accelerate_max_memory", None)
    if original is None:
        yield False
        return

    def max_memory(max_memory: Any = None) -> Any:
        return dict(live.max_memory) if max_memory is None else original(max_memory)

    with _patch_lock:
        hf_accelerate.accelerate_max_memory = max_memory
        try:
            yield True
        finally:
            hf_accelerate.accelerate_max_memory = original


def computed_map(
    model: Any, strategy: str, max_memory: dict[Any, Any] | None, quantizer: Any, live: LiveMemory | None
) -> dict[str, Any]:
    """transformers' own device_map for a strategy; ``live`` stands in for accelerate's free-memory probe."""
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.integrations.accelerate import _get_device_map

    with meta_build.quiet(), module_sizes.kept_in_transformers():
        if max_memory is not None or live is None:
            return dict(_get_device_map(model, strategy, dict(max_memory) if max_memory else None, quantizer))
        with _budget(live) as patched:
            budget = None if patched else dict(live.max_memory)
            return dict(_get_device_map(model, strategy, budget, quantizer))


def device_name(key: int | str, accelerator: str | None) -> str:
    """How a device_map value reads to a person: 0 -> 'cuda:0' here, 'accelerator 0' when none is here."""
    if isinstance(key, int):
        return f"{accelerator}:{key}" if accelerator else f"accelerator {key}"
    return str(key)


def layer_names(model: Any) -> list[str]:
    """The modules transformers never splits across devices (the decoder layers): what 'a layer' means here."""
    no_split = set(getattr(model, "_no_split_modules", None) or [])
    return [name for name, module in model.named_modules() if type(module).__name__ in no_split]


def _shares(
    model: Any, device_map: dict[str, Any], quantizer: Any, accelerator: str | None
) -> tuple[list[DeviceShare], int]:
    """Per device: entries, bytes, layers (by transformers' own expansion of the map to every tensor)."""
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.integrations.accelerate import expand_device_map

    sizes, _ = module_sizes.module_sizes(model, quantizer, only_modules=False)
    tensors = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    per_tensor = expand_device_map(device_map, tensors)
    shares: dict[Any, DeviceShare] = {}

    def share(value: Any) -> DeviceShare:
        if value not in shares:
            shares[value] = DeviceShare(device_name(value, accelerator), value, 0, 0)
        return shares[value]

    for module, value in device_map.items():
        share(value).modules += 1
        share(value).names.append(module or "(whole model)")
    for name, value in per_tensor.items():
        share(value).bytes += int(sizes.get(name, 0))
    layers = set(layer_names(model))
    counted: set[str] = set()
    for name in tensors:  # a layer is where its first tensor is
        parts = name.split(".")
        layer = next((p for i in range(1, len(parts)) if (p := ".".join(parts[:i])) in layers), None)
        if layer is not None and layer not in counted:
            counted.add(layer)
            share(per_tensor[name]).layers += 1
    return list(shares.values()), len(layers)


def dtype_plan_notes(model: Any, assumed: list[DeviceShare], placed: list[DeviceShare]) -> list[str]:
    """What the dtype plan adds to each device after transformers mapped the model without it (from_pretrained
    computes the device_map before it keeps, e.g., T5's ``wo`` in float32): the bytes its map did not count."""
    plan = model._get_dtype_plan(model.config.dtype)
    kept = ", ".join(
        f"{' and '.join(sorted(names))} in {str(dtype).removeprefix('torch.')}"
        for dtype, names in _by_dtype(plan).items()
    )
    before = {s.key: s.bytes for s in assumed}
    more = [(s.device, s.bytes - before.get(s.key, 0)) for s in placed if s.bytes > before.get(s.key, 0)]
    return [
        f"transformers maps before keeping {kept}; {device} gets {render.size(extra)} more than the map assumed"
        for device, extra in more
    ]


def _by_dtype(plan: dict[str, Any]) -> dict[Any, list[str]]:
    found: dict[Any, list[str]] = {}
    for name, dtype in plan.items():
        found.setdefault(dtype, []).append(name)
    return found


def is_accelerator(key: int | str) -> bool:
    """Whether a device_map value runs layers (an accelerator), rather than holding them (cpu, disk, meta)."""
    return isinstance(key, int) or str(key) not in {"cpu", DISK, "meta"}


def _what(share: DeviceShare, total_layers: int) -> str:
    if share.layers:
        return f"{share.layers} of {total_layers} layers"
    more = f" and {len(share.names) - 3} more" if len(share.names) > 3 else ""
    return ", ".join(share.names[:3]) + more


def verdict(shares: list[DeviceShare], budget: dict[int | str, int] | None, total_layers: int = 0) -> tuple[str, str]:
    """One line a person reads first, and its kind: one_device, split, cpu_offload, disk (too_big, none: see place)."""
    used = [s for s in shares if s.bytes or s.modules]
    on = {s.key: s for s in used}
    accelerators = [s for s in used if is_accelerator(s.key)]
    if DISK in on:
        return f"needs disk: offloads {_what(on[DISK], total_layers)} to disk (very slow)", "disk"
    budgeted = [k for k, v in (budget or {}).items() if is_accelerator(k) and v > 0]
    if "cpu" in on and (accelerators or budgeted):
        return f"offloads {_what(on['cpu'], total_layers)} to CPU (slow)", "cpu_offload"
    if len(used) == 1:
        return f"fits on one device ({used[0].device})", "one_device"
    return f"split across {len(used)} devices ({', '.join(s.device for s in used)})", "split"


def budget_key(key: int | str, accelerator: str | None) -> int | str:
    """'cuda:1' -> 1 when cuda is the accelerator bare indices mean, as accelerate keys its budget."""
    if isinstance(key, str) and accelerator and key.split(":")[0] == accelerator:
        return int(key.partition(":")[2] or 0)
    return key


def _too_big(shares: list[DeviceShare], budget: dict[int | str, int] | None, accelerator: str | None) -> list[str]:
    """Accelerators given more weights than their budget (an explicit device_map is not checked by transformers)."""
    over = []
    for share in shares:
        share.budget = (budget or {}).get(budget_key(share.key, accelerator))
        if share.budget is not None and share.bytes > share.budget and is_accelerator(share.key):
            over.append(
                f"{share.device} needs {render.size(share.bytes)} for the weights, {render.size(share.budget)} free"
            )
    return over


def place(
    model: Any, args: PlanArgs, *, quantizer: Any = None, default_device: str = "cpu", live: LiveMemory | None = None
) -> Placement:
    """The placement ``args`` give ``model`` (meta device, target dtype) here or on the budget the user named."""
    user_budget = args.max_memory_bytes
    live_budget = None if user_budget is not None else live
    accelerator = (live.accelerator if live is not None else None) or presence.accelerator_type()
    strategy = args.device_map if isinstance(args.device_map, str) and args.device_map in strategy_names() else None
    budget = user_budget if user_budget is not None else (live.max_memory if live is not None else None)
    source = (
        "the max_memory you gave" if user_budget is not None else live.source if live else "this machine's free memory"
    )
    notes = list(live.notes) if live is not None and user_budget is None else []
    mapped = model
    if strategy is not None:
        try:
            mapped = meta_build.before_dtype_plan(model)
            device_map = computed_map(mapped, strategy, args.max_memory, quantizer, live_budget)
        except Exception as exc:
            why = f"transformers could not place it: {type(exc).__name__}: {' '.join(str(exc).split())}"
            return Placement(
                {}, strategy, source, budget, [], "no placement: transformers refused", "none", [why], notes
            )
    elif args.device_map is None:
        device_map = {"": default_device}
    elif isinstance(args.device_map, dict):
        device_map = dict(args.device_map)
    else:
        device_map = {"": args.device_map}
    shares, total_layers = _shares(model, device_map, quantizer, accelerator)
    if mapped is not model:
        notes += dtype_plan_notes(model, _shares(mapped, device_map, quantizer, accelerator)[0], shares)
    over = _too_big(shares, budget, accelerator)
    text, kind = verdict(shares, budget, total_layers)
    if over:
        text, kind = f"does not fit: {'; '.join(over)}", "too_big"
    problems = [f"{o}: loading would run out of memory" for o in over]
    return Placement(device_map, strategy, source, budget, shares, text, kind, problems, notes)
