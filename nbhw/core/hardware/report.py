"""The environment report: everything `transformers env` and `accelerate env` tell, plus the devices view.

Text for pasting into a bug report; JSON with the stable shape in ``report.schema.json`` (schema_version 1).
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbhw._version import __version__
from nbhw.core.hardware import probes
from nbhw.core.hardware.detect import Hardware, detect
from nbhw.core.render import Shown, esc, size, text_table

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("report.schema.json")

# Distribution names; flash-attn-3 / -4 are the names transformers' compatibility matrix checks for.
PACKAGES = (
    "torch",
    "transformers",
    "accelerate",
    "huggingface_hub",
    "safetensors",
    "tokenizers",
    "kernels",
    "flash-attn",
    "flash-attn-3",
    "flash-attn-4",
    "bitsandbytes",
    "peft",
    "deepspeed",
    "numpy",
    "ipykernel",
    "ipywidgets",
    "ipython",
    "jupyterlab",
    "notebook",
    "jupyter_server",
    "plotly",
    "anywidget",
    "nvidia-ml-py",
    "amdsmi",
    "psutil",
    "nbhw",
)


def package_versions() -> dict[str, str | None]:
    """Installed version of each package that matters, None when missing."""
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def accelerate_config_file() -> Path:
    """Where `accelerate config` writes its default file (accelerate.commands.config.config_args's rule)."""
    cache = os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    return Path(os.path.expanduser(cache)) / "accelerate" / "default_config.yaml"


def accelerate_config() -> dict[str, Any]:
    """The default accelerate config file, its contents when present, and where the CLI is."""
    path = accelerate_config_file()
    config: Any = None
    if path.is_file():
        try:
            import yaml

            config = yaml.safe_load(path.read_text(encoding="utf-8"))
        except Exception as exc:
            config = {"error": f"could not read: {exc}"}
    return {
        "config_file": str(path) if path.is_file() else None,
        "config": config,
        "bash_location": shutil.which("accelerate"),
    }


def _cudnn() -> str | None:
    torch = sys.modules.get("torch")
    if torch is None or probes.torch_build(torch) == "CPU":
        return None
    # Not torch.backends.cudnn.version(): its first call (torch 2.13's backends/cudnn/__init__.py, _init) asks
    # torch.cuda.get_device_capability for every GPU, which initialises CUDA and creates a context on the GPU.
    # The cuDNN library's own answer does not touch the devices.
    cudnn = getattr(torch._C, "_cudnn", None)
    try:
        v = cudnn.getVersionInt() if cudnn is not None else None
    except Exception:
        return None
    return str(v) if v else None


def platform_facts() -> dict[str, Any]:
    """OS, Python, CPU and RAM."""
    import psutil

    return {
        "platform": platform.platform(),
        "system": platform.system(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "cpu": probes.cpu_name(),
        "cpu_count": os.cpu_count(),
        "ram_total": _ram_total(psutil),
    }


def _ram_total(psutil: Any) -> int | None:
    """The machine's RAM, None when psutil may not read it (a sandbox hiding /proc/meminfo)."""
    try:
        return int(psutil.virtual_memory().total)
    except (psutil.Error, OSError):
        return None


@dataclass
class Report(Shown):
    """A bug-report-ready description of this environment."""

    generated_at: str
    platform: dict[str, Any]
    packages: dict[str, str | None]
    accelerate: dict[str, Any]
    cudnn: str | None
    hardware: Hardware

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON shape (see report.schema.json)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "nbhw_version": __version__,
            "generated_at": self.generated_at,
            "platform": self.platform,
            "packages": self.packages,
            "accelerate": self.accelerate,
            "cudnn": self.cudnn,
            **self.hardware.to_dict(),
        }

    def json(self) -> str:
        """The report as indented JSON."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def text(self) -> str:
        """Text to paste into a bug report."""
        p = self.platform
        t = self.hardware.torch
        nv = self.hardware.nvidia
        accelerators = [d.device for d in self.hardware.devices if d.device != "cpu"]
        lines = [
            f"nbhw {__version__} environment report ({self.generated_at})",
            "",
            f"- Platform: {p['platform']}",
            f"- Python: {p['python']} ({p['python_executable']})",
            f"- CPU: {p['cpu']} ({p['cpu_count']} logical cores), RAM {size(p['ram_total'])}",
            f"- PyTorch: {t.version or 'not installed'} ({t.build} build)"
            + (f", cuDNN {self.cudnn}" if self.cudnn else ""),
            f"- NVIDIA driver: {nv.driver_version} (CUDA {nv.cuda_driver_version})"
            if nv.available
            else f"- NVIDIA driver: none ({nv.error})",
            f"- Accelerators usable: {', '.join(accelerators) or 'none'}",
            f"- Accelerate config: {self.accelerate['config_file'] or 'not found'}",
            f"- `accelerate` CLI: {self.accelerate['bash_location'] or 'not found'}",
            "",
            "Packages",
            text_table(("package", "version"), [[k, v or "not installed"] for k, v in self.packages.items()], "  "),
        ]
        if isinstance(self.accelerate["config"], dict):
            lines += ["", "Accelerate default config"] + [f"  - {k}: {v}" for k, v in self.accelerate["config"].items()]
        return "\n".join(lines) + "\n\n" + self.hardware.text()

    def html(self) -> str:
        """The report as HTML: the text in a <pre>, ready to copy."""
        return f'<div class="nbhw nbhw-report"><pre>{esc(self.text())}</pre></div>'


def report(hardware: Hardware | None = None) -> Report:
    """Build the report (detecting hardware unless given)."""
    hw = hardware or detect()
    return Report(
        generated_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        platform=platform_facts(),
        packages=package_versions(),
        accelerate=accelerate_config(),
        cudnn=_cudnn(),
        hardware=hw,
    )
