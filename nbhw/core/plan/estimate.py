"""Memory estimate from a model built on the meta device: exact weights, largest layer, KV cache, training.

Sizes come from the libraries: transformers' ``compute_module_sizes`` (tied weights once, quantized weights at the
quantizer's element size), accelerate's ``get_max_layer_size`` and ``estimate_training_usage``, and the KV-cache
layout transformers' own caches use (``get_layer_types_and_kwargs``, ``get_head_shapes``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Cache layer kinds, in transformers' cache_utils words: which grow with every token, which stop at a window.
GROWING = {"full_attention", "indexed_attention", "hybrid"}
WINDOWED = {"sliding_attention", "chunked_attention", "hybrid_sliding"}
FIXED = {"conv", "linear_attention", "dummy"}


@dataclass
class KvLayer:
    """One decoder layer's KV cache: bytes per token (keys + values), and the token count it stops growing at."""

    bytes_per_token: int
    window: int | None = None


@dataclass
class Estimate:
    """What the weights, the KV cache and training take, in the plan's dtype."""

    dtype: str
    parameters: int
    embedding_parameters: int
    parameter_bytes: int
    buffer_bytes: int
    largest_layer_bytes: int
    largest_layer: list[str]
    kv_layers: list[KvLayer] = field(default_factory=list)
    kv_note: str | None = None
    training: dict[str, int] = field(default_factory=dict)
    training_precision: str = "bfloat16"
    quantization: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        """Parameters and buffers: what the loaded model holds."""
        return self.parameter_bytes + self.buffer_bytes

    @property
    def non_embedding_parameters(self) -> int:
        """Parameters outside the input embedding (the figure model cards quote as 'non-embedding')."""
        return self.parameters - self.embedding_parameters

    @property
    def training_peak(self) -> int:
        """accelerate's 'Training using Adam' figure: the largest of its stages (batch size 1, no activations)."""
        return max(self.training.values(), default=0)

    @property
    def training_total(self) -> int:
        """accelerate's weights + gradients + optimizer states, held together as they are during a step."""
        return sum(v for k, v in self.training.items() if k in {"model", "gradients", "optimizer"})

    def kv_cache_bytes(self, tokens: int = 1000) -> int | None:
        """KV-cache bytes for ``tokens`` tokens of one sequence; None when the layout is unknown."""
        if not self.kv_layers:
            return None
        return sum(layer.bytes_per_token * min(tokens, layer.window or tokens) for layer in self.kv_layers)

    @property
    def kv_cache_per_1k_tokens(self) -> int | None:
        """KV-cache bytes per 1,000 tokens of one sequence."""
        return self.kv_cache_bytes(1000)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (bytes as ints)."""
        return {
            "dtype": self.dtype,
            "quantization": self.quantization,
            "parameters": self.parameters,
            "non_embedding_parameters": self.non_embedding_parameters,
            "parameter_bytes": self.parameter_bytes,
            "buffer_bytes": self.buffer_bytes,
            "total_bytes": self.total_bytes,
            "largest_layer_bytes": self.largest_layer_bytes,
            "largest_layer": self.largest_layer,
            "kv_cache_per_1k_tokens": self.kv_cache_per_1k_tokens,
            "kv_cache_layers": len([k for k in self.kv_layers if k.bytes_per_token]),
            "kv_note": self.kv_note,
            "training": dict(self.training),
            "training_peak": self.training_peak,
            "training_total": self.training_total,
            "training_precision": self.training_precision,
            "notes": list(self.notes),
        }


def _element_size(dtype: str) -> int:
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    return int(getattr(torch, dtype).itemsize)


def _head_dims(layer_config: Any, num_kv_heads: int, head_dim: int) -> int:
    """Key + value width of one token in one layer (MLA models cache different key and value sizes)."""
    qk = getattr(layer_config, "qk_head_dim", None)
    if qk is not None:
        heads = int(layer_config.num_attention_heads)
        return heads * (int(qk) + int(getattr(layer_config, "v_head_dim", None) or qk))
    return 2 * num_kv_heads * head_dim


def kv_layers(config: Any, dtype: str) -> tuple[list[KvLayer], str | None]:
    """Each decoder layer's KV cache, by the rules transformers' DynamicCache uses; a note when something is off."""
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.cache_utils import get_layer_types_and_kwargs

    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.configuration_utils import get_head_shapes

    try:
        text = config.get_text_config(decoder=True)
        types, kwargs = get_layer_types_and_kwargs(text)
        heads, dims = get_head_shapes(text)
        per_layer = list(text.per_layer_config)
    except Exception as exc:
        return (
            [],
            f"KV cache not estimated: transformers' cache rules can't read this config ({type(exc).__name__}: {exc})",
        )
    size = _element_size(dtype)
    layers, unknown, fixed = [], set(), 0
    for i, (kind, extra) in enumerate(zip(types, kwargs, strict=False)):
        n_heads = heads[i] if isinstance(heads, list) else heads
        dim = dims[i] if isinstance(dims, list) else dims
        per_token = _head_dims(per_layer[i], int(n_heads), int(dim)) * size
        if kind in GROWING:
            layers.append(KvLayer(per_token))
        elif kind in WINDOWED:
            # DynamicSlidingWindowLayer keeps the last sliding_window - 1 tokens.
            window = int(extra.get("sliding_window") or 0)
            layers.append(KvLayer(per_token, window - 1 if window > 1 else None))
        else:
            fixed += kind in FIXED
            unknown |= set() if kind in FIXED else {kind}
            layers.append(KvLayer(0))
    notes = []
    if fixed:
        notes.append(f"{fixed} layers keep a fixed-size state instead of a per-token cache")
    if unknown:
        notes.append(f"layers of type {', '.join(sorted(unknown))} are not counted")
    if getattr(config, "is_encoder_decoder", False):
        notes.append("decoder self-attention only; cross-attention adds a cache per input token")
    return layers, "; ".join(notes) or None


def training_usage(parameters: int, dtype: str) -> tuple[dict[str, int], str]:
    """accelerate's Adam estimate for full fine-tuning in mixed precision, from the float32 size of the weights."""
    # lazy: import nbhw and %load_ext nbhw stay free of accelerate
    from accelerate.commands.estimate import estimate_training_usage

    precision = "float16" if dtype == "float16" else "bfloat16"
    usage = estimate_training_usage(parameters * 4, precision)
    return {k: int(v) for k, v in usage.items()}, precision


def _embedding_parameters(model: Any) -> int:
    try:
        embeddings = model.get_input_embeddings()
    except (NotImplementedError, AttributeError):
        return 0
    return sum(p.numel() for p in embeddings.parameters()) if embeddings is not None else 0


def estimate(
    model: Any,
    config: Any,
    dtype: str,
    *,
    quantizer: Any = None,
    quantization: str | None = None,
    generative: bool = True,
) -> Estimate:
    """The estimate for a meta-device ``model`` built in ``dtype`` (``quantizer``: transformers' sizes per weight)."""
    # lazy: import nbhw and %load_ext nbhw stay free of accelerate
    from accelerate.utils.modeling import get_max_layer_size

    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.integrations.accelerate import compute_module_sizes

    sizes, _ = compute_module_sizes(model, quantizer)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    parameters = sum(p.numel() for p in model.parameters())
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    top = list(model.named_parameters(recurse=False)) + list(model.named_children())
    top += list(model.named_buffers(recurse=False))
    largest, names = get_max_layer_size(top, sizes, no_split)
    kv, kv_note = kv_layers(config, dtype) if generative else ([], "no KV cache: not a generative model")
    training, precision = training_usage(parameters, dtype)
    return Estimate(
        dtype=dtype,
        parameters=parameters,
        embedding_parameters=_embedding_parameters(model),
        parameter_bytes=int(sizes[""]) - buffers,
        buffer_bytes=buffers,
        largest_layer_bytes=int(largest),
        largest_layer=list(names),
        kv_layers=kv,
        kv_note=kv_note,
        training=training,
        training_precision=precision,
        quantization=quantization,
    )
