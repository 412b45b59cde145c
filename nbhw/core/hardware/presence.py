"""Is a device a plan names present here? Answered from nbhw's probes, never by touching the device."""

from __future__ import annotations

import os
from typing import Any

from nbhw.core.hardware.data import BackendStatus

NOT_DEVICES = {"cpu", "disk", "meta"}


def accelerator_type() -> str | None:
    """The device type torch means by a bare index (0 -> cuda:0 on NVIDIA); no device is initialised."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    try:
        current = torch.accelerator.current_accelerator()
    except RuntimeError:  # torch 2.6 raises on a CPU-only build where later versions return None
        return None
    return None if current is None else str(current.type)


def device_type(value: int | str, accelerator: str | None = None) -> str | None:
    """'cuda' for 'cuda:1' or (on NVIDIA) for 1; None when a bare index means nothing here."""
    if isinstance(value, int):
        return accelerator or accelerator_type()
    return str(value).split(":")[0]


def _canonical(device: str) -> str:
    kind, _, index = device.partition(":")
    if kind == "cuda" and not index:
        index = os.environ.get("LOCAL_RANK", "0")  # transformers maps "cuda" to this rank's GPU
    return f"{kind}:{index or 0}"


def present(rows: list[BackendStatus]) -> set[str]:
    """Every device of every usable backend, as 'type:index'."""
    return {_canonical(d.device) for row in rows if row.usable for d in row.devices}


def _why_not(kind: str, rows: list[BackendStatus]) -> str:
    usable = [d.device for row in rows if row.usable and row.device == kind for d in row.devices]
    if usable:
        return f"this machine has {', '.join(usable)}"
    reasons = [row.reason for row in rows if row.device == kind and row.reason]
    return reasons[0] if reasons else f"nbhw knows no '{kind}' backend"


def _absence(value: Any, rows: list[BackendStatus], accelerator: str | None) -> tuple[str, str] | None:
    """(device name, why it is not here), or None when it is (cpu, disk and meta always are)."""
    if isinstance(value, str) and value in NOT_DEVICES:
        return None
    if isinstance(value, int):
        kind = accelerator or accelerator_type()
        if kind is None:
            return f"device {value}", "a bare index means an accelerator, and torch sees none here"
        name = f"{kind}:{value}"
    else:
        name = str(value)
    if _canonical(name) in present(rows):
        return None
    return name, _why_not(name.split(":")[0], rows)


def absent(values: list[Any], rows: list[BackendStatus], accelerator: str | None = None) -> list[str]:
    """One line per reason for the devices among ``values`` (device_map values) that are not here.

    A bare index means ``accelerator`` (the family accelerate budgets here), else torch's current accelerator.
    """
    by_reason: dict[str, list[str]] = {}
    for value in dict.fromkeys(values):
        found = _absence(value, rows, accelerator)
        if found is not None:
            by_reason.setdefault(found[1], []).append(found[0])
    return [
        f"device_map puts layers on {', '.join(names)}, which {'is' if len(names) == 1 else 'are'} not here: {why}"
        for why, names in by_reason.items()
    ]
