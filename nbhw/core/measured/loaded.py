"""What a loaded transformers model really holds, read from the model itself (``nbhw.loaded()``).

Everything comes from what transformers and accelerate set on the model: ``config._attn_implementation`` (and each
sub-config's), ``hf_device_map``, ``hf_quantizer``, the parameters' and buffers' dtypes and devices, the dtype plan
``from_pretrained`` applied (``_get_dtype_plan``: the modules kept in float32), and the forwards ``use_kernels``
swapped (the ``kernels`` library replaces ``module.forward`` on each layer marked ``kernel_layer_name``). Bytes per
device are summed over the parameters and buffers (and a quantized weight's own side tensors, such as
bitsandbytes' quant_state), each storage once (tied weights, views); a tensor on the meta
device is named for where accelerate keeps it (``disk``, or ``cpu`` when offloaded there) at its loaded size.
Nothing here imports transformers: a model exists only if the user's code imported it.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from nbhw.core import render
from nbhw.core.hf.meta_build import is_hub_kernel

DISK = "disk"
META = "meta"
HALF = ("float16", "bfloat16")
UNKNOWN = "unknown"  # what a cell asked for, when nbhw did not see the cell


def transformers_model_class() -> Any | None:
    """transformers' PreTrainedModel if the user's code imported transformers (never imported here)."""
    module = sys.modules.get("transformers")
    return None if module is None else getattr(module, "PreTrainedModel", None)


def is_model(value: object) -> bool:
    """Whether ``value`` is a loaded transformers model."""
    base = transformers_model_class()
    return base is not None and isinstance(value, base)


def models_in(namespace: Mapping[str, Any]) -> dict[str, Any]:
    """Variable -> model for every transformers model a namespace holds, each once: its own names first, then the
    ``.model`` of a pipeline or a Trainer held there ("pipe.model"), and the model a peft model wraps
    ("model.get_base_model()")."""
    base = transformers_model_class()
    if base is None:
        return {}
    found: dict[str, Any] = {}
    holders: list[tuple[str, Any]] = []
    seen: set[int] = set()
    for name, value in list(namespace.items()):
        if name.startswith("_"):
            continue
        if isinstance(value, base):
            if id(value) not in seen:
                found[name] = value
                seen.add(id(value))
        elif _holds_model(value):
            holders.append((name, value))
    for name, value in holders:
        inner, path = _held(value)
        if isinstance(inner, base) and id(inner) not in seen:
            found[f"{name}.{path}"] = inner
            seen.add(id(inner))
    return found


def _held(value: Any) -> tuple[Any, str]:
    """The transformers model a holder keeps, and how it is reached from it."""
    if _is_peft(value):
        return value.get_base_model(), "get_base_model()"
    return getattr(value, "model", None), "model"


def _is_peft(value: object) -> bool:
    return _is_peft_class(type(value))


def _is_peft_class(cls: type) -> bool:
    return str(cls.__module__).startswith("peft.") and callable(getattr(cls, "get_base_model", None))


def _holds_model(value: object) -> bool:
    cls: Any = type(value)
    return _holds_model_class(cls)


@functools.lru_cache(maxsize=1024)
def _holds_model_class(cls: type) -> bool:
    # Only the classes users keep a model in (a pipeline, a Trainer, trl's trainers): no attribute of any other
    # object is read, so no property or __getattr__ of the user's objects runs. By class, once (the cell hook asks
    # for every variable after every cell).
    if _is_peft_class(cls):  # peft's PeftModel around the transformers model (LoRA, QLoRA)
        return True
    return cls.__name__.endswith(("Pipeline", "Trainer")) and str(cls.__module__).startswith(("transformers.", "trl."))


# ---------------------------------------------------------------- the facts


@dataclass(frozen=True)
class DeviceBytes:
    """The bytes of the model's tensors on one device."""

    device: str  # "cpu", "cuda:0", "disk", "meta"
    bytes: int
    tensors: int
    offloaded: bool = False  # meta tensors accelerate keeps on this device (disk, or cpu for a GPU model)

    @property
    def note(self) -> str:
        if self.device == DISK:
            return "offloaded to disk: meta tensors, counted at their loaded size"
        if self.device == META:
            return "meta tensors with no device in hf_device_map: no weights behind them"
        if self.offloaded:
            return f"offloaded to {self.device} (accelerate's hooks move them per forward), at their loaded size"
        return ""


@dataclass(frozen=True)
class Attention:
    """The attention implementation set on the model's config ("") or on one of its sub-configs."""

    config: str  # "" for the model's own config, else the sub-config's key ("text_config")
    implementation: str | None

    @property
    def hub_kernel(self) -> bool:
        return self.implementation is not None and is_hub_kernel(self.implementation)

    @property
    def words(self) -> str:
        name = str(self.implementation)
        return f"{name} (a Hub kernel)" if self.hub_kernel else name


@dataclass(frozen=True)
class KernelSwap:
    """Layers ``use_kernels`` looked at: the layer name kernels maps, how many modules, and what runs now."""

    layer: str  # the kernel_layer_name ("RMSNorm")
    modules: int
    kernel: str | None  # the forward that runs instead ("liger_kernels.LigerRMSNorm.forward"); None: kept its own


@dataclass(frozen=True)
class Quantization:
    """The quantization really applied: transformers' quantizer and the modules it replaced."""

    method: str
    replaced: dict[str, int]  # module class -> count (Linear4bit: 14)


@dataclass(frozen=True)
class Float32Modules:
    """In a float16 / bfloat16 model, the modules whose parameters stayed float32, and transformers' reason."""

    modules: tuple[str, ...]
    kept_by: tuple[str, ...]  # the dtype plan's patterns from_pretrained applied ("wo")


@dataclass(frozen=True)
class LoadedModel:
    """One loaded model, as it really is."""

    variable: str
    model_class: str
    name_or_path: str
    parameters: int
    dtype: str
    dtype_bytes: dict[str, int]  # dtype -> bytes of the parameters and buffers in it
    float32: Float32Modules | None
    attention: tuple[Attention, ...]
    supports_sdpa: bool
    asked_attention: str | None  # what the loading cell passed (None: nothing), UNKNOWN when nbhw did not see it
    use_kernels: bool
    kernels: tuple[KernelSwap, ...]
    device_map: dict[str, str] | None  # hf_device_map (None: transformers sets none for one device)
    devices: tuple[DeviceBytes, ...]
    quantization: Quantization | None
    notes: list[str] = field(default_factory=list)
    # Bytes per device bitsandbytes gave back when it repacked 4-bit weights for a CPU with AVX512-BF16 at their
    # first inference forward (Linear4bit.forward: absmax float32 -> bfloat16); what the weights held as loaded.
    repacked: dict[str, int] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        """Every tensor's bytes, offloaded ones included."""
        return sum(d.bytes for d in self.devices)

    def bytes_on(self, device: str) -> int:
        """The bytes on one device (0 when none)."""
        return sum(d.bytes for d in self.devices if d.device == device)

    @property
    def main_attention(self) -> str | None:
        return self.attention[0].implementation if self.attention else None

    @property
    def silent_fallback(self) -> str | None:
        """The words for transformers' silent sdpa -> eager fallback, when that is what happened."""
        if self.main_attention != "eager" or self.supports_sdpa:
            return None
        why = f"{self.model_class} has no sdpa, so transformers set eager without a word"
        if self.asked_attention is None:
            return f"silent fallback: the cell asked for no attn_implementation (the default is sdpa); {why}"
        if self.asked_attention == UNKNOWN:
            return f"eager: if no attn_implementation was asked for, this is a silent fallback from sdpa; {why}"
        return None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return {
            "variable": self.variable,
            "model_class": self.model_class,
            "name_or_path": self.name_or_path,
            "parameters": self.parameters,
            "dtype": self.dtype,
            "dtype_bytes": dict(self.dtype_bytes),
            "float32_modules": list(self.float32.modules) if self.float32 else [],
            "kept_in_float32_by": list(self.float32.kept_by) if self.float32 else [],
            "attention": {a.config: a.implementation for a in self.attention},
            "hub_kernel_attention": [a.config for a in self.attention if a.hub_kernel],
            "asked_attention": self.asked_attention,
            "silent_fallback": self.silent_fallback,
            "use_kernels": self.use_kernels,
            "kernels": [vars(k) for k in self.kernels],
            "device_map": self.device_map,
            "devices": {d.device: {"bytes": d.bytes, "tensors": d.tensors, "offloaded": d.offloaded}
                        for d in self.devices},
            "total_bytes": self.total_bytes,
            "quantization": None if self.quantization is None else vars(self.quantization),
            "repacked_for_cpu_bytes": dict(self.repacked),
            "notes": list(self.notes),
        }  # fmt: skip


# ---------------------------------------------------------------- reading a model


def _dtype(value: Any) -> str:
    return str(value).removeprefix("torch.")


def _device_word(value: Any, accelerator: str) -> str:
    """hf_device_map's values as torch names devices: a bare index is the accelerator's."""
    return f"{accelerator}:{value}" if isinstance(value, int) else str(value)


def _accelerator(model: Any) -> str:
    devices = {t.device.type for t in chain(model.parameters(), model.buffers())} - {"cpu", META}
    return next(iter(sorted(devices)), "cuda")


def device_map_of(model: Any) -> dict[str, str] | None:
    """``hf_device_map`` with every device as a torch device string (None when transformers set none)."""
    found = getattr(model, "hf_device_map", None)
    if not isinstance(found, Mapping):
        return None
    accelerator = _accelerator(model)
    return {str(k): _device_word(v, accelerator) for k, v in found.items()}


def mapped_device(name: str, device_map: Mapping[str, str] | None) -> str | None:
    """The device_map entry a tensor's name falls under (the longest module prefix)."""
    if not device_map:
        return None
    best: tuple[int, str] | None = None
    for module, device in device_map.items():
        under = module in ("", name) or name.startswith(module + ".")
        if under and (best is None or len(module) > best[0]):
            best = (len(module), device)
    return best[1] if best else None


def _tensors(model: Any) -> Iterator[tuple[str, Any]]:
    # named_parameters / named_buffers give a tied tensor once, under its first name.
    yield from model.named_parameters()
    yield from model.named_buffers()


def _is_tensor(value: object) -> bool:
    return hasattr(value, "untyped_storage") and hasattr(value, "device")


def side_tensors(parameter: Any) -> list[Any]:
    """Tensors a quantized parameter keeps beside its data, outside parameters and buffers: bitsandbytes'
    ``quant_state`` (absmax, code, a nested state) on a 4-bit weight, ``SCB`` on an 8-bit one."""
    if type(parameter).__name__ in ("Parameter", "Tensor"):
        return []
    found: list[Any] = []
    try:
        attributes = list(vars(parameter).values())
    except TypeError:
        return []
    for value in attributes:
        if _is_tensor(value):
            found.append(value)
        elif type(value).__name__ == "QuantState":
            found += _state_tensors(value)
    return found


def _state_tensors(state: Any, depth: int = 0) -> list[Any]:
    found: list[Any] = []
    for value in vars(state).values():
        if _is_tensor(value):
            found.append(value)
        elif type(value).__name__ == "QuantState" and depth < 2:
            found += _state_tensors(value, depth + 1)  # the nested state of double quantization
    return found


def stored_parts(tensor: Any) -> list[Any]:
    """The tensors that hold ``tensor``'s memory: itself, or a wrapper subclass's inner tensors (quanto's
    ``WeightQBytesTensor`` keeps ``_data`` and ``_scale``; the wrapper has no storage of its own to read)."""
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is None:
        return [tensor]
    names, _ = flatten()
    return [part for name in names if _is_tensor(part := getattr(tensor, name, None))]


def _all_tensors(model: Any) -> Iterator[tuple[str, Any]]:
    for name, tensor in _tensors(model):
        parts = stored_parts(tensor)
        for i, part in enumerate(parts):
            yield name if i == 0 else f"{name}.{i}", part
        extras = [extra for extra in side_tensors(tensor) if not any(extra is part for part in parts)]
        for i, extra in enumerate(extras):
            yield f"{name}#{i}", extra


def tensor_bytes(model: Any) -> tuple[DeviceBytes, ...]:
    """Bytes per device over the parameters and buffers, each storage once; meta tensors named for where
    accelerate keeps them, at their loaded size."""
    device_map = device_map_of(model)
    seen: set[tuple[str, int]] = set()
    totals: dict[tuple[str, bool], list[int]] = {}
    for name, tensor in _all_tensors(model):
        if tensor.device.type == META:
            device = mapped_device(name, device_map) or META
            key, nbytes, offloaded = (META, id(tensor)), tensor.numel() * tensor.element_size(), device != META
        else:
            storage = tensor.untyped_storage()
            device, offloaded = str(tensor.device), False
            key, nbytes = (device, storage.data_ptr()), storage.nbytes()
        if key in seen:
            continue
        seen.add(key)
        slot = totals.setdefault((device, offloaded), [0, 0])
        slot[0] += nbytes
        slot[1] += 1
    order = sorted(totals, key=lambda k: (k[0] in (DISK, META), k[0] != "cpu", k[0], k[1]))
    return tuple(DeviceBytes(d, totals[d, o][0], totals[d, o][1], o) for d, o in order)


def _dtype_bytes(model: Any) -> dict[str, int]:
    found: dict[str, int] = {}
    for _, tensor in _all_tensors(model):
        key = _dtype(tensor.dtype)
        found[key] = found.get(key, 0) + tensor.numel() * tensor.element_size()
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


def float32_parameters(model: Any) -> list[str]:
    """The parameters that are float32 (names), whatever the model's dtype."""
    return [name for name, p in model.named_parameters() if _dtype(p.dtype) == "float32"]


def _module_of(parameter: str) -> str:
    return parameter.rpartition(".")[0]


def float32_modules(model: Any) -> Float32Modules | None:
    """In a half-precision model, the modules whose parameters stayed float32 and the dtype plan that kept them."""
    dtype = _dtype(model.dtype)
    if dtype not in HALF:
        return None
    modules = tuple(dict.fromkeys(_module_of(n) for n in float32_parameters(model)))
    if not modules:
        return None
    plan = model._get_dtype_plan(model.dtype)  # transformers' own plan: the patterns from_pretrained applied
    return Float32Modules(modules, tuple(sorted(str(k) for k in plan)))


def attention_of(model: Any) -> tuple[Attention, ...]:
    """The attention set on the model's config and on each sub-config (text_config, vision_config, ...)."""
    config = model.config
    found = [Attention("", getattr(config, "_attn_implementation", None))]
    for key in getattr(config, "sub_configs", None) or {}:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "_attn_implementation"):
            found.append(Attention(str(key), sub._attn_implementation))
    return tuple(found)


def kernel_swaps(model: Any) -> tuple[KernelSwap, ...]:
    """The layers kernels' ``kernelize`` handled: it sets ``module.forward`` to the kernel's forward, or back to
    the module's own when no kernel fits the device (a fallback it only logs)."""
    found: dict[tuple[str, str | None], int] = {}
    for _, module in model.named_modules():
        layer = getattr(type(module), "kernel_layer_name", None)
        forward = vars(module).get("forward")
        func = getattr(forward, "__func__", None)
        if layer is None or func is None:
            continue
        own = func is getattr(type(module), "forward", None)
        kernel = None if own else f"{func.__module__}.{func.__qualname__}"
        found[str(layer), kernel] = found.get((str(layer), kernel), 0) + 1
    return tuple(KernelSwap(layer, n, kernel) for (layer, kernel), n in sorted(found.items(), key=str))


# Modules of torch and transformers are the model's own; a quantizer's come from its library or transformers'
# integrations (bitsandbytes.nn.Linear4bit, transformers.integrations.finegrained_fp8.FP8Linear).
_LIBRARY_MODULES = re.compile(r"^(torch|transformers(?!\.integrations))(\.|$)")


def quantization_of(model: Any) -> Quantization | None:
    """The quantizer transformers applied (``model.hf_quantizer``) and the module classes it put in."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return None
    config = getattr(quantizer, "quantization_config", None)
    found = getattr(config, "quant_method", None)
    method = str(getattr(found, "value", found) or type(quantizer).__name__)  # an enum: its value, "bitsandbytes"
    replaced: dict[str, int] = {}
    for _, module in model.named_modules():
        cls = type(module)
        if module is not model and not _LIBRARY_MODULES.match(cls.__module__):
            replaced[cls.__name__] = replaced.get(cls.__name__, 0) + 1
    return Quantization(str(method), replaced)


def repacked_for_cpu(model: Any) -> dict[str, int]:
    """Per device, the absmax bytes bitsandbytes saved by repacking 4-bit weights for its CPU bf16 kernel."""
    saved: dict[str, int] = {}
    for p in model.parameters():
        state = getattr(p, "quant_state", None)
        absmax = getattr(state, "absmax", None)
        if not getattr(state, "packing_format_for_cpu", False) or absmax is None:
            continue
        device = str(p.device)
        saved[device] = saved.get(device, 0) + absmax.numel() * (4 - absmax.element_size())
    return {d: n for d, n in saved.items() if n}


def inspect(model: Any, variable: str = "model", *, asked_attention: str | None = UNKNOWN) -> LoadedModel:
    """What ``model`` really holds. ``asked_attention``: what its loading cell passed, when nbhw saw that cell."""
    notes = []
    device_map = device_map_of(model)
    if device_map is None:
        notes.append("no hf_device_map: transformers sets it only for a map over more than one device")
    repacked = repacked_for_cpu(model)
    notes += [f"bitsandbytes repacked the 4-bit weights on {d} for this CPU's bf16 kernel at their first forward "
              f"(absmax kept in bfloat16): {n:,} B less than as loaded" for d, n in repacked.items()]  # fmt: skip
    return LoadedModel(
        variable=variable,
        model_class=type(model).__name__,
        name_or_path=str(getattr(model, "name_or_path", "") or ""),
        parameters=sum(p.numel() for p in model.parameters()),
        dtype=_dtype(model.dtype),
        dtype_bytes=_dtype_bytes(model),
        float32=float32_modules(model),
        attention=attention_of(model),
        supports_sdpa=bool(getattr(type(model), "_supports_sdpa", False)),
        asked_attention=asked_attention,
        use_kernels=bool(getattr(model, "use_kernels", False)),
        kernels=kernel_swaps(model),
        device_map=device_map,
        devices=tensor_bytes(model),
        quantization=quantization_of(model),
        notes=notes,
        repacked=repacked,
    )


# ---------------------------------------------------------------- words


def _short_names(names: tuple[str, ...], most: int = 3) -> str:
    """Module names grouped by their pattern (digits as *): 'encoder.block.*.layer.1.DenseReluDense.wo (2)'."""
    groups: dict[str, int] = {}
    for name in names:
        key = re.sub(r"\.\d+\.", ".*.", name)
        groups[key] = groups.get(key, 0) + 1
    shown = [f"{k} ({n})" if n > 1 else k for k, n in list(groups.items())[:most]]
    more = len(groups) - most
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def device_words(devices: tuple[DeviceBytes, ...]) -> str:
    """'cpu 1.7 MiB · disk 0.4 MiB (offloaded)'."""
    parts = []
    for d in devices:
        extra = " (offloaded)" if d.offloaded else ""
        parts.append(f"{d.device} {render.size(d.bytes)}{extra}")
    return " · ".join(parts) or "no tensors"


def rows(m: LoadedModel) -> list[tuple[str, str]]:
    """The facts of one model as (label, words) rows."""
    dtypes = ", ".join(f"{k} {render.size(v)}" for k, v in m.dtype_bytes.items())
    out = [("class", f"{m.model_class} ({m.parameters:,} parameters) from {m.name_or_path or '?'}")]
    out.append(("dtype", f"{m.dtype} (tensors: {dtypes})"))
    if m.float32 is not None:
        kept = f"; transformers' dtype plan keeps {', '.join(m.float32.kept_by)}" if m.float32.kept_by else ""
        out.append(("kept float32", f"{len(m.float32.modules)} modules: {_short_names(m.float32.modules)}{kept}"))
    attention = "; ".join(f"{a.config or 'model'}: {a.words}" for a in m.attention)
    out.append(("attention", attention))
    if m.silent_fallback:
        out.append(("", m.silent_fallback))
    kernels = "; ".join(f"{k.layer} x{k.modules} -> {k.kernel or 'its own forward (no kernel for this device)'}"
                        for k in m.kernels)  # fmt: skip
    out.append(("use_kernels", f"{m.use_kernels}" + (f": {kernels}" if kernels else "")))
    if m.device_map is None:
        out.append(("device_map", "none set (one device)"))
    else:
        where: dict[str, int] = {}
        for device in m.device_map.values():
            where[device] = where.get(device, 0) + 1
        out.append(("device_map", ", ".join(f"{n} entries on {d}" for d, n in where.items())))
    out.append(("bytes", device_words(m.devices) + f" (total {render.size(m.total_bytes)})"))
    out += [("", d.note) for d in m.devices if d.note]
    if m.quantization is None:
        out.append(("quantization", "none"))
    else:
        replaced = ", ".join(f"{n} {c}" for c, n in m.quantization.replaced.items()) or "no module replaced"
        out.append(("quantization", f"{m.quantization.method}: {replaced}"))
    return out
