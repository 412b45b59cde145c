"""What a dry run of generate() is made of (:mod:`nbhw.core.plan.run`): the meta build with ``from_pretrained``'s
dtype plan, the generation config and the cache generate() itself makes, the caller's inputs (token ids, the
tokenizer's attention_mask, encoder and multimodal inputs), and the notes on what a dry run can't see."""

from __future__ import annotations

import contextlib
from collections.abc import Hashable
from typing import Any

from nbhw.core.hardware.environment import variable_set
from nbhw.core.hf import dryrun, meta_build, offloading


def _torch_dtype(dtype: Any) -> Any:
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def dtype_plan(model: Any, dtype: Any) -> dict[str, Any]:
    """The {pattern: dtype} plan ``from_pretrained(dtype=...)`` applies to this model (``_get_dtype_plan``)."""
    return dict(model._get_dtype_plan(_torch_dtype(dtype)))


def apply_dtype_plan(model: Any, dtype: Any) -> list[str]:
    """Cast the meta model's tensors as ``from_pretrained`` loads them; returns the names kept in another dtype.

    ``from_pretrained`` matches each checkpoint key against the plan's patterns with ``build_glob_alternation`` and
    ``re.search`` (core_model_loading.convert_and_load_state_dict_in_model); the same matcher runs here on the
    model's own state-dict keys (checkpoint keys after renaming are the model's keys). ``from_config(dtype=...)``
    alone does not apply it: that is why float16 T5 was planned 20 % small (every ``wo`` stays float32).
    """
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.core_model_loading import build_glob_alternation

    plan = dtype_plan(model, dtype)
    if not plan:
        return []
    pattern, group_to_glob, _ = build_glob_alternation(list(plan))
    kept = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        found = pattern.search(name)
        if found is None or found.lastgroup is None or not tensor.is_floating_point():
            continue
        target = plan[group_to_glob[found.lastgroup]]
        if tensor.dtype != target:
            tensor.data = tensor.data.to(target)
            kept.append(name)
    return kept


def build(config: Any, *, dtype: str, auto_name: str, attn_implementation: str | None) -> meta_build.MetaBuild:
    """The model ``from_pretrained(dtype=dtype)`` would hold, on the meta device: a meta build plus the dtype plan."""
    found = meta_build.build(config, dtype=dtype, attn_implementation=attn_implementation, auto_name=auto_name)
    if found.ok and found.model is not None and dtype != "auto":
        with meta_build.quiet():
            apply_dtype_plan(found.model, dtype)
        found.model.eval()
    return found


def generation_config(model: Any, **options: Any) -> Any:
    """generate()'s own merge of the model's generation config with the caller's options."""
    config, _ = model._prepare_generation_config(None, **options)
    return config


def new_cache(model: Any, gen: Any, model_kwargs: dict[str, Any], batch: int, max_cache_length: int) -> Any:
    """The cache generate() creates for this model and generation config; None when the model makes none."""
    mode = gen.get_generation_mode()
    model._prepare_cache_for_generation(offloading.made_on_device(gen), model_kwargs, mode, batch, max_cache_length)
    offloading.turn_on_offloading(model_kwargs.get("cache"), gen)
    return model_kwargs.get("cache")


def cache_objects(cache: Any) -> list[Any]:
    if cache is None:
        return []
    if hasattr(cache, "self_attention_cache"):
        return [cache.self_attention_cache, cache.cross_attention_cache]
    return [cache]


def layer_classes(cache: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for part in cache_objects(cache):
        for layer in getattr(part, "layers", []):
            if dryrun.storage_bytes(dryrun.tensors_of(layer)) > 16:  # layers that hold more than their window scalar
                counts[type(layer).__name__] = counts.get(type(layer).__name__, 0) + 1
    return counts


def state_tensors(cache: Any) -> list[Any]:
    """Conv / recurrent states of linear-attention and state-space layers (fixed size whatever the context)."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    out: list[Any] = []
    for part in cache_objects(cache):
        for layer in getattr(part, "layers", []):
            for states in (getattr(layer, "conv_states", None), getattr(layer, "recurrent_states", None)):
                if isinstance(states, dict):
                    out += [t for t in states.values() if isinstance(t, torch.Tensor)]
    return out


def cache_parts(cache: Any) -> tuple[int, int, int]:
    """(held, of which state, of which cross-attention) bytes of a cache object, each storage once."""
    if cache is None:
        return 0, 0, 0
    held = dryrun.storage_bytes(dryrun.tensors_of(cache))
    cross = 0
    if hasattr(cache, "cross_attention_cache"):
        cross = dryrun.storage_bytes(dryrun.tensors_of(cache.cross_attention_cache))
    return held, dryrun.storage_bytes(state_tensors(cache)), cross


def fixed_encoder_length(model: Any) -> int | None:
    """The encoder length of a speech encoder that always takes one padded window (Whisper: 1,500), else None."""
    if getattr(model, "main_input_name", None) == "input_features":
        value = getattr(model.config, "max_source_positions", None)
        return int(value) if isinstance(value, int) else None
    return None


def default_encoder_tokens(model: Any, context: int) -> int:
    """Encoder positions when none are named: speech encoders take their fixed window, text encoders ``context``."""
    fixed = fixed_encoder_length(model)
    return fixed if fixed is not None else context


def encoder_inputs(model: Any, batch: int, tokens: int, dev: Any) -> Any:
    """The encoder's main input at ``tokens`` positions: token ids, or log-mel frames (2 per position)."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    if model.main_input_name == "input_features":
        fixed = int(model.config.max_source_positions)
        if tokens != fixed:
            raise ValueError(f"this encoder takes exactly {fixed:,} positions (a padded 30 s window), not {tokens:,}")
        return torch.zeros(batch, model.config.num_mel_bins, 2 * tokens, dtype=model.dtype, device=dev)
    return torch.zeros(batch, tokens, dtype=torch.long, device=dev)


def run_notes(model: Any, target: str, kernels: dict[str, int], devices: int) -> list[str]:
    from transformers.generation.utils import GenerationMixin  # lazy: import nbhw and %load_ext nbhw stay free of it

    notes = []
    if type(model).generate is not GenerationMixin.generate:
        owner = next(c.__name__ for c in type(model).__mro__ if "generate" in vars(c))
        notes.append(
            f"{owner}.generate() pre-processes inputs before GenerationMixin's loop; that part is not "
            "dry-run (for Whisper: one copy of the log-mel input)"
        )
    if target == "cpu" and kernels.get("cpu_flash"):
        notes.append(
            "CPU flash attention's per-thread scratch (block buffers allocated inside the kernel) is not seen "
            "by any tensor-level tracker"
        )
    if kernels.get("math"):
        notes.append("attention runs on SDPA's math path on this target: every score matrix is materialised")
    if devices > 1:
        notes.append("accelerate's copy of the model's outputs back to the first device is not counted")
    return notes


def cache_notes(cache: Any) -> list[str]:
    """What the one decode step can't show of the cache generate() made (a quantized or offloaded cache)."""
    layers = [layer for part in cache_objects(cache) for layer in getattr(part, "layers", [])]
    residual = next((layer.residual_length for layer in layers if hasattr(layer, "residual_length")), None)
    notes = []
    if residual is not None:
        notes.append(
            f"the quantized cache keeps up to {residual} recent tokens (residual_length) in full precision before "
            "quantizing them; the decode step measured holds one, so the cache reaches up to that many tokens' "
            "full-precision keys and values more between flushes"
        )
    if any(getattr(part, "offloading", False) for part in cache_objects(cache)):
        notes.append(
            "the offloaded cache's host copies are counted at their tensors' size; pinned host memory (what a "
            "non_blocking copy to the CPU lands in) rounds each block up to a power of two and keeps freed blocks"
        )
    return notes


def attention_mask(batch: int, tokens: int, padding: str) -> Any:
    """The attention_mask a tokenizer gives generate() for ``batch`` prompts of up to ``tokens`` tokens (CPU, int64).

    "none": all ones. "left": the first prompt is the longest, every other one token shorter, padded on the left
    (the masks transformers builds from it are the same size whatever the amount of padding); at batch 1 or with
    one-token prompts nothing is padded.
    """
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    mask = torch.ones(batch, tokens, dtype=torch.long)
    if padding == "left" and tokens > 1:
        mask[1:, 0] = 0
    return mask


def extra_inputs(inputs: tuple[tuple[str, Any], ...], dev: Any, dtype: Any) -> dict[str, Any]:
    """Extra generate() inputs named by shape (e.g. pixel_values), as zeros on the run's device."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    out: dict[str, Any] = {}
    for name, spec in inputs:
        shape, kind = spec if len(spec) == 2 and isinstance(spec[1], torch.dtype) else (spec, dtype)
        out[name] = torch.zeros(*shape, dtype=kind, device=dev)
    return out


def device_labels(device_map: dict[str, Hashable]) -> list[Hashable]:
    """Every device a run may count on: the device_map's values, in order, and the execution device."""
    return list(dict.fromkeys([*device_map.values(), dryrun.execution_device(device_map)]))


_DISABLE_CHECKS = "TRANSFORMERS_DISABLE_TORCH_CHECK"


def no_value_checks() -> contextlib.AbstractContextManager[None]:
    """transformers' ``torch_compilable_check`` compares tensor values (image tokens vs features): meta has none.

    transformers documents TRANSFORMERS_DISABLE_TORCH_CHECK=1 to skip those checks; it is read at call time, so it
    is set only for the dry run (process-wide: a concurrent real forward skips its checks for that long).
    """
    return variable_set(_DISABLE_CHECKS, "1")
