"""The run planner's core: what loading and generating at ``batch x context`` holds, from transformers' own code.

Nothing here knows an architecture. A dry run takes the meta-device model transformers builds (with the dtype plan
``from_pretrained`` applies: :func:`apply_dtype_plan`), lets ``GenerationMixin._prepare_cache_for_generation``
create the cache ``generate()`` would create, and runs ``generate()``'s own prefill (``GenerationMixin._prefill`` ->
``prepare_inputs_for_generation`` -> forward, with ``logits_to_keep=1`` where the model takes it, as generate()
passes it) and one decode step, on the meta device, measured by torch's ``MemTracker`` per device of the plan's
device_map (see :mod:`nbhw.core.hf.dryrun`). Every byte figure is an allocation the tracker saw.

The prompt comes as a tokenizer gives it: token ids and an attention_mask, held by the caller for the whole run, and
left-padded when the plan says so (``padding``). The mask carries its values on the meta device
(:mod:`nbhw.core.hf.values`), so transformers' own code decides what it decides on a real batch: generate() drops an
all-ones mask, and masking_utils builds the batch x 1 x query x key mask only when something is padded.

:func:`max_context` and :func:`max_batch` search with dry runs: every tracked allocation size is a polynomial in
the batch (degree 1) and the context (degree <= 2, attention scores), so the memory timelines of three dry runs fix
the whole timeline at any size; the answer is then confirmed by a dry run at the next size up.

Around the run: :func:`framework_reserve` (what a backend holds outside tensors, a stated figure with its source)
and :func:`host_load_peak` (host memory while from_pretrained reads the checkpoint).
"""

from __future__ import annotations

import array
import contextlib
import inspect
import itertools
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from nbhw.core.hf import depth, dryrun, meta_build, offloading, values
from nbhw.core.plan import run_depth

# A prefill plus one decode step dispatches 11-16 ops per module whatever the context (measured: Llama-70B 11.7,
# DeepSeek-V3 16.4); a model whose op count grows with the context runs a Python loop over tokens or chunks (the torch
# fallbacks of Mamba's selective scan: 364 per module at 300 tokens). Past this budget the dry run stops and says so.
OPS_PER_MODULE = 300
MIN_OPS = 30_000
LOOP_OPS_PER_MODULE = 60
NO_LIMIT = 1 << 20  # tokens, for a config that names no maximum position (relative or no position embeddings)
ONE_DEVICE: tuple[tuple[str, Hashable], ...] = (("", "cpu"),)
# How a batch's prompts come to generate(), in the words of the plan's ``padding`` argument.
PADDINGS = {
    "left": "left-padded to the longest, as a tokenizer pads a batch for generate()",
    "none": "all the same length, unpadded",
}

# ----------------------------------------------------------------------------------------------- dtype plan


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


# ----------------------------------------------------------------------------------------------- result


@dataclass
class DeviceRun:
    """What one device of the placement holds during the run (the dry run's allocations counted on it)."""

    weight_bytes: int
    cache_bytes: int  # right after the prefill
    cache_decode_bytes: int  # after the decode step that reaches the context
    peak_bytes: int  # the device's highest total over the prefill and the decode step
    largest_block_bytes: int = 0  # the largest block the run made on it (what the allocator's margin is sized by)

    @property
    def held_cache_bytes(self) -> int:
        """The larger of the two cache figures: what the cache takes at its worst."""
        return max(self.cache_bytes, self.cache_decode_bytes)

    @property
    def activation_bytes(self) -> int:
        """The transient part of the device's peak: above its weights and its cache."""
        return max(self.peak_bytes - self.weight_bytes - self.held_cache_bytes, 0)


@dataclass
class RunEstimate:
    """Bytes one generation run holds, all measured on a meta-device dry run of generate()'s own steps."""

    batch: int
    context: int  # tokens per sequence: the prompt plus what is generated (decoder tokens for encoder-decoders)
    prompt_tokens: int
    encoder_tokens: int | None
    weight_bytes: int  # parameters and buffers, with the dtype plan
    cache_bytes: int  # the cache object right after the prefill (a sliding window still holds the whole prompt)
    cache_decode_bytes: int  # the cache object after the decode step that reaches ``context`` tokens
    state_bytes: int  # of cache_bytes: fixed conv / recurrent state (state-space, linear-attention layers)
    cross_cache_bytes: int  # of cache_bytes: cross-attention keys / values (encoder-decoder)
    activation_bytes: int  # the prefill's transient peak above weights + cache (hidden states, scores, logits)
    prefill_peak_bytes: int
    decode_peak_bytes: int
    cache_class: str
    layer_classes: dict[str, int]  # cache layer classes that hold tensors, and how many
    kernels: dict[str, int]  # how the dry run sized attention / grouped_mm (see dryrun.attention_as_on)
    logits_to_keep: int | None
    target: str
    padding: str = "none"  # how the batch's prompts came (PADDINGS)
    devices: dict[Hashable, DeviceRun] = field(default_factory=dict)  # by device_map value (0, 1, "cpu", ...)
    not_covered: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def peak_bytes(self) -> int:
        """The run's total peak: weights, cache and transients at the worst moment (prefill or decode)."""
        return max(self.prefill_peak_bytes, self.decode_peak_bytes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        out = {k: v for k, v in vars(self).items() if k != "devices"}
        out["peak_bytes"] = self.peak_bytes
        out["devices"] = {str(k): {**vars(d), "activation_bytes": d.activation_bytes} for k, d in self.devices.items()}
        return out


class DryRunError(RuntimeError):
    """The dry run could not answer: which step failed on the meta device, and transformers' own message."""


# ----------------------------------------------------------------------------------------------- the dry run

_DISABLE_CHECKS = "TRANSFORMERS_DISABLE_TORCH_CHECK"
# One dry run at a time in a process: the env switch below is process-wide, and a dry run hooks the shared meta model.
_run_lock = threading.Lock()


@contextlib.contextmanager
def _no_value_checks() -> Iterator[None]:
    """transformers' ``torch_compilable_check`` compares tensor values (image tokens vs features): meta has none.

    transformers documents TRANSFORMERS_DISABLE_TORCH_CHECK=1 to skip those checks; it is read at call time, so it
    is set only for the dry run (process-wide: a concurrent real forward skips its checks for that long).
    """
    old = os.environ.get(_DISABLE_CHECKS)
    os.environ[_DISABLE_CHECKS] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(_DISABLE_CHECKS, None)
        else:
            os.environ[_DISABLE_CHECKS] = old


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


def _parts(cache: Any) -> list[Any]:
    if cache is None:
        return []
    if hasattr(cache, "self_attention_cache"):
        return [cache.self_attention_cache, cache.cross_attention_cache]
    return [cache]


def _layer_classes(cache: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for part in _parts(cache):
        for layer in getattr(part, "layers", []):
            if dryrun.storage_bytes(dryrun.tensors_of(layer)) > 16:  # layers that hold more than their window scalar
                counts[type(layer).__name__] = counts.get(type(layer).__name__, 0) + 1
    return counts


def _state_tensors(cache: Any) -> list[Any]:
    """Conv / recurrent states of linear-attention and state-space layers (fixed size whatever the context)."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    out: list[Any] = []
    for part in _parts(cache):
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
    return held, dryrun.storage_bytes(_state_tensors(cache)), cross


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


def _encoder_inputs(model: Any, batch: int, tokens: int, dev: Any) -> Any:
    """The encoder's main input at ``tokens`` positions: token ids, or log-mel frames (2 per position)."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    if model.main_input_name == "input_features":
        fixed = int(model.config.max_source_positions)
        if tokens != fixed:
            raise ValueError(f"this encoder takes exactly {fixed:,} positions (a padded 30 s window), not {tokens:,}")
        return torch.zeros(batch, model.config.num_mel_bins, 2 * tokens, dtype=model.dtype, device=dev)
    return torch.zeros(batch, tokens, dtype=torch.long, device=dev)


@dataclass(frozen=True)
class Sizes:
    """What one dry run is asked: the run's shape, options and placement (the key of its cached result)."""

    batch: int
    context: int
    prompt: int
    encoder_tokens: int | None = None
    target: str = "cuda"
    generation: tuple[tuple[str, Any], ...] = ()  # generate() options, sorted items
    inputs: tuple[tuple[str, Any], ...] = ()  # extra inputs by shape: (name, shape) or (name, (shape, dtype))
    device_map: tuple[tuple[str, Hashable], ...] = ONE_DEVICE
    padding: str = "none"  # how the batch's prompts come: PADDINGS

    def check(self) -> None:
        if self.batch < 1 or self.prompt < 1 or self.context < self.prompt + 1:
            raise ValueError(
                f"need batch >= 1 and 1 <= prompt < context (got batch {self.batch}, prompt {self.prompt}, "
                f"context {self.context})"
            )
        if self.padding not in PADDINGS:
            raise ValueError(f"padding must be one of {', '.join(PADDINGS)}, not {self.padding!r}")


class _Run:
    """A dry run's figures and its timeline: every op's bytes on each device, kept flat in an int64 array (a 70B
    search keeps about a hundred runs of ~16,000 ops: as tuples of ints they took ~450 MB, here ~60 MB)."""

    def __init__(self, estimate: RunEstimate, timeline: list[tuple[int, ...]], devices: list[Hashable]) -> None:
        self.estimate, self.devices = estimate, devices
        self.points = array.array("q", itertools.chain.from_iterable(timeline))

    @property
    def ops(self) -> int:
        """How many ops the timeline has."""
        return len(self.points) // len(self.devices) if self.devices else 0

    @property
    def timeline(self) -> list[tuple[int, ...]]:
        """Per op, the bytes on each device (in ``devices``' order)."""
        n, points = len(self.devices), self.points
        return [tuple(points[i : i + n]) for i in range(0, len(points), n)] if n else []


def _notes(model: Any, target: str, kernels: dict[str, int], devices: int) -> list[str]:
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


def _cache_notes(cache: Any) -> list[str]:
    """What the one decode step can't show of the cache generate() made (a quantized or offloaded cache)."""
    layers = [layer for part in _parts(cache) for layer in getattr(part, "layers", [])]
    residual = next((layer.residual_length for layer in layers if hasattr(layer, "residual_length")), None)
    notes = []
    if residual is not None:
        notes.append(
            f"the quantized cache keeps up to {residual} recent tokens (residual_length) in full precision before "
            "quantizing them; the decode step measured holds one, so the cache reaches up to that many tokens' "
            "full-precision keys and values more between flushes"
        )
    if any(getattr(part, "offloading", False) for part in _parts(cache)):
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


def _extra_inputs(inputs: tuple[tuple[str, Any], ...], dev: Any, dtype: Any) -> dict[str, Any]:
    """Extra generate() inputs named by shape (e.g. pixel_values), as zeros on the run's device."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    out: dict[str, Any] = {}
    for name, spec in inputs:
        shape, kind = spec if len(spec) == 2 and isinstance(spec[1], torch.dtype) else (spec, dtype)
        out[name] = torch.zeros(*shape, dtype=kind, device=dev)
    return out


def _device_labels(device_map: dict[str, Hashable]) -> list[Hashable]:
    """Every device a run may count on: the device_map's values, in order, and the execution device."""
    return list(dict.fromkeys([*device_map.values(), dryrun.execution_device(device_map)]))


class _DryRun:
    """generate()'s steps on one model at one size, under one tracker: the inputs, the prefill, one decode step."""

    def __init__(self, model: Any, sizes: Sizes, widen: bool = True) -> None:
        self.full, self.sizes = model, sizes
        self.device_map = dict(sizes.device_map)
        # An offloaded cache moves layers by their position (the prefetch circles back to the first), which the
        # recorded first and last layers of a stretch do as the full depth does: its middle periods repeat too.
        plain = widen and not sizes.inputs and model.can_generate()
        # A deep model runs with a few of its decoder layers, widened to its depth after (see run_depth).
        self.shallow = run_depth.shallow(model, self.device_map, plain=plain, cast=apply_dtype_plan)
        if self.shallow is not None:
            model, self.device_map = self.shallow.model, self.shallow.device_map
        self.model, self.dev = model, model.device
        self.tracker = dryrun.tracker(_device_labels(self.device_map), max_ops=op_budget(self.full))
        dryrun.track_weights(self.tracker, model, self.device_map)
        self.weights = list(self.tracker.totals)
        self.starts: list[int] = []  # the op index each recorded decoder layer started at (a shallow run)
        self.routed_at: list[dict[str, int]] = []  # and the attention kernels counted by then
        self.created: tuple[int, list[run_depth.CacheLayer] | None] = (0, None)  # op index, cache layers as made
        self.encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
        self.gen: Any = generation_config(model, **dict(sizes.generation)) if model.can_generate() else None
        tokens = default_encoder_tokens(model, sizes.context) if sizes.encoder_tokens is None else sizes.encoder_tokens
        self.encoder_tokens = tokens if self.encoder_decoder else None
        self.keep = 1 if model.can_generate() and model._supports_logits_to_keep() else None
        self.step = "building the inputs"
        self.known: Any = None  # the mode whose meta tensors carry values (while measured)
        self.held: tuple[Any, ...] = ()  # the caller's inputs and what generate() keeps for the whole run

    def kwargs(self) -> tuple[Any, dict[str, Any]]:
        """generate()'s model kwargs before the cache, in generate()'s order: the caller's attention mask, position
        ids (then an all-ones mask is dropped), encoder outputs, logits_to_keep."""
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

        model, s, dev = self.model, self.sizes, self.dev
        extra = _extra_inputs(s.inputs, dev, model.dtype)
        enc = _encoder_inputs(model, s.batch, int(self.encoder_tokens or 0), dev) if self.encoder_decoder else None
        ids = torch.zeros(s.batch, s.prompt, dtype=torch.long, device=dev)
        mask = self._caller_mask(s.prompt if enc is None else enc.shape[1])
        self.held = (ids, enc, mask, *self._generate_state())  # alive until generate() returns
        kwargs = {**extra, "attention_mask": mask} if mask is not None else dict(extra)
        if not self.encoder_decoder and "position_ids" in inspect.signature(model.forward).parameters:
            kwargs["position_ids"] = model._prepare_position_ids_for_generation(ids, kwargs)
        if mask is not None and self._drops_mask(mask):
            kwargs["attention_mask"] = None
        self.gen._mask_length = s.prompt
        if extra and not self.encoder_decoder:
            self.step = "the multimodal encoder"
            kwargs = model._maybe_prepare_encoder_kwargs_for_generation(None, kwargs, None, self.gen)
        if enc is not None:
            self.step = "the encoder forward"
            kwargs = model._maybe_prepare_encoder_kwargs_for_generation(enc, kwargs, model.main_input_name, self.gen)
        if self.keep is not None:
            kwargs["logits_to_keep"] = self.keep
        self.gen.max_length = s.context + 1  # the last token is sampled but never forwarded
        return ids, kwargs

    def _caller_mask(self, tokens: int) -> Any | None:
        """The tokenizer's attention_mask passed with the prompt (int64, on the device), carrying its values so that
        transformers' own mask code sees the padding; None where the forward takes none or the input is not tokens."""
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

        model = self.model
        if model.main_input_name != "input_ids" or "attention_mask" not in inspect.signature(model.forward).parameters:
            return None
        with values.unseen():
            padded = attention_mask(self.sizes.batch, tokens, self.sizes.padding)
        mask = torch.ones(padded.shape, dtype=padded.dtype, device=self.dev)
        self.known.give(mask, padded)
        return mask

    def _generate_state(self) -> list[Any]:
        """What generate() holds from start to end besides the caller's inputs: its special tokens as tensors (its
        own _prepare_special_tokens, run on the CPU where its checks can read them; one copy of each on the device)
        and _sample's unfinished_sequences (one int64 per sequence)."""
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

        with values.unseen():
            self.model._prepare_special_tokens(self.gen, True, device="cpu", batch_size=self.sizes.batch)
        tokens = [getattr(self.gen, f"_{name}_token_tensor", None) for name in ("bos", "eos", "pad", "decoder_start")]
        distinct = {int(t.untyped_storage()._cdata): t for t in tokens if isinstance(t, torch.Tensor)}
        held = [torch.empty_like(t, device=self.dev) for t in distinct.values()]
        return [*held, torch.ones(self.sizes.batch, dtype=torch.long, device=self.dev)]

    def _drops_mask(self, mask: Any) -> bool:
        """generate() drops an all-ones mask once the position ids are made (decoder-only models, unless flash
        attention runs a static cache): its own test, on the mask's values."""
        from transformers.utils.generic import is_flash_attention_requested  # lazy: as above

        static = self.gen.cache_implementation == "static" and is_flash_attention_requested(self.model.config)
        return not self.encoder_decoder and not static and bool((mask == 1).all())

    def generate(self) -> dict[str, Any]:
        """The prefill and one decode step, as generate()'s _sample runs them; the figures at each point."""
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

        model, s, dev, track = self.model, self.sizes, self.dev, self.tracker
        ids, kwargs = self.kwargs()
        self.step = "creating the cache"
        created = new_cache(model, self.gen, kwargs, s.batch, s.context)
        offloading.stand_in_streams(kwargs.get("cache"), s.target)
        if self.shallow is not None:  # a cache layer may allocate when it is made (a window scalar, a static cache)
            self.created = (len(track.timeline), run_depth.cache_layers(created, track, _state_tensors))
        kwargs["use_cache"] = self.gen.use_cache
        self.step = "the prefill forward"
        outputs = model._prefill(ids, self.gen, kwargs)
        cache = outputs.get("cache")
        found: dict[str, Any] = {"parts": cache_parts(cache), "classes": _layer_classes(cache),
                                 "cache_class": type(cache).__name__ if cache is not None else "none",
                                 "cache_on": dryrun.bytes_by_device(track, cache),
                                 "cache_notes": _cache_notes(cache)}  # fmt: skip
        if self.shallow is not None:
            found["layers"] = run_depth.cache_layers(cache, track, _state_tensors)
        self.step = "the decode step"
        kwargs = model._update_model_kwargs_for_generation(outputs, kwargs, is_encoder_decoder=self.encoder_decoder)
        # generate(): a float32 copy of the last position's logits, argmax, append; `outputs` stays alive meanwhile.
        next_ids = outputs.logits[:, -1].to(copy=True, dtype=torch.float32).argmax(-1, keepdim=True)
        next_ids = torch.zeros(s.batch, 1, dtype=torch.long, device=dev)  # meta: argmax has no value to append
        ids = torch.cat([ids, next_ids], dim=-1)
        found["split"] = len(track.timeline)
        decoded = model(**model.prepare_inputs_for_generation(ids, next_sequence_length=1, **kwargs), return_dict=True)
        decoded_cache = decoded.get("cache")
        found["decode_held"] = cache_parts(decoded_cache)[0]
        found["decode_on"] = dryrun.bytes_by_device(track, decoded_cache)
        if self.shallow is not None:
            found["decode_layers"] = run_depth.cache_layers(decoded_cache, track, _state_tensors)
        return found

    def run(self) -> _Run:
        started = time.perf_counter()
        if not self.model.can_generate():
            return self._forward_only(started)
        try:
            with self._measured() as routed:
                found = self.generate()
        except dryrun.TooManyOps as exc:
            raise DryRunError(
                f"not covered: {self.step} dispatched {exc} at {self.sizes.context:,} tokens: this model runs a Python "
                "loop over tokens or chunks on this device (the kernel a GPU would use is not available to a meta "
                "run), so a dry run at this context would take minutes; smaller contexts are measured"
            ) from exc
        except Exception as exc:
            raise DryRunError(self._failure(exc)) from exc
        kernels = dict(routed.routed)
        if self.shallow is not None:
            try:
                self._widen(found)
                kernels = run_depth.widen_counts(kernels, self.routed_at, self.shallow)
            except run_depth.NotRepeating:
                return _DryRun(self.full, self.sizes, widen=False).run()
        return self._result(found, kernels, started)

    def _failure(self, exc: Exception) -> str:
        """The plan's words for a dry run that stopped: transformers refusing the cache asked for, or the step."""
        why = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        if isinstance(exc, offloading.Stranded):
            return f"the offloaded cache fails for this model in {self.step}: {exc}"
        if isinstance(exc, offloading.Refused):
            return str(exc)
        asked = dict(self.sizes.generation).get("cache_implementation")
        if asked is not None and self.step == "creating the cache" and isinstance(exc, ValueError):
            return f"transformers refuses cache_implementation={asked!r} for this model: {why}"
        raised_in = offloading.raised_in_cache_code(exc) if offloading.asks_offloading(self.sizes.generation) else None
        if raised_in is not None:
            return f"the offloaded cache fails for this model in {self.step}: transformers' {raised_in} raises {why}"
        return f"{self.step} failed on the meta device: {why}"

    def _widen(self, found: dict[str, Any]) -> None:
        """The shallow run's figures at the full model's depth: timeline, weights, cache (see run_depth)."""
        assert self.shallow is not None
        track = self.tracker
        before, after = found.pop("layers"), found.pop("decode_layers")
        created_at, created = self.created
        if before is None or after is None or created is None:
            raise run_depth.NotRepeating("no per-layer cache made before the prefill")
        weights = self.weights + [0] * (len(track.devices) - len(self.weights))
        extra = tuple(self.shallow.added_weights.get(d, 0) for d in track.devices)
        timeline = _padded(track.timeline, len(track.devices))
        made = (created_at, run_depth.added_bytes(created, self.shallow, track.devices))
        track.timeline, found["split"] = run_depth.widen_timeline(
            timeline, self.starts, found["split"], self.shallow, extra, made=made
        )
        run_depth.widen_cache(found, self.shallow, before, after)
        self.weights = [w + e for w, e in zip(weights, extra, strict=True)]

    @contextlib.contextmanager
    def _measured(self) -> Iterator[Any]:
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

        with (
            torch.no_grad(),
            meta_build.quiet(),
            _no_value_checks(),
            dryrun.attention_as_on(self.sizes.target) as routed,
            dryrun.placed(self.model, self.device_map, self.tracker) as first,
            self._layer_starts(),
            offloading.host_copies(self.tracker)
            if offloading.asks_offloading(self.sizes.generation)
            else contextlib.nullcontext(),
            self.tracker,
            values.known_values() as known,  # after the tracker: the values' CPU ops are not the run's
        ):
            self.tracker.now = self.tracker.index(first)
            self.routing, self.known = routed, known
            yield routed

    @contextlib.contextmanager
    def _layer_starts(self) -> Iterator[None]:
        """Notes the op index each decoder layer starts at (a shallow run's periods are read from it)."""
        if self.shallow is None:
            yield
            return
        _, layers = depth.decoder_stack(self.model)
        handles = [layer.register_forward_pre_hook(lambda *_: self._layer_started()) for layer in layers]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _layer_started(self) -> None:
        self.starts.append(len(self.tracker.timeline))
        self.routed_at.append(dict(self.routing.routed))

    def _per_device(self, cache_on: dict[Hashable, int], decode_on: dict[Hashable, int]) -> dict[Hashable, DeviceRun]:
        track = self.tracker
        n = len(track.devices)
        top = dryrun.peaks(track.timeline, n)
        weights = self.weights + [0] * (n - len(self.weights))
        out = {}
        for i, device in enumerate(track.devices):
            peak = max(top[i], weights[i])
            if peak or cache_on.get(device) or weights[i]:
                cache, decode = cache_on.get(device, 0), decode_on.get(device, 0)
                out[device] = DeviceRun(weights[i], cache, decode, peak, track.largest[i])
        return out

    def _result(self, found: dict[str, Any], kernels: dict[str, int], started: float) -> _Run:
        track, s = self.tracker, self.sizes
        weights = sum(self.weights)
        timeline = _padded(track.timeline, len(track.devices))
        split = found["split"]
        prefill = max([sum(p) for p in timeline[:split]], default=weights)
        decode = max([sum(p) for p in timeline[split:]], default=0)
        held, state, cross = found["parts"]
        devices = self._per_device(found["cache_on"], found["decode_on"])
        estimate = RunEstimate(
            batch=s.batch, context=s.context, prompt_tokens=s.prompt, encoder_tokens=self.encoder_tokens,
            weight_bytes=weights, cache_bytes=held, cache_decode_bytes=found["decode_held"], state_bytes=state,
            cross_cache_bytes=cross, activation_bytes=max(prefill - weights - held, 0), prefill_peak_bytes=prefill,
            decode_peak_bytes=decode, cache_class=found["cache_class"], layer_classes=found["classes"],
            kernels=kernels, logits_to_keep=self.keep, target=s.target, padding=s.padding, devices=devices,
            not_covered=_notes(self.model, s.target, kernels, len(devices)) + found["cache_notes"],
            seconds=time.perf_counter() - started,
        )  # fmt: skip
        return _Run(estimate, timeline, list(track.devices))

    def _forward_only(self, started: float) -> _Run:
        """Models that don't generate (encoders such as BERT): one forward at batch x context, no cache."""
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

        s = self.sizes
        with self._measured() as routed:
            ids = torch.zeros(s.batch, s.context, dtype=torch.long, device=self.dev)
            mask = self._caller_mask(s.context)
            out = self.model(input_ids=ids, **({} if mask is None else {"attention_mask": mask}))
            del out, ids, mask
        track = self.tracker
        timeline = _padded(track.timeline, len(track.devices))
        weights = sum(self.weights)
        peak = max([sum(p) for p in timeline], default=weights)
        kernels = dict(routed.routed)
        estimate = RunEstimate(
            batch=s.batch, context=s.context, prompt_tokens=s.context, encoder_tokens=None, weight_bytes=weights,
            cache_bytes=0, cache_decode_bytes=0, state_bytes=0, cross_cache_bytes=0,
            activation_bytes=max(peak - weights, 0), prefill_peak_bytes=peak, decode_peak_bytes=0,
            cache_class="none", layer_classes={}, kernels=kernels, logits_to_keep=None, target=s.target,
            padding=s.padding, devices=self._per_device({}, {}),
            not_covered=["no cache: this model does not generate; one forward at batch x context"],
            seconds=time.perf_counter() - started,
        )  # fmt: skip
        return _Run(estimate, timeline, list(track.devices))


_MODULES: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def modules(model: Any) -> int:
    """How many modules a model has (remembered: an 80-layer model has ~1,000)."""
    if model not in _MODULES:
        _MODULES[model] = sum(1 for _ in model.modules())
    return _MODULES[model]


def op_budget(model: Any) -> int:
    """The most ops a dry run of this model may dispatch before it is called a loop over tokens."""
    return max(MIN_OPS, OPS_PER_MODULE * modules(model))


def _padded(timeline: list[tuple[int, ...]], devices: int) -> list[tuple[int, ...]]:
    """Every point with a figure for every device (a device first seen mid-run was 0 before)."""
    if all(len(p) == devices for p in timeline):
        return timeline
    return [p + (0,) * (devices - len(p)) for p in timeline]


# ----------------------------------------------------------------------------------------------- cached entry

# Per model object (weakly: a model that is gone takes its results with it; id() would be reused by the next one).
_RESULTS: weakref.WeakKeyDictionary[Any, OrderedDict[Sizes, _Run]] = weakref.WeakKeyDictionary()
_RESULTS_LOCK = threading.Lock()
RESULT_CACHE_SIZE = 64  # per model


def _run(model: Any, sizes: Sizes) -> _Run:
    """A dry run, remembered per model object and sizes: a plan asked again costs nothing."""
    sizes.check()
    with _RESULTS_LOCK:
        known = _RESULTS.setdefault(model, OrderedDict())
        if sizes in known:
            known.move_to_end(sizes)
            return known[sizes]
    with _run_lock:
        done = _DryRun(model, sizes).run()
    with _RESULTS_LOCK:
        known[sizes] = done
        while len(known) > RESULT_CACHE_SIZE:
            known.popitem(last=False)
    return done


def clear_results() -> None:
    """Forget every remembered dry run (benchmarks measure the dry run itself)."""
    with _RESULTS_LOCK:
        _RESULTS.clear()


def sizes(
    batch: int,
    context: int,
    *,
    prompt_tokens: int | None = None,
    encoder_tokens: int | None = None,
    target: str = "cuda",
    generation: dict[str, Any] | None = None,
    inputs: dict[str, Any] | None = None,
    device_map: dict[str, Hashable] | None = None,
    padding: str = "none",
) -> Sizes:
    """The Sizes of a run (prompt defaults to context - 1; device_map to the whole model on one device)."""
    return Sizes(
        batch=batch,
        context=context,
        prompt=context - 1 if prompt_tokens is None else prompt_tokens,
        encoder_tokens=encoder_tokens,
        target=target,
        generation=tuple(sorted((generation or {}).items())),
        inputs=tuple(sorted((inputs or {}).items())),
        device_map=tuple(device_map.items()) if device_map else ONE_DEVICE,
        padding=padding,
    )


def run_estimate(
    model: Any,
    *,
    batch: int = 1,
    context: int = 4096,
    prompt_tokens: int | None = None,
    encoder_tokens: int | None = None,
    target: str = "cuda",
    generation: dict[str, Any] | None = None,
    inputs: dict[str, Any] | None = None,
    device_map: dict[str, Hashable] | None = None,
    padding: str = "none",
) -> RunEstimate:
    """Dry-run generate() on ``model`` (meta device): a prefill of the prompt, then one decode step.

    ``context``: tokens per sequence, prompt plus generated (the decoder's, for encoder-decoder models). The prompt
    defaults to ``context - 1``, so the one decode step reaches ``context`` and both the worst prefill and the final
    cache are measured; with a shorter ``prompt_tokens`` a second dry run measures the cache at ``context``.
    ``encoder_tokens``: the encoder's input length (default ``context``; fixed for speech encoders). ``target``:
    whose attention kernels size the work ("cuda", "cpu" or "math"). ``generation``: generate() options such as
    ``{"cache_implementation": "static"}``. ``inputs``: extra generate() inputs by shape, e.g. ``{"pixel_values":
    (1, 3, 336, 336)}`` (the prompt's image tokens count in ``context``). ``device_map``: count each allocation on
    the device its module runs on (``estimate.devices``). ``padding``: how the batch's prompts come (PADDINGS); the
    prompt's attention_mask is the tokenizer's, held by the caller for the whole run.
    """
    asked = sizes(batch, context, prompt_tokens=prompt_tokens, encoder_tokens=encoder_tokens, target=target,
                  generation=generation, inputs=inputs, device_map=device_map, padding=padding)  # fmt: skip
    first = _run(model, asked).estimate
    if asked.prompt == context - 1 or not model.can_generate():
        return first
    full = _run(model, replace(asked, prompt=context - 1)).estimate
    return replace(first, cache_decode_bytes=full.cache_decode_bytes, decode_peak_bytes=full.decode_peak_bytes,
                   seconds=first.seconds + full.seconds)  # fmt: skip


# ----------------------------------------------------------------------------------------------- searches


@dataclass
class Fit:
    """The answer of a search and how it was reached."""

    value: int  # the largest size that fits (0: not even the smallest)
    limit: int  # the largest size searched (the model's maximum positions, or the batch limit)
    dry_runs: int  # dry runs made for the search (runs remembered from earlier plans included)
    method: str  # "timeline fit, confirmed ...", "peak fit, confirmed by dry runs" or "bisection"
    seconds: float = 0.0


def _over(run: _Run, limits: dict[Hashable, int]) -> Any:
    """The run's timeline as bytes over each device's limit, every device of every point (float64, flat)."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    columns = [i for i, d in enumerate(run.devices) if d in limits]
    if not columns:
        return torch.full((1,), -1.0, dtype=torch.float64)
    points = torch.frombuffer(run.points or array.array("q", [0] * len(run.devices)), dtype=torch.int64)
    table = points.view(-1, len(run.devices)).to(torch.float64)[:, columns]
    return (table - torch.tensor([float(limits[run.devices[i]]) for i in columns], dtype=torch.float64)).flatten()


class _Search:
    """Largest n in [lo, hi] whose dry run stays within every device's limit.

    First a timeline fit: the timelines of the dry runs so far, as polynomials in n (degree grows with the points,
    up to ``degree``), give a guess g; the dry run at g + 1 must not fit and its whole timeline must equal the fit's
    prediction (then the prediction at g is the measured law, not a guess), else it becomes a fit point. When the
    op sequence changes with n (a loop over tokens or chunks), the peaks nearest the boundary are fitted instead and
    each guess confirmed by dry runs at g and g + 1; bisection with dry runs is the last resort.
    """

    def __init__(
        self, measure: Callable[[int], _Run], limits: dict[Hashable, int], bounds: tuple[int, int], degree: int
    ) -> None:
        self.measure, self.limits, self.degree = measure, limits, degree
        self.lo, self.hi = bounds
        self.seen: dict[int, Any] = {}  # n -> flat over-the-limit timeline
        self.started = time.perf_counter()

    def over(self, n: int) -> Any:
        if n not in self.seen:
            self.seen[n] = _over(self.measure(n), self.limits)
        return self.seen[n]

    def fits(self, n: int) -> bool:
        return bool(self.over(n).max() <= 0)

    def done(self, value: int, method: str) -> Fit:
        return Fit(max(value, 0), self.hi, len(self.seen), method, time.perf_counter() - self.started)

    def __call__(self, seeds: list[int]) -> Fit:
        points = sorted({min(max(n, self.lo), self.hi) for n in seeds})
        for n in points:
            self.over(n)
        return self.timeline_fit(points) or self.peak_fit() or self.bisect()

    def _coefficients(self, points: list[int]) -> Any:
        """Per timeline point, the polynomial in n through the last points (None when the op sequences differ)."""
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

        order = min(len(points) - 1, self.degree)
        chosen = points[-(order + 1) :]
        if len({self.seen[n].numel() for n in chosen}) != 1:
            return None
        xs = torch.tensor([float(n) for n in chosen], dtype=torch.float64)
        vander = torch.vander(xs, order + 1)
        return torch.linalg.solve(vander, torch.stack([self.seen[n] for n in chosen]))

    @staticmethod
    def _predicted(coeffs: Any, n: int) -> Any:
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

        powers = torch.tensor([float(n) ** p for p in range(coeffs.shape[0] - 1, -1, -1)], dtype=torch.float64)
        return powers @ coeffs

    def _largest_predicted(self, coeffs: Any) -> int:
        """Largest n in [lo, hi] whose predicted timeline fits (peaks grow with n)."""
        lo, hi = self.lo, self.hi
        if self._predicted(coeffs, lo).max() > 0:
            return lo - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._predicted(coeffs, mid).max() <= 0:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def timeline_fit(self, points: list[int]) -> Fit | None:
        for _ in range(self.degree + 2):
            coeffs = self._coefficients(points)
            if coeffs is None:
                return None
            guess = self._largest_predicted(coeffs)
            edge = self.hi if guess >= self.hi else self.lo if guess < self.lo else None
            if edge is not None:
                if self.fits(edge) == (edge == self.hi):
                    return self.done(self.hi if edge == self.hi else self.lo - 1, "timeline fit, confirmed")
                points.append(edge)
                continue
            nxt = guess + 1
            if not self.fits(nxt) and _matches(self._predicted(coeffs, nxt), self.seen[nxt]):
                return self.done(guess, "timeline fit, confirmed at the next size")
            if nxt in points:
                return None
            points.append(nxt)
        return None

    def peak_fit(self) -> Fit | None:
        for _ in range(4):
            good, bad = self._bracket()
            if bad - good <= 1:
                return None
            guess = self._peak_fit_guess(good, bad)
            if guess is None:
                return None
            if self.fits(guess) and (guess == self.hi or not self.fits(guess + 1)):
                return self.done(guess, "peak fit, confirmed by dry runs")
        return None

    def bisect(self) -> Fit:
        good, bad = self._bracket()
        if good == self.lo - 1 and self.fits(self.lo):
            good = self.lo
        if bad == self.hi + 1 and good < self.hi and self.fits(self.hi):
            good = self.hi
        while bad - good > 1 and good < self.hi:
            mid = (good + bad) // 2
            if self.fits(mid):
                good = mid
            else:
                bad = mid
        return self.done(good, "bisection")

    def _bracket(self) -> tuple[int, int]:
        good = max([n for n in self.seen if self.fits(n)], default=self.lo - 1)
        bad = min([n for n in self.seen if not self.fits(n)], default=self.hi + 1)
        return good, bad

    def _peak_fit_guess(self, good: int, bad: int) -> int | None:
        """Largest n strictly inside (good, bad) that the polynomial through the nearest measured peaks says fits."""
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

        if good < min(self.seen) or bad > max(self.seen):
            return None
        order = min(self.degree, len(self.seen) - 1)
        if order < 1:
            return None
        nearest = sorted(self.seen, key=lambda n: min(abs(n - good), abs(n - bad)))[: order + 1]
        xs = torch.tensor([float(n) for n in nearest], dtype=torch.float64)
        ys = torch.tensor([float(self.seen[n].max()) for n in nearest], dtype=torch.float64)
        coeffs = torch.linalg.solve(torch.vander(xs, order + 1), ys.unsqueeze(1))
        low, high = good + 1, bad - 1
        if self._predicted(coeffs, low).max() > 0:
            return low
        while low < high:
            mid = (low + high + 1) // 2
            if self._predicted(coeffs, mid).max() <= 0:
                low = mid
            else:
                high = mid - 1
        return low


def _matches(predicted: Any, measured: Any) -> bool:
    return bool(predicted.shape == measured.shape and (predicted - measured).abs().max() < 1.0)


def context_limit(config: Any) -> int:
    """The longest sequence a config allows (its maximum positions), or NO_LIMIT when it names none."""
    config = getattr(config, "config", config)
    text = config.get_text_config(decoder=True)
    for name in ("max_position_embeddings", "n_positions", "max_target_positions"):
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return NO_LIMIT


def context_limit_name(config: Any) -> str | None:
    """Which config field gives the limit (for the message that names it)."""
    text = getattr(config, "config", config).get_text_config(decoder=True)
    for name in ("max_position_embeddings", "n_positions", "max_target_positions"):
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return name
    return None


def max_context(
    model: Any,
    limits: dict[Hashable, int],
    *,
    batch: int = 1,
    target: str = "cuda",
    start: int = 4096,
    generation: dict[str, Any] | None = None,
    device_map: dict[str, Hashable] | None = None,
    encoder_tokens: int | None = None,
    limit: int | None = None,
    margins: Margins | None = None,
    padding: str = "none",
) -> Fit:
    """Tokens per sequence (prompt + generated) that fit every device's limit at this batch, up to the model's limit.

    ``limits``: the bytes the dry run's tensors may reach on each device (a device not named has no limit);
    ``margins``: what each device's allocator needs left free for a run (see :func:`with_margins`).
    """
    hi = max(limit or context_limit(model), 2)
    first = max(min(start, hi), 2)
    seeds = sorted({first, min(2 * first, hi)})

    def measure(n: int) -> _Run:
        return _run(model, sizes(batch, max(n, 2), target=target, generation=generation, device_map=device_map,
                                 encoder_tokens=encoder_tokens, padding=padding))  # fmt: skip

    note = ""
    if _ops_grow(model, measure, first):
        # A loop over tokens: past some context the dry run would stop at its op budget. Search below it.
        covered = _covered_context(model, measure, first)
        if covered < hi:
            hi, note = max(covered, first), f"; past {max(covered, first):,} tokens not covered (a loop over tokens)"
            seeds = sorted({max(first // 2, 2), first})
    found = with_margins(lambda lim: _Search(measure, lim, (2, hi), degree=2)(seeds), measure, limits, margins)
    found = replace(found, method=found.method + note)
    return found if found.value >= 2 else replace(found, value=0)


def _ops_grow(model: Any, measure: Callable[[int], _Run], first: int) -> bool:
    """Whether the dry run's op count grows with the context (a Python loop over tokens or chunks): far more ops per
    module than a forward of fused layers makes (11-16 per module for a prefill and a decode step)."""
    return measure(first).ops > LOOP_OPS_PER_MODULE * modules(model)


def _covered_context(model: Any, measure: Callable[[int], _Run], first: int) -> int:
    """The longest context whose dry run stays within the op budget, by the op counts at two contexts (they grow
    linearly with the context in a loop over tokens)."""
    low = max(first // 2, 2)
    ops_low, ops_first = measure(low).ops, measure(first).ops
    if ops_first <= ops_low or first == low:
        return first
    budget = op_budget(model)
    per_token = (ops_first - ops_low) / (first - low)
    return int(first + 0.9 * (budget - ops_first) / per_token)


def max_batch(
    model: Any,
    limits: dict[Hashable, int],
    *,
    context: int = 4096,
    target: str = "cuda",
    generation: dict[str, Any] | None = None,
    device_map: dict[str, Hashable] | None = None,
    encoder_tokens: int | None = None,
    limit: int = 4096,
    margins: Margins | None = None,
    padding: str = "none",
) -> Fit:
    """Sequences of ``context`` tokens that fit every device's limit together (``margins``: see max_context)."""

    def measure(n: int) -> _Run:
        return _run(model, sizes(n, context, target=target, generation=generation, device_map=device_map,
                                 encoder_tokens=encoder_tokens, padding=padding))  # fmt: skip

    return with_margins(lambda lim: _Search(measure, lim, (1, limit), degree=1)([1, 2]), measure, limits, margins)


Margins = Callable[[RunEstimate], dict[Hashable, int]]
MARGIN_ROUNDS = 4  # searches against a margin before the largest size seen to keep its own is taken


def with_margins(
    search: Callable[[dict[Hashable, int]], Fit],
    measure: Callable[[int], _Run],
    limits: dict[Hashable, int],
    margins: Margins | None,
) -> Fit:
    """The largest size whose run leaves each device its allocator's margin (``margins``: per device, what the
    allocator needs for a given run). Both the tensors and the margin grow with the size, so "keeps its margin" holds
    up to one size: the tensors' boundary bounds it, searches against the limits less the margin of the last answer
    narrow it (a few rounds), and dry runs bisect what is left."""
    found = search(limits)
    if margins is None or found.value == 0:
        return found

    def less(n: int) -> dict[Hashable, int]:
        room = margins(measure(n).estimate)
        return {d: lim - room.get(d, 0) for d, lim in limits.items()}

    def keeps(n: int) -> bool:
        return bool(_over(measure(n), less(n)).max() <= 0)

    if keeps(found.value):
        return found
    good, bad, dry_runs = 0, found.value, found.dry_runs
    for _ in range(MARGIN_ROUNDS):
        again = search(less(bad if good == 0 else good))
        dry_runs += again.dry_runs
        if not good < again.value < bad:  # nothing new inside the bracket
            break
        good, bad = (again.value, bad) if keeps(again.value) else (good, again.value)
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if keeps(middle) else (good, middle)
        dry_runs += 1
    return replace(found, value=good, dry_runs=dry_runs, method=f"{found.method}, then keeping the allocator's margin")


# ----------------------------------------------------------------------------------------------- around the run


@dataclass(frozen=True)
class Reserve:
    """Device memory the framework holds outside any tensor: a stated figure, its source, and how to override it."""

    backend: str
    bytes: int
    what: str
    source: str


MiB = 2**20


def framework_reserve(
    backend: str,
    *,
    capability: tuple[int, int] | None = None,
    total_memory: int | None = None,
    override: int | None = None,
) -> Reserve:
    """The per-device reserve the plan adds to a device's peak (``override``: the user's own measured figure).

    These are stated figures with their sources, not measurements of this machine: no tracker sees a CUDA context.
    The GPU suite (where a GPU is lent) measures the real figure (mem_get_info before/after the first kernel) and
    records it next to the stated one.
    """
    if override is not None:
        return Reserve(backend, int(override), "your figure (--reserve)", "override")
    if backend in ("cuda", "nvidia"):
        return _cuda_reserve(backend, capability, total_memory)
    if backend in ("rocm", "hip"):
        return Reserve(
            backend,
            512 * MiB + 80 * MiB,
            "HIP context (no published figure; larger than CUDA's per vllm#43236) + hipBLASLt workspace "
            "(80 MiB default in the 2.13 ROCm builds)",
            "ROCm/pytorch#3657 / pytorch#197201 (hipBLASLt 80 MiB); context figure unmeasured: override it",
        )
    if backend == "xpu":
        return Reserve(
            backend,
            512 * MiB,
            "Level Zero context and oneDNN kernels (no published figure)",
            "unmeasured: override it; note pytorch#180145 (xe driver mirrors device allocations in host RAM)",
        )
    if backend == "mps":
        return Reserve(
            backend,
            0,
            "unified memory: the budget is torch.mps.recommended_max_memory() (Metal's "
            "recommendedMaxWorkingSetSize); PYTORCH_MPS_HIGH_WATERMARK_RATIO (default 1.7) caps allocations",
            "pytorch docs: MPS environment variables, torch.mps.recommended_max_memory",
        )
    if backend == "cpu":
        return Reserve(
            backend,
            520 * MiB,
            "the Python process: torch + transformers imports (~380 MiB RSS) and the "
            "lazy imports of the first from_pretrained (~140 MiB)",
            "measured with torch 2.13.0+cpu, transformers 5.24.0 (nbhw's run-planner notes)",
        )
    return Reserve(backend, 512 * MiB, "no figure for this backend", "unmeasured: override it")


# Hopper and later: NVML's bytes for the process minus torch's pool, after a bf16 generate with SDPA (nbhw's GPU suite,
# tests/gpu/test_run.py, on an H200 with torch 2.11.0+cu130 and driver 580.159.04, 2026-12-04). The published
# 300-400 MB (lazy loading, CUDA 11.7) was 222 MiB short there.
HOPPER_CONTEXT = 686 * MiB


def _cuda_reserve(backend: str, capability: tuple[int, int] | None, total_memory: int | None) -> Reserve:
    major = capability[0] if capability else 8
    # cuBLAS: CUBLAS_WORKSPACE_CONFIG default ":4096:2:16:8" (8 MiB + 128 KiB) before Hopper, 32 MiB from sm90;
    # cuBLASLt: 1 MiB, 4 MiB on Ampere >= 24 GiB, 32 MiB from sm90 (pytorch#120925).
    cublas = 32 * MiB if major >= 9 else (4096 * 2 + 16 * 8) * 1024
    lt = 32 * MiB if major >= 9 else 4 * MiB if major == 8 and (total_memory or 0) >= 24 * 2**30 else MiB
    workspaces = (
        "pytorch#120925 (cuBLASLt workspace sizes), CUBLAS_WORKSPACE_CONFIG default in "
        "aten/src/ATen/cuda/CublasHandlePool.cpp"
    )
    if major >= 9:
        return Reserve(
            backend,
            HOPPER_CONTEXT + cublas + lt,
            "CUDA context and the modules a generate loads (686 MiB measured on an H200) + cuBLAS / cuBLASLt "
            "workspaces",
            "measured by nbhw's GPU suite on an H200 (torch 2.11.0+cu130, driver 580.159.04; the published "
            f"~300-400 MB of pytorch#86509 / #109888 was 222 MiB short there); {workspaces}",
        )
    return Reserve(
        backend,
        400 * MiB + cublas + lt,
        "CUDA context with lazy module loading (~300-400 MB) + cuBLAS / cuBLASLt workspaces",
        "pytorch#86509 (287 MB lazy vs 667 MB eager loading, measured at merge), pytorch#109888 and "
        f"#107667 (maintainer: ~300-400 MB since CUDA 11.7 lazy loading; not measured here), {workspaces}",
    )


@dataclass(frozen=True)
class LoadPeak:
    """Host memory while from_pretrained reads a safetensors checkpoint (to the CPU, or through it to a device)."""

    private_bytes: int  # anonymous memory: cannot be reclaimed by the kernel
    file_bytes: int  # the checkpoint's mapped pages: page cache, reclaimable, but counted in RSS
    note: str

    @property
    def rss_bytes(self) -> int:
        """What top / a notebook memory monitor shows at the peak."""
        return self.private_bytes + self.file_bytes


def host_load_peak(loaded_bytes: int, checkpoint_bytes: int, *, cast: bool, mmap: bool = True) -> LoadPeak:
    """The load's host peak, by transformers 5.24's loading path (modeling_utils._load_pretrained_model and
    core_model_loading._materialize_copy), as measured by nbhw's load-peak test.

    ``loaded_bytes``: the weights that stay on the CPU. mmap (the default on Linux/macOS unless the file is on an HF
    mount): every shard is opened with safe_open and stays mapped until the whole load ends. Same dtype: tensors
    stay views of the mapping (nothing private; pages come in on first use). A cast: ``tensor[...].to(dtype)``
    makes a private copy in the new dtype, while the pages read stay resident until the files close.
    ``disable_mmap=True`` (and HF mounts): each file is read into memory and deserialised, so the file is held
    twice before the cast.
    """
    if not mmap:
        # Measured: 2.0x the file for float32 -> float32 and float32 -> bfloat16 alike; a cast to a wider dtype
        # (bfloat16 -> float32) without mmap was not measured, hence the max.
        held = max(2 * checkpoint_bytes, checkpoint_bytes + loaded_bytes)
        return LoadPeak(held, 0, "disable_mmap / HF mount: the file's bytes and their tensors are both private")
    if not cast:
        return LoadPeak(0, checkpoint_bytes, "same dtype: the weights are the checkpoint's mapped pages (file-backed)")
    return LoadPeak(
        loaded_bytes,
        checkpoint_bytes,
        "dtype cast: a private copy in the new dtype, plus the checkpoint's pages until the load ends",
    )
