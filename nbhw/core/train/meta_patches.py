"""Where the meta device can't answer as the target would, the dry run answers the target's way
(:mod:`nbhw.core.train.step`): the tracker's phases, checkpointing's recompute routed to the target's attention
kernel, packed-row questions answered "no", autocast and grouped_mm as on the device."""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from typing import Any

from nbhw.core.hf import dryrun
from nbhw.core.hf.tensor_parallel import PATCH_LOCK


class _NoHook:
    def remove(self) -> None:
        pass


class _Training:
    """The methods of :func:`tracker_class`'s class, mixed in before torch's ``MemTracker`` (made on first use).

    torch 2.13's MemTracker registers a gradient hook on every parameter of each module it enters, and
    ``register_hook`` refuses a tensor that doesn't require grad: any LoRA / frozen model fails. A dummy handle
    for frozen parameters makes it skip them; their memory is still tracked as parameters.
    """

    _param_to_grad_hook_handles: dict[Any, Any]  # MemTracker's
    _mod_tracker: Any
    memory_tracking: Any
    _curr_mem_snap: dict[Any, dict[Any, int]]
    _peak_mem: dict[Any, int]
    _peak_mem_snap: dict[Any, dict[Any, int]]
    _fake_mode_on_entry: Any
    timeline: Any = None
    largest: int = 0  # the largest block the step made (set back to 0 after the weights are registered)
    _changed: bool = True  # the current snapshot changed since the peak was last updated

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # FakeTensor answers each C++ device() query through dispatch: half the ops of an FSDP2 step. MemTracker's
        # handling of one (it allocates nothing) is its peak update alone, and that is a no-op unless the snapshot
        # changed since the last update (frees, resizes and hooks change it between ops) or a timeline records
        # every op; so only then is it run, and the figures are the same.
        query, dtensor, active_fake_mode = _device_query()
        if func is not query or dtensor in types:
            return super().__torch_dispatch__(func, types, args, kwargs)  # type: ignore[misc]
        out = func(*args, **(kwargs or {}))
        if (self._changed or self.timeline is not None) and active_fake_mode() is self._fake_mode_on_entry:
            self._update_peak_stats(None)
        return out

    def _update_snap(self, u_type: Any, winfo: Any, *args: Any, **kwargs: Any) -> None:
        self._changed = True
        super()._update_snap(u_type, winfo, *args, **kwargs)  # type: ignore[misc]
        if winfo.mem_consumed > self.largest and getattr(u_type, "name", None) == "ADD":
            self.largest = winfo.mem_consumed

    def _track_module_params_and_buffers(self, module: Any, install_grad_hooks: bool = True) -> Any:
        for p in module.parameters():
            if not p.requires_grad and p not in self._param_to_grad_hook_handles:
                self._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
        return super()._track_module_params_and_buffers(module, install_grad_hooks)  # type: ignore[misc]

    def _pre_fw_hook(self, module: Any, inputs: Any) -> None:
        # MemTracker refuses a module's second forward (gradient accumulation, step 2) unless its per-module
        # stats are cleared; they are not what the plan reports, so a fresh forward starts them again.
        if not self._mod_tracker.is_bw:
            self.memory_tracking.pop(module, None)
        super()._pre_fw_hook(module, inputs)  # type: ignore[misc]

    def _update_peak_stats(self, peak_state: Any) -> None:
        # The device-wide peak only. MemTracker also updates every live module's own peak on every op (a loop
        # over all modules with a deepcopy per new peak): quadratic in depth, minutes for an 80-layer model,
        # and per-module peaks are not what the plan reports.
        self._changed = False
        total_key, grad = _mem_keys()
        for dev, snap in self._curr_mem_snap.items():
            total = snap[total_key]
            if self._peak_mem.get(dev, 0) < total:
                self._peak_mem[dev] = total
                self._peak_mem_snap[dev] = dict(snap)
        if self.timeline is not None:
            snaps = self._curr_mem_snap.values()
            self.timeline.record(self, sum(s[total_key] for s in snaps), sum(s[grad] for s in snaps))


@functools.cache
def _mem_keys() -> tuple[Any, Any]:
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, _MemRefType  # lazy: import nbhw stays free of torch

    return _TOTAL_KEY, _MemRefType.GRAD


@functools.cache
def _device_query() -> tuple[Any, type, Any]:
    """The op a tensor's device() query dispatches, with what MemTracker checks before handling an op."""
    import torch  # lazy: import nbhw stays free of torch
    from torch._guards import active_fake_mode  # lazy: import nbhw stays free of torch
    from torch.distributed.tensor import DTensor  # lazy: import nbhw stays free of torch

    return torch.ops.prim.device.default, DTensor, active_fake_mode


@functools.cache
def tracker_class() -> type:
    """torch's MemTracker with :class:`_Training`'s answers: frozen parameters, repeated forwards, one peak."""
    from torch.distributed._tools.mem_tracker import MemTracker  # lazy: import nbhw stays free of torch

    return type("TrainTracker", (_Training, MemTracker), {"__module__": __name__})


def recompute_contexts(target: str) -> tuple[Any, Any]:
    """checkpoint's context_fn: the recompute in backward runs outside any torch-function mode (autograd clears
    them), so the attention and grouped_mm routing is entered again there."""
    return contextlib.nullcontext(), _recompute_routing(target)


@contextlib.contextmanager
def _recompute_routing(target: str) -> Iterator[None]:
    with dryrun.attention_as_on(target), grouped_mm_as_on_device():
        yield


@contextlib.contextmanager
def _unpacked_rows() -> Iterator[None]:
    """Answer transformers' data questions as the dry run's rows do: one sequence per row, nothing packed, no
    padding.

    Not ``masking_utils.is_tracing``: answering "tracing" makes transformers build the packed-sequence mask, a
    batch x T x T boolean tensor the real step never holds, and lose SDPA's is_causal fast path. The padding
    question is ``warn_if_padding_and_no_attention_mask`` (GPT-2, OPT, BERT ... with a ``pad_token_id``): it looks
    for the pad token in the ids (a ``.item()``) only to log a warning, and only without an attention mask; the
    emitted cell's collator always hands one, so the real step never asks.
    """
    from transformers import PreTrainedModel, masking_utils  # lazy: import nbhw stays free of transformers

    with PATCH_LOCK:
        packed = masking_utils.find_packed_sequence_indices
        padded = PreTrainedModel.warn_if_padding_and_no_attention_mask
        masking_utils.find_packed_sequence_indices = lambda position_ids: None
        PreTrainedModel.warn_if_padding_and_no_attention_mask = lambda self, input_ids, attention_mask: None
        try:
            yield
        finally:
            masking_utils.find_packed_sequence_indices = packed
            PreTrainedModel.warn_if_padding_and_no_attention_mask = padded


@contextlib.contextmanager
def _autocast_on_meta() -> Iterator[None]:
    """``torch.autocast(device_type="meta", ...)`` as the device answers it: peft folds LoRA into an MoE model's
    expert weights (3-D parameters: ``lora_target_modules="all-linear"`` reaches them) under
    ``torch.autocast(W.device.type, enabled=False)``, and torch has no autocast for "meta" (it raises). The
    context is entered for the CPU instead: autocast only recasts tensors of its own device, so no meta op
    changes, as on the device for a disabled one (an enabled one is the upcast the notes already leave out)."""
    import torch  # lazy: import nbhw stays free of torch

    with PATCH_LOCK:
        original = torch.autocast

        class autocast(original):  # type: ignore[valid-type, misc]
            def __init__(self, device_type: str, *args: Any, **kwargs: Any) -> None:
                super().__init__("cpu" if device_type == "meta" else device_type, *args, **kwargs)

        torch.autocast = autocast  # type: ignore[misc]
        try:
            yield
        finally:
            torch.autocast = original  # type: ignore[misc]


class _GroupedMm:
    """The methods of :func:`grouped_mm_as_on_device`'s mode (a TorchFunctionMode, made on first use)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        t = dryrun._torch()
        if func in t.grouped_mm and _refused_by_meta(args, kwargs, t.torch):
            return dryrun._grouped_mm_on_meta().apply(args[0], args[1], kwargs["offs"])
        return func(*args, **kwargs)


def _refused_by_meta(args: Any, kwargs: dict[str, Any], torch: Any) -> bool:
    """A grouped_mm on fake tensors (FSDP2's step) that its meta registration would refuse: it applies CUDA's
    bfloat16-only check, while the CPU kernel (what transformers' ``_can_use_grouped_mm`` picks on a CPU with
    torch >= 2.9) and CUDA's own fallback take any float dtype. Meta tensors are the run planner's routing's."""
    first = args[0] if args else None
    return (
        isinstance(first, torch.Tensor)
        and first.device.type != "meta"
        and first.dtype != torch.bfloat16
        and kwargs.get("offs") is not None
    )


@functools.cache
def _grouped_mm_class() -> type:
    from torch.overrides import TorchFunctionMode  # lazy: import nbhw stays free of torch

    return type("GroupedMmAsOnDevice", (_GroupedMm, TorchFunctionMode), {"__module__": __name__})


@contextlib.contextmanager
def grouped_mm_as_on_device() -> Iterator[None]:
    """Within the block, an MoE's float32 / float16 grouped_mm on FSDP2's fake tensors runs as on the device: the
    output of transformers' own fallback op under torch's grouped_mm autograd rule (the run planner's answer for
    meta tensors, :func:`nbhw.core.hf.dryrun.attention_as_on`), not the meta registration's refusal."""
    with _grouped_mm_class()():
        yield


@contextlib.contextmanager
def sharded_step_context() -> Iterator[None]:
    """What FSDP2's step on fake CPU tensors needs to run as it would on the device."""
    with _unpacked_rows(), grouped_mm_as_on_device(), quiet_tracking():
        yield


@contextlib.contextmanager
def meta_step_context(target: str) -> Iterator[None]:
    """Everything a meta-device step needs to run as it would on the device (see the module docstring)."""
    with _unpacked_rows(), _autocast_on_meta(), dryrun.attention_as_on(target), quiet_tracking():
        yield


@contextlib.contextmanager
def quiet_tracking() -> Iterator[None]:
    """Without the warnings the dry step itself causes, which say nothing about the user's run: MemTracker's module
    tracker on a module entered without a forward of its own ("hierarchy tracking maybe messed up"), and peft's
    reading of transformers' deprecated ``is_gradient_checkpointing`` (transformers 5.25)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The module hierarchy tracking", category=UserWarning)
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def snapshot(tracker: Any, kind: str, device: Any) -> dict[str, int]:
    import torch  # lazy: import nbhw stays free of torch

    snap = tracker.get_tracker_snapshot(kind).get(torch.device(device), {})
    return {str(getattr(k, "value", k)): int(v) for k, v in snap.items()}
