"""Weight bytes of a model quantized with any method, without the method's package: for the advice and the plan.

:class:`SizingQuantizer` stands in for the method's quantizer where transformers sizes a model
(``compute_module_sizes``, which a plan's estimate and placement call): a weight is quantized by the rule the
quantizers apply before loading (an ``nn.Linear`` / ``Conv1D`` not among ``get_modules_to_not_convert``), at
transformers' own ``quantized_element_size`` where the quantizer states one, else at the bits the config names, plus
the scales the format stores beside the packed weights (written from each format: transformers' sizes leave them
out, which misses bitsandbytes' 4-bit absmax by about 7 %). Every figure says which of these it used.
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass
from typing import Any

from nbhw.core.advice.quantization_gates import DOCS
from nbhw.core.advice.quantization_methods import classes
from nbhw.core.cache import Recent
from nbhw.core.hf import meta_build
from nbhw.core.hf.module_sizes import module_sizes

BNB_BLOCK = 64  # bitsandbytes' default 4-bit blocksize
QUANTO_GROUP = 128  # optimum-quanto's group size for int4 / int2
# Bits per weight of formats whose config names none, from each format's documentation.
FORMAT_BITS = {
    "fp8": 8.0, "fbgemm_fp8": 8.0, "mxfp8": 8.0, "nvfp4": 4.0, "mxfp4": 4.0, "fouroversix": 4.0, "fp_quant": 4.0,
    "bitnet": 2.0,
}  # fmt: skip
NO_SIZE = {"gguf", "vptq", "compressed-tensors", "quark"}  # the bits come from the checkpoint, not the config
_BUILDS: Recent[meta_build.MetaBuild] = Recent(4)


def stated_bits(key: str, config: Any) -> tuple[float, str] | None:
    """Bits per quantized weight from the config's own fields, else the format's documented width."""
    for attr in ("bits", "nbits", "num_bits"):
        value = getattr(config, attr, None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value), f"the config's {attr}={value}"
    nested = (getattr(config, "quant_config", None) or {}).get("weight_quant_params", {})  # hqq keeps its own dict
    if isinstance(nested, dict) and isinstance(nested.get("nbits"), int):
        return float(nested["nbits"]), f"the config's nbits={nested['nbits']}"
    weights = getattr(config, "weights", None)
    widths = {"int8": 8, "float8": 8, "int4": 4, "int2": 2}
    if isinstance(weights, str) and weights in widths:
        return float(widths[weights]), f"the config's weights={weights!r}"
    if key in {"bitsandbytes_4bit", "bitsandbytes_8bit"}:
        return (4.0, "load_in_4bit") if key.endswith("4bit") else (8.0, "load_in_8bit")
    if key == "aqlm":
        bits = config.num_codebooks * config.nbits_per_codebook / config.in_group_size
        return float(bits), "num_codebooks × nbits_per_codebook / in_group_size"
    if key in FORMAT_BITS:
        return FORMAT_BITS[key], f"{DOCS}: the {key} format stores {FORMAT_BITS[key]:g}-bit weights"
    return None


def scale_bytes(key: str, config: Any, shape: tuple[int, ...], dtype_bytes: int) -> tuple[float, str] | None:
    """Bytes of the scales one quantized weight of ``shape`` keeps beside its packed values, by the format."""
    numel = 1
    for n in shape:
        numel *= n
    inputs = shape[-1] if shape else 1
    if key == "bitsandbytes_4bit":
        if getattr(config, "bnb_4bit_use_double_quant", False):
            blocks = -(-numel // BNB_BLOCK)
            nested = blocks + 4 * -(-blocks // 256) + (256 + 16) * 4
            return nested, "bitsandbytes double quant: uint8 absmax per 64 weights, float32 per 256 blocks"
        return numel // BNB_BLOCK * 4 + 16 * 4, "bitsandbytes: float32 absmax per 64 weights"
    if key == "bitsandbytes_8bit":
        return 4 * numel / inputs, "bitsandbytes LLM.int8: a float32 scale per output row"
    if key == "quanto":
        weights = getattr(config, "weights", "int8")
        if weights in {"int8", "float8"}:
            return dtype_bytes * numel / inputs, f"quanto {weights}: a scale per output row in the model's dtype"
        return 2 * dtype_bytes * numel / QUANTO_GROUP, f"quanto {weights}: scale and shift per 128 weights"
    if key == "torchao" and type(getattr(config, "quant_type", None)).__name__ == "Int8WeightOnlyConfig":
        return 5 * numel / inputs, "torchao Int8WeightOnly: a float32 scale and an int8 zero point per output row"
    return None


class SizingQuantizer:
    """A method's quantizer as ``compute_module_sizes`` sees it, usable without the method's package."""

    def __init__(self, key: str, config: Any) -> None:
        qcls, _ = classes(key)
        self.key = key
        self.config = config
        try:
            self.real: Any = qcls(config, pre_quantized=False)
        except Exception:
            # Only its sizing and skip rules are read, so a quantizer whose __init__ needs its package (or refuses
            # quantizing on load) is made without it.
            self.real = object.__new__(qcls)
            self.real.quantization_config, self.real.pre_quantized = config, False
        self.element, self.how = self._element_size()
        self.scales: set[str] = set()
        self.errors: list[str] = []  # kept for the plan, which reports the device_map checks transformers makes
        self._skip: list[str] | None = None
        # per model (by id, with a weak reference that says it is still that model), the answer for each parameter:
        # transformers sizes a model three times for one placement
        self._needs: dict[int, tuple[weakref.ref[Any], dict[str, bool]]] = {}

    def _element_size(self) -> tuple[float | None, str]:
        try:
            stated = self.real.quantized_element_size  # transformers' own figure, where the quantizer has one
        except Exception:
            stated = None
        if stated is not None:
            return float(stated), f"transformers' quantized_element_size ({float(stated):g} B per weight)"
        bits = stated_bits(self.key, self.config)
        if bits is None or self.key in NO_SIZE:
            return None, "the bits per weight depend on the checkpoint"
        return bits[0] / 8, f"{bits[0]:g} bits per weight ({bits[1]})"

    def sizing_key(self) -> tuple[str, str, float | None, str]:
        """What this quantizer's sizes depend on (method, config as it now stands, element size): two quantizers with
        the same key size every model alike (:mod:`nbhw.core.hf.module_sizes` keeps the sizes by it)."""
        config = self.config.to_json_string() if self.config is not None else ""
        return self.key, config, self.element, type(self.real).__name__

    @property
    def sized(self) -> bool:
        """Whether the quantized bytes can be computed from the config."""
        return self.element is not None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def _skipped(self, model: Any) -> list[str]:
        if self._skip is None:
            cfg = self.config
            skip = getattr(cfg, "llm_int8_skip_modules", None) or getattr(cfg, "modules_to_not_convert", None)
            keep = list(getattr(model, "_keep_in_fp32_modules", None) or [])
            self._skip = list(self.real.get_modules_to_not_convert(model, skip, keep))
        return self._skip

    def param_needs_quantization(self, model: Any, param_name: str, **kwargs: Any) -> bool:
        ref, known = self._needs.get(id(model), (None, {}))
        if ref is None or ref() is not model:
            known = {}
            self._needs[id(model)] = (weakref.ref(model), known)
        if param_name not in known:
            known[param_name] = self._needs_quantization(model, param_name)
        return known[param_name]

    def _needs_quantization(self, model: Any, param_name: str) -> bool:
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch
        from transformers.pytorch_utils import Conv1D  # lazy: import nbhw and %load_ext nbhw stay free of transformers

        # lazy: import nbhw and %load_ext nbhw stay free of transformers
        from transformers.quantizers.quantizers_utils import should_convert_module

        module_name, _, leaf = param_name.rpartition(".")
        module = model.get_submodule(module_name)
        linear = type(module) is torch.nn.Linear or (isinstance(module, Conv1D) and self.key != "torchao")
        dequantized = bool(getattr(self.real.quantization_config, "dequantize", False))
        if leaf != "weight" or not linear or not self.sized or dequantized:
            return False
        return bool(should_convert_module(module_name, self._skipped(model)))

    def param_element_size(self, model: Any, param_name: str, param: Any) -> float:
        if self.element is None or not self.param_needs_quantization(model, param_name):
            return float(param.element_size())
        extra = scale_bytes(self.key, self.config, tuple(param.shape), param.element_size())
        if extra is None:
            return self.element
        self.scales.add(extra[1])
        return float(self.element + extra[0] / max(int(param.numel()), 1))

    def validate_environment(self, *args: Any, **kwargs: Any) -> None:
        """transformers calls this while sizing a device_map; the method's real checks are the gates' to run."""


@dataclass
class Size:
    """Weight bytes for the model with this method, and how they were computed."""

    bytes: int | None
    source: str


def _base_build(model_config: Any, dtype: str) -> meta_build.MetaBuild:
    key = (f"{type(model_config).__name__}:{model_config.to_json_string(use_diff=False)}", dtype)
    auto = meta_build.auto_class_name(model_config)
    return _BUILDS.get(key, lambda: meta_build.build(model_config, dtype=dtype, auto_name=auto))


def weight_bytes(key: str, model_config: Any, config: Any, dtype: str, quantized: bool = True) -> Size:
    """The model's weight bytes with ``key`` (transformers' sizing over a :class:`SizingQuantizer`)."""
    with meta_build.quiet():
        built = _base_build(model_config, dtype)
        if not built.ok or built.model is None:
            return Size(None, f"the meta build failed: {built.error}")
        if not quantized:
            sizes, _ = module_sizes(built.model)
            return Size(int(sizes[""]), f"unquantized {dtype}: transformers dequantizes this method on the device")
        sizer = SizingQuantizer(key, copy.deepcopy(config))
        if not sizer.sized:
            return Size(None, sizer.how + ": not computable from the config")
        sizes, _ = module_sizes(built.model, sizer)
    scales = "; + " + ", ".join(sorted(sizer.scales)) if sizer.scales else "; scales not counted"
    return Size(int(sizes[""]), f"{sizer.how} on the linear layers transformers converts{scales}")


# ---------------------------------------------------------------- what a loaded model really holds


def loaded_weight_bytes(model: Any) -> int:
    """Bytes a loaded model's parameters and buffers hold, packed storage counted as stored.

    Tensor subclasses (torchao, quanto) count their inner tensors (``__tensor_flatten__``); bitsandbytes keeps its
    absmax / SCB beside the packed weight (``quant_state``, tensor attributes), so those count too. A storage shared
    by two tensors counts once.
    """
    seen: set[tuple[int, int]] = set()
    return sum(_tensor_bytes(t, seen) for _, t in [*model.named_parameters(), *model.named_buffers()])


def _tensor_bytes(t: Any, seen: set[tuple[int, int]]) -> int:
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    if _is_wrapper(t):
        names, _ = t.__tensor_flatten__()
        return sum(_tensor_bytes(getattr(t, n), seen) for n in names)
    total = _storage_bytes(t, seen)
    for value in list(getattr(t, "__dict__", {}).values()):
        if isinstance(value, torch.Tensor):
            total += _tensor_bytes(value, seen)
        elif hasattr(value, "as_dict"):  # a bitsandbytes QuantState (absmax, code, nested state)
            total += sum(_storage_bytes(v, seen) for v in _quant_state_tensors(value))
    return total


def _is_wrapper(t: Any) -> bool:
    # lazy: import nbhw and %load_ext nbhw stay free of torch
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return bool(is_traceable_wrapper_subclass(t))


def _quant_state_tensors(state: Any) -> list[Any]:
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    found = [v for v in vars(state).values() if isinstance(v, torch.Tensor)]
    nested = getattr(state, "state2", None)
    return found + (_quant_state_tensors(nested) if nested is not None else [])


def _storage_bytes(t: Any, seen: set[tuple[int, int]]) -> int:
    storage = t.untyped_storage()
    key = (storage.data_ptr(), storage.nbytes())
    if key in seen:
        return 0
    seen.add(key)
    return int(storage.nbytes())
