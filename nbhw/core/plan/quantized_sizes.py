"""Quantized weight sizes for planning: any method transformers quantizes on load, sized without its package."""

from __future__ import annotations

from typing import Any

from nbhw.core.advice.quantization_methods import build_config, method_key
from nbhw.core.advice.quantization_sizes import SizingQuantizer
from nbhw.core.hf.as_if import AsIf, TargetDevice


class PlanningQuantizer(SizingQuantizer):
    """The quantizer transformers' sizing and device_map code see for a plan's ``quantization`` word.

    Sizes come from :class:`~nbhw.core.advice.quantization_sizes.SizingQuantizer` (transformers' element size, or
    the config's bits, plus the format's scales). The device_map checks transformers makes while placing
    (``validate_environment(device_map=...)``) run with the method's real quantizer, as if on the plan's target
    when it has one; a refusal is kept in ``errors`` for the dry run, a missing package is the dry run's to report.
    """

    def __init__(
        self, quantization: str, dtype: str = "float16", device: TargetDevice | None = None, device_map: Any = None
    ) -> None:
        key = method_key(quantization)
        config, problem = build_config(key, dtype)
        super().__init__(key, config)
        self.device = device
        if config is None:
            self.errors.append(f"quantization={quantization!r}: the config can't be built here: {problem}")
            return
        # As from_pretrained does before sizing anything: a method may decide here to load dequantized (fp8 below
        # compute capability 8.9), and then its weights keep their dtype.
        self.validate_environment(device_map=device_map, weights_only=True)

    def validate_environment(self, *args: Any, **kwargs: Any) -> None:
        try:
            AsIf(self.device).call(type(self.real).validate_environment, self.real, *args, **kwargs)
        except ImportError:
            pass  # the package is missing: the dry run says so
        except Exception as exc:
            error = f"quantization: {type(exc).__name__}: {' '.join(str(exc).split())}"
            if error not in self.errors:
                self.errors.append(error)
