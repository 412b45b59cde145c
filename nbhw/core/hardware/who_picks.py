"""Who picks what here: from_pretrained, device_map="auto", TrainingArguments, pipeline(), Accelerator.

Computed from the rows detection found and from the orders read out of the installed libraries (see
:mod:`nbhw.core.hf.library_source`); nothing here calls the library functions themselves, since they would
initialise CUDA or set the current device.
"""

from __future__ import annotations

import os
import sys

from nbhw.core.hardware.data import BackendStatus, Choice
from nbhw.core.hf import library_source
from nbhw.core.hf.library_source import Order

# Backends a device_map="auto" chain of availability checks (accelerate < 1.16) may leave out: their device string
# must then be passed explicitly. accelerate >= 1.16 budgets whatever torch's accelerator is (its order has an
# 'accelerator' step), so none is left out there.
EXPLICIT_ONLY = ("neuron", "tpu")


def _usable(rows: list[BackendStatus]) -> dict[str, BackendStatus]:
    """Usable rows by the key the libraries' checks use ('cuda' covers NVIDIA and ROCm builds)."""
    found: dict[str, BackendStatus] = {}
    for row in rows:
        if row.usable:
            found.setdefault(row.device, row)
    return found


def torch_accelerator(rows: list[BackendStatus]) -> str | None:
    """The device type ``torch.accelerator.current_accelerator()`` names here (the rows mark it); None: CPU build."""
    return next((row.device for row in rows if row.torch_accelerator), None)


def left_out(rows: list[BackendStatus], order: Order) -> list[str]:
    """Usable backends that ``order`` never picks: device_map="auto" (or a default) won't place on them."""
    reached = {s.probe for s in order.steps} | {s.device for s in order.steps if s.device}
    kind = torch_accelerator(rows)
    if kind and library_source.ACCELERATOR in reached:  # whatever torch's accelerator is, the order reaches it
        reached.add(kind)
    return [key for key in EXPLICIT_ONLY if key in _usable(rows) and key not in reached]


def _unread(who: str, what: str) -> Choice:
    return Choice(who, "unknown", f"could not read {what} from the installed library; nbhw does not guess")


def from_pretrained_default() -> Choice:
    """from_pretrained with no device_map: CPU, unless a torch default device or device context is set."""
    torch = sys.modules.get("torch")
    default = None
    if torch is not None and hasattr(torch, "get_default_device"):
        default = str(torch.get_default_device())
    if default and default != "cpu":
        return Choice(
            "from_pretrained(model)",
            default,
            f"torch.set_default_device({default!r}) is in effect, and from_pretrained follows it",
        )
    return Choice(
        "from_pretrained(model)",
        "cpu",
        "with no device_map, transformers loads the weights on the CPU",
        ['pass device_map="auto" (or a device string) to load on an accelerator'],
    )


def _pick(rows: list[BackendStatus], order: Order) -> tuple[str | None, str]:
    """The first step of ``order`` that is usable here: (its device, or None for none; why)."""
    usable = _usable(rows)
    for step in order.steps:
        if step.probe == library_source.ENV:
            value = os.environ.get(step.device or "", step.default or "cpu")
            return value, f"no accelerator found, so {step.device} or its default {step.default!r}"
        if step.probe == library_source.ELSE:
            return step.device, "no accelerator in its list is usable here"
        if step.probe == library_source.ACCELERATOR:
            kind = torch_accelerator(rows)
            if kind in usable:
                return kind, f"{usable[kind].hardware} is torch's accelerator (torch.accelerator) and is usable"
            continue
        if step.probe in usable:
            device = (step.device or step.probe).replace("{index}", "0")
            return device, f"{usable[step.probe].hardware} is the first usable backend in its order"
    return None, "no accelerator in its list is usable here"


def auto_devices(rows: list[BackendStatus], order: Order) -> list[str]:
    """What accelerate's get_max_memory budgets for device_map="auto", in its order: accelerators, then mps/cpu."""
    usable = _usable(rows)
    family, _ = _pick(rows, order)
    picked = [d.device for d in usable[family].devices] if family in usable and family != "mps" else []
    if family in order.one_device:
        picked = picked[:1]  # accelerate budgets only the process's current device of these
    # get_max_memory: MPS shares host RAM, so it replaces the CPU budget rather than adding to it.
    return [*picked, "mps" if "mps" in usable else "cpu"]


def one_device_notes(rows: list[BackendStatus], order: Order) -> list[str]:
    """When accelerate budgets only the process's current device of the family here (one TPU chip of several)."""
    family, usable = _pick(rows, order)[0], _usable(rows)
    if family not in order.one_device or family not in usable or len(usable[family].devices) < 2:
        return []
    n = len(usable[family].devices)
    return [
        f"device_map=\"auto\" budgets one {family} device, the process's current one, not all {n}: accelerate's "
        f"get_max_memory counts one {family} device per process (run one process per device to use them all)"
    ]


def device_map_auto(rows: list[BackendStatus], order: Order | None) -> Choice:
    """device_map="auto": the accelerator family accelerate's get_max_memory counts, then mps or cpu."""
    who = 'from_pretrained(model, device_map="auto")'
    if order is None:
        return _unread(who, "accelerate's get_max_memory order")
    usable = _usable(rows)
    picked = auto_devices(rows, order)
    notes = []
    for key in left_out(rows, order):
        notes.append(f'{usable[key].hardware}: "auto" does not place on {key}; pass device_map="{key}" explicitly')
    notes += one_device_notes(rows, order)
    if len(picked) > 1:
        why = f"accelerate fills {', '.join(picked[:-1])} in turn, then spills to {picked[-1]}"
    else:
        why = f"no accelerator for accelerate to fill: every layer goes to {picked[0]}"
    return Choice(who, ", ".join(picked), why, notes, order.source)


def _first_usable(rows: list[BackendStatus], order: Order) -> tuple[str, str]:
    device, why = _pick(rows, order)
    return device or "cpu", why


def trainer(rows: list[BackendStatus], order: Order | None) -> Choice:
    """TrainingArguments().device in a single process (a notebook), and what use_cpu does."""
    who = "TrainingArguments(...).device"
    if order is None:
        return _unread(who, "TrainingArguments._setup_devices")
    usable = _usable(rows)
    device, why = _first_usable(rows, order)
    notes = ["use_cpu=True forces cpu"]
    if "cuda" in usable and len(usable["cuda"].devices) > 1 and device.startswith("cuda"):
        n = len(usable["cuda"].devices)
        notes.append(
            f"{n} GPUs visible: in one process Trainer wraps the model in nn.DataParallel over all {n}; "
            f"use `torchrun --nproc_per_node={n}` or `accelerate launch` for DDP"
        )
    if os.environ.get("LOCAL_RANK") or os.environ.get("WORLD_SIZE"):
        notes.append("LOCAL_RANK/WORLD_SIZE are set: Trainer runs distributed and uses this rank's device")
    if "torch_xla" in sys.modules or os.environ.get("USE_TORCH_XLA", "").lower() in {"1", "true"}:
        notes.append("torch_xla present: Trainer takes the XLA device instead")
    return Choice(who, device, why, notes, order.source)


def pipeline(rows: list[BackendStatus], order: Order | None) -> Choice:
    """pipeline(task, model) with no device: device 0 of the first backend in its order."""
    who = "pipeline(task, model=...)"
    if order is None:
        return _unread(who, "Pipeline.__init__")
    device, why = _first_usable(rows, order)
    notes = ["a model loaded with device_map keeps its placement; pipeline() then uses its first device"]
    notes += [f'pipeline() never picks {k} by itself; pass device="{k}"' for k in left_out(rows, order)]
    return Choice(who, device, why, notes, order.source)


def accelerator(rows: list[BackendStatus], order: Order | None) -> Choice:
    """accelerate's Accelerator() / PartialState().default_device."""
    who = "Accelerator().device"
    if order is None:
        return _unread(who, "PartialState.default_device")
    env = os.environ.get("ACCELERATE_TORCH_DEVICE")
    if env:
        return Choice(who, env, "ACCELERATE_TORCH_DEVICE is set and wins")
    device, why = _first_usable(rows, order)
    return Choice(who, device, why, source=order.source)


def all_choices(rows: list[BackendStatus]) -> list[Choice]:
    """Every entry point's pick, in the order a user meets them."""
    return [
        from_pretrained_default(),
        device_map_auto(rows, library_source.auto_memory_order()),
        trainer(rows, library_source.trainer_order()),
        pipeline(rows, library_source.pipeline_order()),
        accelerator(rows, library_source.accelerate_default_order()),
    ]
