"""Plain data for what detection finds: devices, backends, and the whole machine."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


@dataclass
class DeviceInfo:
    """One device of a usable backend. ``None`` means the backend cannot tell (shown as N/A)."""

    index: int
    device: str
    name: str | None = None
    total_memory: int | None = None
    free_memory: int | None = None
    compute_capability: str | None = None
    bf16: bool | None = None
    fp16: bool | None = None
    tf32: bool | None = None
    details: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class BackendStatus:
    """One row of the Transformers hardware table, as found on this machine."""

    key: str
    hardware: str
    device: str
    package: str
    installed: bool
    version: str | None
    usable: bool
    reason: str | None = None
    fix: str | None = None
    devices: list[DeviceInfo] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: bool = False
    # torch.accelerator.current_accelerator() is this row's device type: the accelerator torch was built (or a
    # plugin registered) for, which accelerate >= 1.16 asks first.
    torch_accelerator: bool = False


@dataclass
class Probed:
    """What a backend's probe returns; the registry adds the package facts."""

    usable: bool
    reason: str | None = None
    fix: str | None = None
    devices: list[DeviceInfo] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    version: str | None = None


@dataclass
class Choice:
    """What one library entry point would pick here, and why."""

    who: str
    device: str
    why: str
    notes: list[str] = field(default_factory=list)
    source: str | None = None


@dataclass
class GpuOrderRow:
    """How one cuda:N ordinal maps to a physical GPU."""

    device: str
    nvml_index: int
    name: str | None
    pci_bus_id: str | None
    uuid: str | None


@dataclass
class EnvVar:
    """One environment variable that changes what torch / transformers / accelerate do."""

    name: str
    value: str | None
    meaning: str


@dataclass
class EnvAnalysis:
    """The environment variables that matter here, the cuda:N mapping, and the traps found."""

    variables: list[EnvVar] = field(default_factory=list)
    gpu_order: list[GpuOrderRow] = field(default_factory=list)
    gpu_order_exact: bool = True
    warnings: list[str] = field(default_factory=list)


@dataclass
class TorchBuild:
    """The installed torch and what it was built for."""

    installed: bool
    version: str | None = None
    build: str = "not installed"
    cuda: str | None = None
    hip: str | None = None


def to_plain(obj: Any) -> Any:
    """Dataclasses, lists and dicts as JSON-ready plain values."""
    if hasattr(obj, "__dataclass_fields__"):
        return to_plain(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_plain(v) for v in obj]
    if isinstance(obj, Enum):
        return obj.value
    return obj
