"""nbhw: which accelerators PyTorch and Transformers can use here, and the from_pretrained cell that will work.

``import nbhw`` is cheap: torch, transformers, plotly and ipywidgets load only when a function needs them.
"""

from __future__ import annotations

import importlib
from typing import Any

from nbhw._version import __version__

# Public name -> "module:attribute", imported on first use.
_LAZY = {
    "attention": "nbhw.core.advice.attention:advise",
    "AttentionAdvice": "nbhw.core.advice.attention:AttentionAdvice",
    "detect": "nbhw.core.hardware.detect:detect",
    "Hardware": "nbhw.core.hardware.detect:Hardware",
    "report": "nbhw.core.hardware.report:report",
    "doctor": "nbhw.core.hardware.doctor:doctor",
    "Preflight": "nbhw.core.hardware.findings:Preflight",
    "System": "nbhw.core.hardware.findings:System",
    "TorchFacts": "nbhw.core.hardware.findings:TorchFacts",
    "Gpu": "nbhw.core.hardware.findings:Gpu",
    "UserError": "nbhw.core.errors:UserError",
    "plan": "nbhw.core.task_plan:plan",
    "quantization": "nbhw.core.advice.quantization:advise",
    "QuantizationAdvice": "nbhw.core.advice.quantization:QuantizationAdvice",
    "targets": "nbhw.core.hardware.targets:targets",
    "Targets": "nbhw.core.hardware.targets:Targets",
    "fit": "nbhw.core.fit.solver:fit",
    "FitResult": "nbhw.core.fit.solver:FitResult",
    "LoadPlan": "nbhw.core.plan.load_plan:LoadPlan",
    "holders": "nbhw.session:holders",
    "Holders": "nbhw.core.memory.holders:Holders",
    "free": "nbhw.session:free",
    "Freed": "nbhw.core.memory.freeing:Freed",
    "train_plan": "nbhw.core.train.train_plan:train_plan",
    "TrainPlan": "nbhw.core.train.train_plan:TrainPlan",
    "loaded": "nbhw.session:loaded",
    "pin": "nbhw.session:pin",
    "Pin": "nbhw.core.plan.pinned:Pin",
    "monitor": "nbhw.ui.memory:monitor",
    "Monitor": "nbhw.ui.memory:Monitor",
    "panel": "nbhw.ui.panel:panel",
    "Panel": "nbhw.ui.panel:Panel",
}

__all__ = [
    "AttentionAdvice",
    "FitResult",
    "Freed",
    "Gpu",
    "Hardware",
    "Holders",
    "LoadPlan",
    "Monitor",
    "Panel",
    "Pin",
    "Preflight",
    "QuantizationAdvice",
    "System",
    "Targets",
    "TorchFacts",
    "TrainPlan",
    "UserError",
    "__version__",
    "attention",
    "detect",
    "doctor",
    "fit",
    "free",
    "holders",
    "load_ipython_extension",
    "loaded",
    "monitor",
    "panel",
    "pin",
    "plan",
    "quantization",
    "report",
    "targets",
    "train_plan",
    "unload_ipython_extension",
]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'nbhw' has no attribute {name!r}")
    module, attribute = target.split(":")
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext nbhw``: register the %hw magic."""
    from nbhw import magics

    magics.load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext nbhw``: remove %hw and stop everything nbhw started in this kernel."""
    from nbhw import magics

    magics.unload(ipython)


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """The Jupyter server extension (routes under /nbhw), enabled by jupyter-config/."""
    # Imported here, not at the top: `import nbhw` stays free of jupyter_server and tornado.
    from nbhw.server import NbhwApp

    return [{"module": "nbhw.server", "app": NbhwApp}]
