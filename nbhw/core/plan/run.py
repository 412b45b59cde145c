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

Beside it, by the same seams: what a dry run is made of (:mod:`nbhw.core.plan.run_parts`: the build, generate()'s
cache and the caller's inputs), what it answers (:mod:`nbhw.core.plan.run_figures`), the searches over contexts
and batches that run it (:mod:`nbhw.core.plan.run_search`), and what a run needs outside its tensors
(:mod:`nbhw.core.plan.outside_tensors`: the framework's reserve, the host's load peak).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import replace
from typing import Any

from nbhw.core.hf import depth, dryrun, meta_build, offloading, values
from nbhw.core.plan import run_depth, run_store
from nbhw.core.plan.run_figures import (
    DeviceRun,
    DryRunError,
    RunEstimate,
    Sizes,
    TrackedRun,
    as_table,
    flat,
    most_together,
    sizes,
    table,
)
from nbhw.core.plan.run_parts import (
    apply_dtype_plan,
    attention_mask,
    cache_notes,
    cache_parts,
    default_encoder_tokens,
    device_labels,
    encoder_inputs,
    extra_inputs,
    generation_config,
    layer_classes,
    new_cache,
    no_value_checks,
    run_notes,
    state_tensors,
)

# A prefill plus one decode step dispatches 11-16 ops per module whatever the context (measured: Llama-70B 11.7,
# DeepSeek-V3 16.4); a model whose op count grows with the context runs a Python loop over tokens or chunks (the torch
# fallbacks of Mamba's selective scan: 364 per module at 300 tokens). Past this budget the dry run stops and says so.
OPS_PER_MODULE = 300


MIN_OPS = 30_000


LOOP_OPS_PER_MODULE = 60


# One dry run at a time in a process: the env switch of run_parts.no_value_checks is process-wide, and a dry run hooks
# the shared meta model.
run_lock = threading.Lock()


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
        self.tracker: Any = None  # made when generate() runs: a recording read back needs none
        self.weights: list[int] = []  # per device, the weights the tracker counted before the run
        self.devices: list[Hashable] = []  # the tracker's devices, and per device the largest block, once run
        self.largest: list[int] = []
        self.starts: list[int] = []  # the op index each recorded decoder layer started at (a shallow run)
        self.routed_at: list[dict[str, int]] = []  # and the attention kernels counted by then
        self.created: tuple[int, list[run_depth.CacheLayer] | None] = (0, None)  # op index, cache layers as made
        self.table: Any = None  # the timeline as a tensor (see table()), once recorded
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
        extra = extra_inputs(s.inputs, dev, model.dtype)
        enc = encoder_inputs(model, s.batch, int(self.encoder_tokens or 0), dev) if self.encoder_decoder else None
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
            self.created = (len(track.timeline), run_depth.cache_layers(created, track, state_tensors))
        kwargs["use_cache"] = self.gen.use_cache
        self.step = "the prefill forward"
        outputs = model._prefill(ids, self.gen, kwargs)
        cache = outputs.get("cache")
        found: dict[str, Any] = {"parts": cache_parts(cache), "classes": layer_classes(cache),
                                 "cache_class": type(cache).__name__ if cache is not None else "none",
                                 "cache_on": dryrun.bytes_by_device(track, cache),
                                 "cache_notes": cache_notes(cache)}  # fmt: skip
        if self.shallow is not None:
            found["layers"] = run_depth.cache_layers(cache, track, state_tensors)
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
            found["decode_layers"] = run_depth.cache_layers(decoded_cache, track, state_tensors)
        return found

    def run(self) -> TrackedRun:
        started = time.perf_counter()
        if not self.model.can_generate():
            return self._forward_only(started)
        key = self._recording_key()
        recorded = run_store.recorded(self.full, key) if key is not None else None
        if recorded is None:
            recorded = self._record()
            if key is not None:
                run_store.keep(self.full, key, recorded)
        found, kernels = self._replay(recorded)
        if self.shallow is not None:
            try:
                self._widen(found)
                kernels = run_depth.widen_counts(kernels, self.routed_at, self.shallow)
            except run_depth.NotRepeating:
                return _DryRun(self.full, self.sizes, widen=False).run()
        return self._result(found, kernels, started)

    def _recording_key(self) -> Hashable | None:
        """What a shallow run's recording depends on: the sizes on the few-layer device_map and the kept layers'
        work. Device_maps that differ only in where a stretch of like layers ends (a memory share, a strategy) run
        the same few layers on the same devices: one recording, widened to each (None: a full-depth run)."""
        if self.shallow is None:
            return None
        return replace(self.sizes, device_map=tuple(self.device_map.items())), self.shallow.kept_work

    def _new_tracker(self) -> Any:
        """A tracker for this run's devices, with the (few-layer) model's weights counted on theirs."""
        self.tracker = dryrun.tracker(device_labels(self.device_map), max_ops=op_budget(self.full))
        dryrun.track_weights(self.tracker, self.model, self.device_map)
        self.weights = list(self.tracker.totals)
        return self.tracker

    def _record(self) -> run_store.Recording:
        """generate()'s prefill and decode step under the tracker, before any widening."""
        self._new_tracker()
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
        track = self.tracker
        timeline = flat(track.timeline, len(track.devices))
        return run_store.Recording(found, timeline, tuple(track.devices), tuple(track.largest), tuple(self.weights),
                                   tuple(self.starts), tuple(self.routed_at), self.created,
                                   dict(routed.routed))  # fmt: skip

    def _replay(self, recorded: run_store.Recording) -> tuple[dict[str, Any], dict[str, int]]:
        """This run's state as the recording left it (each run widens its own copies)."""
        self.devices, self.largest = list(recorded.devices), list(recorded.largest)
        self.table = as_table(recorded.points, len(self.devices))
        self.weights, self.starts, self.routed_at = (
            list(recorded.weights),
            list(recorded.starts),
            list(recorded.routed_at),
        )
        self.created = recorded.created
        return dict(recorded.found), dict(recorded.kernels)

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
        devices = self.devices
        before, after = found.pop("layers"), found.pop("decode_layers")
        created_at, created = self.created
        if before is None or after is None or created is None:
            raise run_depth.NotRepeating("no per-layer cache made before the prefill")
        weights = self.weights + [0] * (len(devices) - len(self.weights))
        extra = tuple(self.shallow.added_weights.get(d, 0) for d in devices)
        made = (created_at, run_depth.added_bytes(created, self.shallow, devices))
        self.table, found["split"] = run_depth.widen_timeline(
            self.table, self.starts, found["split"], self.shallow, extra, made=made
        )
        run_depth.widen_cache(found, self.shallow, before, after)
        self.weights = [w + e for w, e in zip(weights, extra, strict=True)]

    @contextlib.contextmanager
    def _measured(self) -> Iterator[Any]:
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

        with (
            torch.no_grad(),
            meta_build.quiet(),
            no_value_checks(),
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
        n = len(self.devices)
        top = self.table.max(dim=0).values.tolist() if len(self.table) else [0] * n
        weights = self.weights + [0] * (n - len(self.weights))
        out = {}
        for i, device in enumerate(self.devices):
            peak = max(top[i], weights[i])
            if peak or cache_on.get(device) or weights[i]:
                cache, decode = cache_on.get(device, 0), decode_on.get(device, 0)
                out[device] = DeviceRun(weights[i], cache, decode, peak, self.largest[i])
        return out

    def _result(self, found: dict[str, Any], kernels: dict[str, int], started: float) -> TrackedRun:
        s = self.sizes
        weights = sum(self.weights)
        split = found["split"]
        prefill, decode = most_together(self.table[:split], weights), most_together(self.table[split:], 0)
        held, state, cross = found["parts"]
        devices = self._per_device(found["cache_on"], found["decode_on"])
        estimate = RunEstimate(
            batch=s.batch, context=s.context, prompt_tokens=s.prompt, encoder_tokens=self.encoder_tokens,
            weight_bytes=weights, cache_bytes=held, cache_decode_bytes=found["decode_held"], state_bytes=state,
            cross_cache_bytes=cross, activation_bytes=max(prefill - weights - held, 0), prefill_peak_bytes=prefill,
            decode_peak_bytes=decode, cache_class=found["cache_class"], layer_classes=found["classes"],
            kernels=kernels, logits_to_keep=self.keep, target=s.target, padding=s.padding, devices=devices,
            not_covered=run_notes(self.model, s.target, kernels, len(devices)) + found["cache_notes"],
            seconds=time.perf_counter() - started,
        )  # fmt: skip
        return TrackedRun(estimate, self.table, list(self.devices))

    def _forward_only(self, started: float) -> TrackedRun:
        """Models that don't generate (encoders such as BERT): one forward at batch x context, no cache."""
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

        s = self.sizes
        self._new_tracker()
        with self._measured() as routed:
            ids = torch.zeros(s.batch, s.context, dtype=torch.long, device=self.dev)
            mask = self._caller_mask(s.context)
            out = self.model(input_ids=ids, **({} if mask is None else {"attention_mask": mask}))
            del out, ids, mask
        track = self.tracker
        self.table = table(track.timeline, len(track.devices))
        self.devices, self.largest = list(track.devices), list(track.largest)
        weights = sum(self.weights)
        peak = most_together(self.table, weights)
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
        return TrackedRun(estimate, self.table, list(self.devices))


_MODULES: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def modules(model: Any) -> int:
    """How many modules a model has (remembered: an 80-layer model has ~1,000)."""
    if model not in _MODULES:
        _MODULES[model] = sum(1 for _ in model.modules())
    return _MODULES[model]


def op_budget(model: Any) -> int:
    """The most ops a dry run of this model may dispatch before it is called a loop over tokens."""
    return max(MIN_OPS, OPS_PER_MODULE * modules(model))


# Per model object (weakly: a model that is gone takes its results with it; id() would be reused by the next one).
_RESULTS: weakref.WeakKeyDictionary[Any, OrderedDict[Sizes, TrackedRun]] = weakref.WeakKeyDictionary()


_RESULTS_LOCK = threading.Lock()


RESULT_CACHE_SIZE = 64  # per model


def tracked_run(model: Any, sizes: Sizes) -> TrackedRun:
    """A dry run, remembered per model object and sizes: a plan asked again costs nothing."""
    sizes.check()
    with _RESULTS_LOCK:
        known = _RESULTS.setdefault(model, OrderedDict())
        if sizes in known:
            known.move_to_end(sizes)
            return known[sizes]
    with run_lock:
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
    with run_lock:
        run_store.forget()


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
    first = tracked_run(model, asked).estimate
    if asked.prompt == context - 1 or not model.can_generate():
        return first
    full = tracked_run(model, replace(asked, prompt=context - 1)).estimate
    return replace(first, cache_decode_bytes=full.cache_decode_bytes, decode_peak_bytes=full.decode_peak_bytes,
                   seconds=first.seconds + full.seconds)  # fmt: skip
