"""``nbhw.detect()``: every backend row, their devices, who picks what, and the environment analysis."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nbhw.core.hardware import backends, environment, nvml, probes, who_picks
from nbhw.core.hardware.data import BackendStatus, Choice, DeviceInfo, EnvAnalysis, TorchBuild, to_plain
from nbhw.core.render import Shown


def torch_build() -> TorchBuild:
    """The installed torch: version and what it was built for (CPU / CUDA x.y / ROCm x.y)."""
    torch = probes.torch_module()
    if torch is None:
        return TorchBuild(installed=False)
    version = getattr(torch, "version", None)
    return TorchBuild(
        installed=True,
        version=str(torch.__version__),
        build=probes.torch_build(torch),
        cuda=getattr(version, "cuda", None),
        hip=getattr(version, "hip", None),
    )


@dataclass
class Hardware(Shown):
    """What PyTorch and Transformers can use here. Renders itself as HTML in Jupyter and as text elsewhere."""

    torch: TorchBuild
    backends: list[BackendStatus]
    choices: list[Choice]
    env: EnvAnalysis
    nvidia: nvml.NvmlView = field(default_factory=lambda: nvml.NvmlView(available=False))

    @property
    def devices(self) -> list[DeviceInfo]:
        """Every device of every usable backend."""
        return [d for b in self.backends if b.usable for d in b.devices]

    @property
    def usable(self) -> list[BackendStatus]:
        """The usable backend rows."""
        return [b for b in self.backends if b.usable]

    def backend(self, key: str) -> BackendStatus:
        """The row with this key ('cpu', 'cuda', 'rocm', 'xpu', ...)."""
        for row in self.backends:
            if row.key == key:
                return row
        raise KeyError(key)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data; the shape is documented in README ("The report's JSON")."""
        return {
            "torch": to_plain(self.torch),
            "nvidia": {
                "nvml": self.nvidia.available,
                "error": self.nvidia.error,
                "driver_version": self.nvidia.driver_version,
                "cuda_driver_version": self.nvidia.cuda_driver_version,
            },
            "backends": to_plain(self.backends),
            "choices": to_plain(self.choices),
            "env": to_plain(self.env),
        }

    def text(self) -> str:
        """The devices view as aligned text."""
        from nbhw.core.hardware import detect_view

        return detect_view.hardware_text(self)

    def html(self) -> str:
        """The devices view as an HTML fragment."""
        from nbhw.core.hardware import detect_view

        return detect_view.hardware_html(self)


def detect() -> Hardware:
    """Probe every backend now. Never creates a CUDA context, allocates on a device, or touches the network."""
    rows = backends.probe_all()
    view = nvml.read()
    return Hardware(
        torch=torch_build(),
        backends=rows,
        choices=who_picks.all_choices(rows),
        env=environment.analyse(view),
        nvidia=view,
    )
