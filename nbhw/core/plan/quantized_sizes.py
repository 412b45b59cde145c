"""Quantized weight sizes for planning: transformers' bitsandbytes quantizer, usable without bitsandbytes."""

from __future__ import annotations

from typing import Any

from nbhw.core.plan.arguments import QUANTIZATION


class PlanningQuantizer:
    """transformers' bitsandbytes quantizer, sized without bitsandbytes installed.

    ``param_needs_quantization`` needs the bnb layers; here a weight is quantized by the rule replace_with_bnb_linear
    applies (an ``nn.Linear``/``Conv1D`` not among get_modules_to_not_convert). Environment failures are the dry
    run's to report; the device_map checks transformers makes are kept in ``errors``.
    """

    def __init__(self, quantization: str) -> None:
        from transformers import BitsAndBytesConfig  # lazy: import nbhw and %load_ext nbhw stay free of transformers

        # lazy: import nbhw and %load_ext nbhw stay free of transformers
        from transformers.quantizers.auto import AutoHfQuantizer

        self.real = AutoHfQuantizer.from_config(
            BitsAndBytesConfig(**{QUANTIZATION[quantization]: True}), pre_quantized=False
        )
        self.errors: list[str] = []
        self._skip: list[str] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def param_needs_quantization(self, model: Any, param_name: str, **kwargs: Any) -> bool:
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch
        from transformers.pytorch_utils import Conv1D  # lazy: import nbhw and %load_ext nbhw stay free of transformers

        # lazy: import nbhw and %load_ext nbhw stay free of transformers
        from transformers.quantizers.quantizers_utils import should_convert_module

        module_name, _, leaf = param_name.rpartition(".")
        module = model.get_submodule(module_name)
        if leaf == "bias" or not (type(module) is torch.nn.Linear or isinstance(module, Conv1D)):
            return False
        if self._skip is None:
            cfg = self.real.quantization_config
            keep = list(getattr(model, "_keep_in_fp32_modules", None) or [])
            self._skip = self.real.get_modules_to_not_convert(model, cfg.llm_int8_skip_modules, keep)
        return bool(should_convert_module(module_name, self._skip))

    def param_element_size(self, model: Any, param_name: str, param: Any) -> float:
        size = self.real.quantized_element_size
        if size is not None and self.param_needs_quantization(model, param_name):
            return float(size)
        return float(param.element_size())

    def validate_environment(self, *args: Any, **kwargs: Any) -> None:
        try:
            self.real.validate_environment(*args, **kwargs)
        except ImportError:
            pass  # bitsandbytes missing: the dry run says so
        except Exception as exc:
            self.errors.append(f"quantization: {type(exc).__name__}: {' '.join(str(exc).split())}")
