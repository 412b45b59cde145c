"""Ground truth for the run planner's tests: a real ``generate()`` on CPU, measured two independent ways.

- MemTracker's storage accounting on real tensors (nbhw's lean tracker: MemTracker proper refuses generate()'s
  repeated forwards), so it checks the *dry run* (meta kernels, routing, the generate() steps), not the tracker;
- torch.profiler ``profile_memory=True``: the CPU allocator's own alloc / free events (c10 allocator level, so it
  also sees kernel-internal buffers MemTracker cannot), summed in order for the peak.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode

from nbhw.core.hf.dryrun import storage_bytes, tracker
from nbhw.core.plan.run_parts import cache_parts, default_encoder_tokens, encoder_inputs


@dataclass
class RealRun:
    """A real generate() of ``new_tokens`` tokens: what its cache holds at the end, and its peaks."""

    cache_bytes: int
    tracker_peak: int  # torch's MemTracker accounting: weights + inputs + everything generate() allocated
    profiler_peak: int  # allocator events: weights (nbytes) + peak of the running sum of CPU alloc/free events
    cache_class: str
    state_bytes: int = 0
    cross_bytes: int = 0
    kv_bytes: int = 0  # keys / values of the (self-attention) layers only
    layer_bytes: tuple[int, ...] = ()  # keys / values per cache layer, in layer order


def weights(model: Any) -> int:
    return storage_bytes([*model.parameters(), *model.buffers()])


def profiled_peak(events: Any) -> int:
    """The highest running sum of the CPU allocator's alloc / free events."""
    running = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        if event.name() == "[memory]" and event.device_type() == torch.autograd.DeviceType.CPU:
            running += event.nbytes()
            peak = max(peak, running)
    return peak


def generate_inputs(model: Any, batch: int, prompt: int, encoder_tokens: int | None) -> dict[str, Any]:
    """What a user passes to generate(): token ids (decoder prompt for encoder-decoder models), encoder input."""
    if getattr(model.config, "is_encoder_decoder", False):
        enc_tokens = encoder_tokens or default_encoder_tokens(model, prompt + 1)
        enc = encoder_inputs(model, batch, enc_tokens, torch.device("cpu"))
        start = model.generation_config.decoder_start_token_id
        start = start if isinstance(start, int) else 0
        dec = torch.full((batch, prompt), 5, dtype=torch.long)
        dec[:, 0] = start
        return {model.main_input_name: enc, "decoder_input_ids": dec}
    return {"input_ids": torch.randint(3, 50, (batch, prompt))}


def _layer_bytes(cache: Any) -> tuple[int, ...]:
    return tuple(
        storage_bytes([t for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if t is not None])
        for layer in getattr(cache, "layers", [])
    )


def real_generate(
    model: Any,
    *,
    batch: int,
    prompt: int,
    new_tokens: int,
    encoder_tokens: int | None = None,
    generation: dict[str, Any] | None = None,
    inputs: dict[str, Any] | None = None,
    profiled: bool = True,
) -> RealRun:
    """generate() for real on CPU: ``new_tokens`` = 1 is the prefill alone, 2 the prefill and one decode step.

    ``inputs``: what the caller passes (a tokenizer's batch: input_ids and attention_mask), held for the whole run;
    by default token ids alone, ``batch`` x ``prompt``. ``profiled=False``: the tensor-level peak alone (the
    allocator's is then 0), for half the time."""
    inputs = inputs if inputs is not None else generate_inputs(model, batch, prompt, encoder_tokens)
    options = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        return_dict_in_generate=True,
        **(generation or {}),
    )
    torch.manual_seed(0)
    track = tracker()
    track.track_on("cpu", model, *inputs.values())
    with track:
        out = model.generate(**inputs, **options)
    tracker_peak = max([sum(p) for p in track.timeline], default=track.current)
    cache = out.get("cache")
    cache_bytes, state_bytes, cross_bytes = cache_parts(cache)
    layers = _layer_bytes(getattr(cache, "self_attention_cache", cache))
    cache_class = type(cache).__name__ if cache is not None else "none"
    del out, cache
    if not profiled:
        return RealRun(cache_bytes, tracker_peak, 0, cache_class, state_bytes, cross_bytes, sum(layers), layers)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        out = model.generate(**inputs, **options)
    del out
    inputs_bytes = storage_bytes([v for v in inputs.values() if isinstance(v, torch.Tensor)])
    peak = weights(model) + inputs_bytes + profiled_peak(prof.profiler.kineto_results.events())
    return RealRun(cache_bytes, tracker_peak, peak, cache_class, state_bytes, cross_bytes, sum(layers), layers)


def real_forward(model: Any, *, batch: int, tokens: int) -> RealRun:
    """One forward of an encoder-only model, measured the same two ways."""
    from torch.distributed._tools.mem_tracker import MemTracker

    ids = torch.randint(3, 50, (batch, tokens))
    track = MemTracker()  # one forward: torch's tracker as it ships
    track.track_external(model, ids)
    with torch.no_grad(), track:
        model(input_ids=ids)
    tracker_peak = sum(snap["Total"] for snap in track.get_tracker_snapshot("peak").values())
    with (
        torch.no_grad(),
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof,
    ):
        model(input_ids=ids)
    peak = weights(model) + ids.nbytes + profiled_peak(prof.profiler.kineto_results.events())
    return RealRun(0, tracker_peak, peak, "none")


class _Stream:
    """A CUDA stream where there is none: waits and stream contexts order nothing (the CPU runs ops in order)."""

    def wait_stream(self, other: Any) -> None:
        return None

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _default_stream(device: Any = None) -> _Stream:
    return _Stream()


class _CopyToHost(TorchFunctionMode):
    """``tensor.to("cpu", non_blocking=True)`` copies, as the device-to-host transfer of an offloaded layer does (on
    the CPU torch returns the tensor itself, so a view would keep its whole storage)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.to and kwargs.get("non_blocking") and tuple(args[1:]) == ("cpu",):
            kwargs = {**kwargs, "copy": True}
        return func(*args, **kwargs)


@contextlib.contextmanager
def offloading_on_cpu() -> Iterator[None]:
    """transformers' offloaded cache run for real on the CPU, faked only where the accelerator would be: its CUDA
    streams (``torch.Stream``, ``torch.cuda.default_stream``) order nothing, and offloading a layer copies it."""
    with (
        mock.patch.object(torch, "Stream", _Stream),
        mock.patch.object(torch.cuda, "default_stream", _default_stream),
        _CopyToHost(),
    ):
        yield
