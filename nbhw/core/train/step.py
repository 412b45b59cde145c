"""Training plans: one real training step of the model transformers builds, run on the meta device and measured.

The step is the one ``Trainer`` runs (forward with labels, backward, ``clip_grad_norm_``, ``optimizer.step()``,
``zero_grad``), on the model ``from_config`` builds, with peft's own ``get_peft_model`` for LoRA and transformers'
own bitsandbytes quantizer for the 4-bit base of QLoRA, and the optimizer ``Trainer.create_optimizer`` makes for the
``optim`` name. Memory is measured by torch's allocator-level ``MemTracker`` on meta tensors, never by a formula.

Where the meta device cannot answer as the target device would, the dry run answers the target's way and says so:
- SDPA: on meta it always decomposes to the math path (a batch x heads x T x T matrix saved for backward); CPU and
  CUDA run a fused kernel that saves only the output and a log-sum-exp. The run planner's routing
  (:func:`nbhw.core.hf.dryrun.attention_as_on`) sizes each call as the target's kernel, and checkpointing's recompute
  in backward (which runs outside torch-function modes) enters it again through checkpoint's ``context_fn``.
- The model is the run planner's meta build (:func:`nbhw.core.plan.run.build`: ``from_config`` plus the dtype plan
  ``from_pretrained`` applies), then what the cell does to it: the 4-bit quantizer, peft, checkpointing.
- Masks: with ``use_cache=False`` (what Trainer sets) transformers asks whether the rows hold packed sequences
  (a ``.item()``); the dry run's rows are one sequence each, so it answers "no", as the real data does.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from nbhw.core.errors import UserError
from nbhw.core.hf import dryrun
from nbhw.core.hf.depth import decoder_layers, layer_signature
from nbhw.core.plan import run
from nbhw.core.train.arguments import TrainArgs

# QLoRA's 4-bit base: NF4 (the QLoRA paper's data type), one level of quantization constants.
QUANT_TYPE = "nf4"
DOUBLE_QUANT = False


CAUSAL_LM = "AutoModelForCausalLM"  # what the emitted cell loads with


def attention_target(args: TrainArgs) -> str:
    """Whose SDPA kernel sizes the attention (nbhw.core.hf.dryrun.attention_as_on): torch's own CPU rule for a CPU
    plan, CUDA's flash / memory-efficient constraints for a GPU plan."""
    return "cpu" if args.device_type == "cpu" else "cuda"


def training_defaults() -> types.SimpleNamespace:
    """TrainingArguments' field defaults, read from the dataclass without running __post_init__.

    ``TrainingArguments(...)`` sets up devices and, with bf16/fp16, checks support by allocating on the GPU; the
    planner only needs the defaults (optim's kwargs, max_grad_norm, use_cache, weight_decay).
    """
    from transformers import TrainingArguments  # lazy: import nbhw stays free of transformers

    values: dict[str, Any] = {}
    for f in dataclasses.fields(TrainingArguments):
        if f.default is not dataclasses.MISSING:
            values[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            values[f.name] = f.default_factory()
    return types.SimpleNamespace(**values)


# --------------------------------------------------------------------------------------------- model builds


def _torch_dtype(name: str) -> Any:
    import torch  # lazy: import nbhw stays free of torch

    return getattr(torch, name)


def quantization_config(args: TrainArgs) -> Any:
    """The BitsAndBytesConfig the emitted cell passes for QLoRA."""
    from transformers import BitsAndBytesConfig  # lazy: import nbhw stays free of transformers

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=QUANT_TYPE,
        bnb_4bit_compute_dtype=_torch_dtype(args.dtype),
        bnb_4bit_use_double_quant=DOUBLE_QUANT,
    )


def _quantize_on_meta(model: Any, args: TrainArgs) -> Any:
    """The 4-bit base as from_pretrained makes it, on meta: transformers' quantizer swaps in bnb Linear4bit, then
    each weight is packed by bitsandbytes' own quantize_4bit, whose registered fake kernel runs on meta."""
    import bitsandbytes as bnb  # lazy: optional, imported when a plan needs it
    import torch  # lazy: import nbhw stays free of torch
    from transformers.quantizers.auto import AutoHfQuantizer  # lazy: import nbhw stays free of transformers

    quantizer = AutoHfQuantizer.from_config(quantization_config(args), pre_quantized=False)
    quantizer.preprocess_model(model, device_map={"": "cpu"})
    for name, param in list(model.named_parameters()):
        if not quantizer.param_needs_quantization(model, name):
            continue
        module = model.get_submodule(name.rpartition(".")[0])
        packed = bnb.nn.Params4bit(param.data, requires_grad=False, **param.__dict__)
        packed.module = module
        module.weight = packed._quantize(torch.device("meta"))
    quantizer.postprocess_model(model)
    return model


def quant_state_tensors(model: Any) -> list[Any]:
    """The tensors a bnb 4-bit weight keeps beside its packed data (absmax, code, nested stats): not parameters,
    so a tracker that walks parameters and buffers would miss them."""
    out: list[Any] = []
    for module in model.modules():
        state = getattr(getattr(module, "weight", None), "quant_state", None)
        if state is None:
            continue
        out += [state.absmax, state.code]
        if state.nested:
            out += [state.offset, state.state2.absmax, state.state2.code]
    return out


def linear_layer_names(model: Any) -> list[str]:
    """The model's linear layers as LoRA target names (peft's own "all-linear" rule, last name component)."""
    from peft import LoraConfig  # lazy: optional, imported when a plan needs it
    from peft.tuners.tuners_utils import (
        _maybe_include_all_linear_layers,
    )  # lazy: optional, imported when a plan needs it

    found = _maybe_include_all_linear_layers(LoraConfig(target_modules="all-linear"), model).target_modules
    return sorted({name.rsplit(".", 1)[-1] for name in found})


def lora_config(args: TrainArgs) -> Any:
    from peft import LoraConfig  # lazy: optional, imported when a plan needs it

    targets = args.lora_target_modules
    return LoraConfig(
        r=args.lora_r,
        lora_alpha=args.alpha,
        target_modules=list(targets) if isinstance(targets, tuple) else targets,
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )


def _apply_lora(model: Any, args: TrainArgs) -> Any:
    from peft import get_peft_model  # lazy: optional, imported when a plan needs it
    from peft.utils.error import NoMatchingPeftModuleError  # lazy: optional, imported when a plan needs it

    names = linear_layer_names(model)
    try:
        return get_peft_model(model, lora_config(args))
    except (ValueError, NoMatchingPeftModuleError) as exc:
        listed = f"its linear layers: {', '.join(names)} (or 'all-linear')"
        if args.lora_target_modules is None:
            kind = getattr(model.config, "model_type", "?")
            raise UserError(
                f"peft has no default LoRA target modules for model type {kind!r}; pass lora_target_modules: {listed}"
            ) from None
        if "not found in the base model" in str(exc):
            raise UserError(
                f"lora_target_modules {args.lora_target_modules!r} match no layer of this model; {listed}"
            ) from None
        raise


def build_for_training(config: Any, args: TrainArgs) -> Any:
    """The model the emitted cell trains, built on the meta device (no weights) through transformers' own code."""
    built = run.build(config, dtype=args.dtype, auto_name=CAUSAL_LM, attn_implementation=None)
    if not built.ok:
        raise UserError(f"transformers can't build this model for causal-LM training: {built.error}")
    model = built.model
    if args.method == "qlora":
        _quantize_on_meta(model, args)
    return prepare_for_training(model, args, meta=True)


def load_for_training(path: str, args: TrainArgs, *, device: str = "cpu") -> Any:
    """The same model loaded for real, as the emitted cell loads it (tests run the step on it)."""
    import transformers  # lazy: import nbhw stays free of transformers

    kwargs: dict[str, Any] = {"dtype": _torch_dtype(args.dtype), "device_map": device}
    if args.method == "qlora":
        kwargs["quantization_config"] = quantization_config(args)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, **kwargs)
    return prepare_for_training(model, args, meta=False)


def prepare_for_training(model: Any, args: TrainArgs, *, meta: bool) -> Any:
    """What the emitted cell and Trainer do between loading and the first step, in their order."""
    model.config.use_cache = training_defaults().use_cache  # what Trainer sets before training
    if args.method == "qlora":
        from peft import prepare_model_for_kbit_training  # lazy: optional, imported when a plan needs it

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=args.gradient_checkpointing)
    if args.method in ("lora", "qlora"):
        model = _apply_lora(model, args)
    if args.gradient_checkpointing:
        # What Trainer does with activation_checkpointing=True (use_reentrant=False is transformers' default).
        # On meta the recompute in backward runs outside any torch-function mode (autograd clears them), so
        # the fused-attention answer is re-entered there through checkpoint's own context_fn hook.
        recompute = functools.partial(_recompute_contexts, attention_target(args))
        kwargs = {"use_reentrant": False, "context_fn": recompute} if meta else None
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    model.train()
    return model


def create_optimizer(model: Any, args: TrainArgs, device_type: str | None = None) -> Any:
    """The optimizer ``Trainer.create_optimizer`` makes for ``optim`` (its decay groups, its 8-bit overrides).

    ``device_type``: the device the plan is for. torch picks an optimizer's implementation from where the
    parameters live (foreach on CUDA, one tensor at a time on CPU); meta parameters would get the CPU choice,
    so for an accelerator the choice torch makes there (``_default_to_fused_or_foreach``'s rule, read from
    ``_get_foreach_kernels_supported_devices``) is set explicitly. Fused kernels refuse meta tensors: a fused
    optimizer is sized with foreach (its temporaries are an overestimate of fused's).
    """
    from transformers import Trainer  # lazy: import nbhw stays free of transformers

    trainer_args = training_defaults()
    trainer_args.optim = args.optimizer
    stand_in = types.SimpleNamespace(
        model=model,
        args=trainer_args,
        optimizer=None,
        optimizer_cls_and_kwargs=None,
        get_optimizer_cls_and_kwargs=Trainer.get_optimizer_cls_and_kwargs,
    )
    stand_in.get_decay_parameter_names = lambda m: Trainer.get_decay_parameter_names(stand_in, m)
    optimizer = Trainer.create_optimizer(stand_in)
    if device_type is not None:
        _implementation_for(optimizer, device_type)
    return optimizer


def _implementation_for(optimizer: Any, device_type: str) -> None:
    from torch.utils._foreach_utils import (
        _get_foreach_kernels_supported_devices,
    )  # lazy: import nbhw stays free of torch

    foreach = device_type in _get_foreach_kernels_supported_devices()
    for group in optimizer.param_groups:
        if group.get("fused"):
            group["fused"] = False
            group["foreach"] = True
        elif "foreach" in group and group["foreach"] is None:
            group["foreach"] = foreach


def training_batch(args: TrainArgs, vocab_size: int, *, device: str, batch: int | None = None) -> dict[str, Any]:
    """What DataCollatorForLanguageModeling hands the model for rows of ``context`` tokens without padding.

    The all-ones attention mask is left out: transformers drops it anyway (``_ignore_causal_mask_sdpa``) and
    the step is the same; the dry run then answers the one question it asks instead (see ``_unpacked_rows``).
    """
    import torch  # lazy: import nbhw stays free of torch

    rows = batch or args.batch
    if device == "meta":
        ids = torch.empty(rows, args.context, dtype=torch.long, device="meta")
    else:
        ids = torch.randint(0, vocab_size, (rows, args.context), device=device)
    return {"input_ids": ids, "labels": ids}


def train_step(
    model: Any, optimizer: Any, batch: dict[str, Any], *, accumulation: int = 1, max_grad_norm: float | None = None
) -> None:
    """One optimizer step as Trainer runs it: micro-batches forward+backward, clip, step, zero_grad."""

    for _ in range(accumulation):
        loss = model(**batch).loss  # the output object (logits) is dropped here, as compute_loss drops it
        (loss / accumulation).backward()
        del loss
    if max_grad_norm:
        clip_gradients(model, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def clip_gradients(model: Any, max_norm: float) -> None:
    """Trainer's clip: one norm per device mesh when the gradients are DTensors on different meshes (TP), else
    clip_grad_norm_ (what accelerator.clip_grad_norm_ runs outside FSDP / DeepSpeed)."""
    import torch  # lazy: import nbhw stays free of torch
    from transformers import Trainer  # lazy: import nbhw stays free of transformers
    from transformers.trainer import has_mixed_dtensor  # lazy: import nbhw stays free of transformers

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if has_mixed_dtensor(grads):
        Trainer._mixed_mesh_grad_norm(None, model, max_norm)
    else:
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], max_norm)


# --------------------------------------------------------------------------------------------- meta answers


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
    timeline: Any = None
    largest: int = 0  # the largest block the step made (set back to 0 after the weights are registered)

    def _update_snap(self, u_type: Any, winfo: Any, *args: Any, **kwargs: Any) -> None:
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
def tracker_class() -> type:
    """torch's MemTracker with :class:`_Training`'s answers: frozen parameters, repeated forwards, one peak."""
    from torch.distributed._tools.mem_tracker import MemTracker  # lazy: import nbhw stays free of torch

    return type("TrainTracker", (_Training, MemTracker), {"__module__": __name__})


def _recompute_contexts(target: str) -> tuple[Any, Any]:
    """checkpoint's context_fn: the recompute in backward runs outside any torch-function mode (autograd clears
    them), so the attention and grouped_mm routing is entered again there."""
    return contextlib.nullcontext(), _recompute_routing(target)


@contextlib.contextmanager
def _recompute_routing(target: str) -> Iterator[None]:
    with dryrun.attention_as_on(target), grouped_mm_as_on_device():
        yield


_PATCH_LOCK = threading.RLock()


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

    with _PATCH_LOCK:
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

    with _PATCH_LOCK:
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
    with _unpacked_rows(), grouped_mm_as_on_device():
        yield


@contextlib.contextmanager
def meta_step_context(target: str) -> Iterator[None]:
    """Everything a meta-device step needs to run as it would on the device (see the module docstring)."""
    with _unpacked_rows(), _autocast_on_meta(), dryrun.attention_as_on(target):
        yield


# --------------------------------------------------------------------------------------------- the estimate


@dataclass
class StepMemory:
    """What one training step holds on one device, bytes, as the allocator-level tracker saw it."""

    weights: int  # parameters + buffers (+ 4-bit quant state) before the step
    trainable_parameters: int  # count
    parameters: int  # count (packed 4-bit weights counted as their unpacked element count)
    trainable_bytes: int
    gradients: int  # gradients held at the end of backward
    optimizer_states: int  # optimizer state kept between steps
    forward_backward_peak: int  # step 1, before the optimizer has state
    optimizer_step_peak: int
    peak: int  # the steady-state peak (step 2 onwards)
    activations: int  # the forward/backward peak less weights and gradients held then
    peak_phase: str
    breakdown: dict[str, int] = field(default_factory=dict)  # the tracker's categories at the peak
    notes: list[str] = field(default_factory=list)
    # Step 1 as Trainer.train() runs it: what it prepares before the first forward (FSDP2: accelerate shards the
    # whole model), then the step without optimizer state. ``whole_model``: the model before sharding (bytes).
    first_step_peak: int = 0
    largest_block: int = 0  # the largest block the step made: what the allocator's margin is sized by
    preparation_peak: int = 0
    whole_model: int = 0
    # The trainable parameters backward gave a gradient ("name|stride", layer index as *).
    with_gradient: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _snapshot(tracker: Any, kind: str, device: Any) -> dict[str, int]:
    import torch  # lazy: import nbhw stays free of torch

    snap = tracker.get_tracker_snapshot(kind).get(torch.device(device), {})
    return {str(getattr(k, "value", k)): int(v) for k, v in snap.items()}


def local_nbytes(t: Any) -> int:
    """Bytes this rank holds for ``t`` (a DTensor's local shard)."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return int(local.nbytes)


def _unpacked_numel(p: Any) -> int:
    state = getattr(p, "quant_state", None)
    return int(math.prod(state.shape)) if state is not None else int(p.numel())


def measure_step(
    model: Any,
    optimizer: Any,
    batch: dict[str, Any],
    args: TrainArgs,
    *,
    device: Any,
    extra: list[Any] | None = None,
    timeline: Any = None,
) -> StepMemory:
    """Run one training step under the tracker and split its memory the way a person asks about it."""
    import torch  # lazy: import nbhw stays free of torch

    device = torch.device(device)
    tracker = tracker_class()()
    tracker.timeline = timeline
    tracker.track_external(model, optimizer, *(extra or []))
    tracker.largest = 0  # the weights were made at load
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    with tracker:
        start = _snapshot(tracker, "current", device)
        for _ in range(args.gradient_accumulation_steps):
            tracker.reset_mod_stats()  # MemTracker refuses a second forward of a module it has stats for
            loss = model(**batch).loss
            (loss / args.gradient_accumulation_steps).backward()
            del loss
        fb_peak = _snapshot(tracker, "peak", device)
    gradients = sum(local_nbytes(p.grad) for p in trainable if p.grad is not None)
    with_gradient = sorted(
        {
            f"{_wildcard(n)}|{','.join(map(str, _local(p.grad).stride()))}"
            for n, p in model.named_parameters()
            if p.grad is not None
        }
    )
    end, peak, largest = optimizer_phase(model, optimizer, device=device, extra=extra)
    weights = start.get("Total", 0)
    states = end.get("Optstate", 0)
    fb_total = fb_peak.get("Total", 0)
    step_total = peak.get("Total", 0)
    # Step 2 onwards holds the optimizer state through forward and backward; nothing else differs from step 1,
    # so its forward/backward peak is step 1's plus that state (the tests compare this to a real second step).
    steady_fb = fb_total + states
    phase = "forward/backward" if steady_fb >= step_total else "optimizer step"
    return StepMemory(
        weights=weights,
        trainable_parameters=sum(p.numel() for p in trainable),
        parameters=sum(_unpacked_numel(p) for p in params),
        trainable_bytes=sum(local_nbytes(p) for p in trainable),
        gradients=gradients,
        optimizer_states=states,
        forward_backward_peak=fb_total,
        optimizer_step_peak=step_total,
        peak=max(steady_fb, step_total),
        activations=fb_total
        - fb_peak.get("Parameter", 0)
        - fb_peak.get("Buffer", 0)
        - fb_peak.get("Gradient", 0)
        - fb_peak.get("Other", 0),
        peak_phase=phase,
        breakdown=fb_peak if phase == "forward/backward" else peak,
        with_gradient=with_gradient,
        first_step_peak=max(fb_total, step_total),
        largest_block=max(tracker.largest, largest),
    )


def optimizer_phase(
    model: Any, optimizer: Any, *, device: Any, extra: list[Any] | None = None
) -> tuple[dict[str, int], dict[str, int], int]:
    """Trainer's clip, optimizer.step() and zero_grad under their own tracker (MemTracker's peak only grows):
    what is held after, this phase's peak and the largest block it made (optimizer states on the first step)."""
    import torch  # lazy: import nbhw stays free of torch

    device = torch.device(device)
    tracker = tracker_class()()
    tracker.track_external(model, optimizer, *(extra or []))
    tracker.largest = 0
    max_norm = training_defaults().max_grad_norm
    with tracker:
        if max_norm:
            clip_gradients(model, max_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end = _snapshot(tracker, "current", device)
        peak = _snapshot(tracker, "peak", device)
    return end, peak, tracker.largest


class Setup:
    """Where the step runs: one device (meta tensors), or rank 0 of a fake world of ``world_size`` ranks under
    transformers' TP plan (meta tensors) or accelerate's FSDP2 (fake CPU tensors: FSDP2 refuses meta parameters
    for training)."""

    def __init__(self, strategy: str = "single", world_size: int = 1) -> None:
        self.strategy, self.world_size = strategy, world_size
        self.device = "cpu" if strategy == "fsdp2" else "meta"
        self._fake: Any = None
        self._mesh: Any = None

    @contextlib.contextmanager
    def world(self) -> Iterator[None]:
        if self.strategy not in ("tp", "fsdp2"):
            yield
            return
        with fake_world(self.world_size), _global_shapes_uncounted():
            if self.strategy == "fsdp2":
                from torch._subclasses.fake_tensor import FakeTensorMode  # lazy: import nbhw stays free of torch
                from torch.distributed.device_mesh import init_device_mesh  # lazy: import nbhw stays free of torch

                # The mesh is made before fake mode: DeviceMesh reads its rank tensor's values.
                self._mesh = init_device_mesh("cpu", (self.world_size,), mesh_dim_names=("dp_shard",))
                self._fake = FakeTensorMode(allow_non_fake_inputs=True)
            yield

    def tensors(self) -> Any:
        return self._fake if self._fake is not None else contextlib.nullcontext()

    def step_context(self, args: TrainArgs) -> Any:
        return sharded_step_context() if self.strategy == "fsdp2" else meta_step_context(attention_target(args))

    def build(self, config: Any, args: TrainArgs) -> Any:
        if self.strategy == "tp":
            return _tp_model(config, args, self.world_size)
        model = build_for_training(config, args)
        if self.strategy == "fsdp2":
            model = _fsdp2_model(model, self._mesh, self._fake)
        return model

    def batch(self, args: TrainArgs, vocab_size: int, rows: int | None) -> dict[str, Any]:
        import torch  # lazy: import nbhw stays free of torch

        if self.device == "meta":
            return training_batch(args, vocab_size, device="meta", batch=rows)
        with self.tensors():
            ids = torch.empty(rows or args.batch, args.context, dtype=torch.long, device=self.device)
        return {"input_ids": ids, "labels": ids}


def dry_run(
    config: Any,
    args: TrainArgs,
    *,
    batch: int | None = None,
    depth: str = "auto",
    recorded_layers: int = 5,
    setup: Setup | None = None,
) -> StepMemory:
    """The training step without weights or a GPU: what it holds on one device (or on one rank of ``setup``).

    ``depth="auto"`` runs forward and backward with ``recorded_layers`` decoder layers and repeats the middle
    layers' recorded period up to the model's depth when every layer does the same work (checked: layer_types,
    each layer's modules and parameters, two recorded periods repeating byte for byte); the optimizer step and the
    weights always come from the model at full depth. ``depth="full"`` runs every layer.
    """
    setup = setup or Setup()
    if setup.strategy == "fsdp2":
        recorded_layers = max(recorded_layers, 7)
    layers = int(config.get_text_config().num_hidden_layers)
    with setup.world():
        if depth == "full" or layers < recorded_layers + 2 or uniform_depth(config) is not None:
            return _full_depth(config, args, setup, batch)
        return _deep(config, args, setup, batch, recorded_layers)


def _step(model: Any, args: TrainArgs, setup: Setup, data: dict[str, Any], timeline: Any = None) -> StepMemory:
    optimizer = create_optimizer(model, args, args.device_type)
    extra = [*quant_state_tensors(model), data["input_ids"]]
    with setup.tensors(), setup.step_context(args):
        found = measure_step(model, optimizer, data, args, device=setup.device, extra=extra, timeline=timeline)
    return with_preparation(found, model)


def with_preparation(found: StepMemory, model: Any) -> StepMemory:
    """The first step's peak with what Trainer prepared before it (FSDP2's sharding), said in the notes."""
    prepared = getattr(model, "_nbhw_preparation", None)
    if prepared is None:
        return found
    found.whole_model, found.preparation_peak = prepared.whole_model, prepared.peak
    found.first_step_peak = max(found.first_step_peak, prepared.peak)
    return found


def _full_depth(config: Any, args: TrainArgs, setup: Setup, batch: int | None) -> StepMemory:
    model = setup.build(config, args)
    result = _step(model, args, setup, setup.batch(args, config.vocab_size, batch))
    result.notes += meta_notes(args)
    return result


def _deep(config: Any, args: TrainArgs, setup: Setup, batch: int | None, recorded: int) -> StepMemory:

    layers = int(config.get_text_config().num_hidden_layers)
    small = setup.build(with_depth(config, recorded), args)
    data = setup.batch(args, config.vocab_size, batch)
    timeline = Timeline(decoder_layers(small))
    shallow = _step(small, args, setup, data, timeline)
    try:
        fb_peak, grads_at_peak = synthesize_peak(timeline, layers)
    except ValueError:
        return _full_depth(config, args, setup, batch)  # the layers do not repeat: run every one
    model = setup.build(config, args)
    if len({layer_signature(layer) for layer in decoder_layers(model)}) != 1:
        return _full_depth(config, args, setup, batch)
    extra = [*quant_state_tensors(model), data["input_ids"]]
    optimizer = create_optimizer(model, args, args.device_type)
    with setup.tensors():
        weights = _weights(model, extra, setup.device)
        fb_peak += weights - shallow.weights  # the extra layers' weights are held from the start
        trainable = [p for p in model.parameters() if p.requires_grad]
        got = dict(entry.split("|") for entry in shallow.with_gradient)
        for name, p in model.named_parameters():
            if p.requires_grad and _wildcard(name) in got:
                # What backward leaves on the same parameters, with the layout it gave them (a transposed
                # gradient makes the optimizer copy it).
                p.grad = _empty_like_with_stride(p, tuple(int(x) for x in got[_wildcard(name)].split(",")))
        gradients = sum(local_nbytes(p.grad) for p in trainable if p.grad is not None)
        end, peak, largest = optimizer_phase(model, optimizer, device=setup.device, extra=extra)
    states = end.get("Optstate", 0)
    steady = fb_peak + states
    step_total = peak.get("Total", 0)
    result = StepMemory(
        weights=weights,
        trainable_parameters=sum(p.numel() for p in trainable),
        parameters=sum(_unpacked_numel(p) for p in model.parameters()),
        trainable_bytes=sum(local_nbytes(p) for p in trainable),
        gradients=gradients,
        optimizer_states=states,
        forward_backward_peak=fb_peak,
        optimizer_step_peak=step_total,
        peak=max(steady, step_total),
        activations=fb_peak - weights - grads_at_peak,
        peak_phase="forward/backward" if steady >= step_total else "optimizer step",
        breakdown={"Total": max(steady, step_total)},
        with_gradient=shallow.with_gradient,
        first_step_peak=max(fb_peak, step_total),
        largest_block=max(shallow.largest_block, largest),
    )
    result = with_preparation(result, model)
    result.notes += [
        *meta_notes(args),
        f"forward/backward recorded with {recorded} of the {layers} decoder layers and the middle layers' period "
        "repeated (every layer has the same modules and parameters); weights and the optimizer step at full depth",
    ]
    return result


def _local(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") else t


def _empty_like_with_stride(p: Any, stride: tuple[int, ...]) -> Any:
    import torch  # lazy: import nbhw stays free of torch

    if hasattr(p, "to_local") or tuple(_local(p).stride()) == stride:
        return torch.empty_like(p)
    return torch.empty_strided(p.shape, stride, dtype=p.dtype, device=p.device)


def _wildcard(name: str) -> str:
    import re

    return re.sub(r"\.\d+\.", ".*.", name)


def _weights(model: Any, extra: list[Any], device: str = "meta") -> int:
    tracker = tracker_class()()
    tracker.track_external(model, *extra)
    return _snapshot(tracker, "current", device).get("Total", 0)


def meta_notes(args: TrainArgs) -> list[str]:
    """What the meta step answers the device's way (said, not silent)."""
    notes = [
        f"attention: the SDPA kernel {'torch picks on a CPU' if attention_target(args) == 'cpu' else 'CUDA would run'}"
        " (meta alone would run the math path); the kernel's internal workspace is not counted",
        "rows are one unpadded sequence each; padding adds a batch x context x context mask",
    ]
    if args.dtype != "float32":
        notes.append(
            f"weights and compute in {args.dtype}; autocast's float32 upcasts are not counted (meta "
            "tensors have no autocast)"
        )
    return notes


# --------------------------------------------------------------------------------------------- sharded steps


@contextlib.contextmanager
def fake_world(world_size: int) -> Iterator[None]:
    """torch's fake process group of ``world_size`` ranks in this one process (no communication happens).

    The default process group is process-wide: refuse when a real one is already up (e.g. inside torchrun).
    """
    import torch.distributed as dist  # lazy: import nbhw stays free of torch
    from torch.testing._internal.distributed.fake_pg import FakeStore  # lazy: import nbhw stays free of torch

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized here; plan sharded strategies in a fresh process")
    with _PATCH_LOCK:
        dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
        try:
            yield
        finally:
            dist.destroy_process_group()


@contextlib.contextmanager
def _global_shapes_uncounted() -> Iterator[None]:
    """DTensor's sharding propagation runs each new op once on stand-ins of the *global* shapes to learn its
    output's shape (``ShardingPropagator._propagate_tensor_meta_non_cached``), then remembers the answer per op
    and shapes. Under a fake mode those stand-ins are made in the dry run's own mode, so the tracker counted them
    as memory of the rank: an optimizer step over FSDP2's sharded parameters read the unsharded parameters,
    gradients and both AdamW states on a process's first dry run and nothing on the next (the answer remembered),
    476 vs 82 GiB per rank at 70B. They are metadata, never memory on a device: the propagation runs here with
    the tracker and the dry run's fake mode set aside (torch then makes a fake mode of its own, as it does outside
    one), so a first and a later dry run read the same."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator  # lazy: import nbhw stays free of torch
    from torch.utils._python_dispatch import _disable_current_modes  # lazy: import nbhw stays free of torch

    with _PATCH_LOCK:
        original = ShardingPropagator._propagate_tensor_meta_non_cached

        def uncounted(self: Any, op_schema: Any) -> Any:
            with _disable_current_modes():
                return original(self, op_schema)

        ShardingPropagator._propagate_tensor_meta_non_cached = uncounted  # type: ignore[method-assign]
        try:
            yield
        finally:
            ShardingPropagator._propagate_tensor_meta_non_cached = original  # type: ignore[method-assign]


def tp_problems(config: Any, world_size: int) -> list[str]:
    """What stops tensor parallelism at this size, in transformers' own terms.

    transformers 5.24 shards a colwise projection unevenly when its size is not a multiple of the TP size
    (``_from_local_last_dim_shard``) and only checks head counts for generation caches
    (``get_kv_heads_per_rank``); a rank holding part of a head breaks attention's reshape. So the heads are
    checked here with transformers' own rule, on the attention and the key/value heads.
    """
    import transformers  # lazy: import nbhw stays free of transformers
    from transformers.distributed.tensor_parallel import (
        get_kv_heads_per_rank,
    )  # lazy: import nbhw stays free of transformers

    cls = transformers.AutoModelForCausalLM._model_mapping[type(config)]
    text = config.get_text_config()
    plan = dict(getattr(text, "base_model_tp_plan", None) or {})
    if not plan:
        return [f"{cls.__name__} has no tensor-parallel plan (config.base_model_tp_plan); use fsdp2 or zero3"]
    problems = []
    for what in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(text, what, None)
        if heads is not None and get_kv_heads_per_rank(plan, heads, world_size) is None:
            valid = [n for n in range(2, int(heads) + 1) if int(heads) % n == 0]
            problems.append(
                f"tensor parallelism over {world_size} devices needs {what}={heads} to divide evenly; "
                f"TP sizes that do: {', '.join(map(str, valid))}"
            )
    return problems


def _tp_model(config: Any, args: TrainArgs, world_size: int) -> Any:
    """The model under transformers' own TP sharding (prepare_distribute_model / maybe_distribute_model, what
    from_pretrained(distributed_config=...) applies before loading), on meta, then LoRA / checkpointing."""
    import torch  # lazy: import nbhw stays free of torch
    import transformers  # lazy: import nbhw stays free of transformers
    from transformers import DistributedConfig  # lazy: import nbhw stays free of transformers

    if args.method == "qlora":
        raise UserError(
            "qlora with tensor parallelism is not planned (bitsandbytes 4-bit weights are not sharded by "
            "the TP plan); use ddp"
        )
    cls = transformers.AutoModelForCausalLM._model_mapping[type(config)]
    dist_config, _, mesh = cls.prepare_distribute_model(DistributedConfig(tp_plan="auto", tp_size=world_size))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), dtype=_torch_dtype(args.dtype))
    model = cls.maybe_distribute_model(model, dist_config, mesh)
    model = prepare_for_training(model, args, meta=True)
    _check_row_wise_lora(model, config)
    return model


class StepRefused(RuntimeError):
    """The libraries' own code refuses this step under this sharding (said in full, as the row's problem)."""


def _check_row_wise_lora(model: Any, config: Any) -> None:
    """LoRA on a layer transformers' TP plan shards row-wise: peft sizes the adapter's A matrix from the local
    weight (its ``in_features`` is this rank's slice of the input) and wraps its weight at the whole width, then
    transformers' row-wise forward reads ``in_features`` as the whole width of the input it rebuilds; the shapes
    disagree and the step fails at that layer's forward, in a real torchrun as in the dry run (seen with
    peft 0.21.2, transformers 5.24). Said in words, naming the layers that work, instead of a reshape error."""
    from importlib.metadata import version

    refused: dict[str, tuple[int, int]] = {}
    for name, module in model.named_modules():
        for adapter in getattr(module, "lora_A", {}).values() if hasattr(module, "lora_A") else ():
            whole = int(adapter.weight.shape[-1])
            if getattr(adapter, "in_features", whole) != whole:
                refused[name.rsplit(".", 1)[-1]] = (int(adapter.in_features), whole)
    if not refused:
        return
    plan = dict(getattr(config.get_text_config(), "base_model_tp_plan", None) or {})
    linear = set(linear_layer_names(model))
    column = sorted({key.rsplit(".", 1)[-1] for key, style in plan.items() if style == "colwise"} & linear)
    layers = ", ".join(f"{n} ({a} of {b} inputs)" for n, (a, b) in sorted(refused.items()))
    raise StepRefused(
        f"peft {version('peft')} gives LoRA on a row-wise sharded layer an A matrix of this rank's input slice, "
        f"which transformers {version('transformers')}'s row-wise forward takes as the whole width: {layers}; the "
        "step fails there (a real torchrun too). LoRA on the column-wise layers only "
        f"(lora_target_modules={column}) runs under tensor parallelism, or use fsdp2"
    )


def _fsdp2_model(model: Any, mesh: Any, fake: Any) -> Any:
    """The model under accelerate's own FSDP2 preparation (fsdp2_prepare_model: a unit per decoder layer, the
    embedding and tail units, the root), as Trainer(fsdp=True, fsdp_config={"version": 2}) gets it."""
    import torch  # lazy: import nbhw stays free of torch
    from accelerate.utils import FullyShardedDataParallelPlugin  # lazy: import nbhw stays free of accelerate
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model  # lazy: import nbhw stays free of accelerate

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        reshard_after_forward=True,
        cpu_offload=False,
        auto_wrap_policy="transformer_based_wrap",
        state_dict_type="FULL_STATE_DICT",
        cpu_ram_efficient_loading=False,
    )
    stand_in = types.SimpleNamespace(
        state=types.SimpleNamespace(fsdp_plugin=plugin),
        torch_device_mesh=mesh,
        mixed_precision="no",
        is_main_process=True,
        device=torch.device("cpu"),
        parallelism_config=types.SimpleNamespace(fsdp_dim_names=("dp_shard",)),
    )
    with fake:
        model.to_empty(device="cpu")
        return measured_preparation(model, lambda: fsdp2_prepare_model(stand_in, model))


@dataclass
class Preparation:
    """What preparing the model held before the first step: the model before (bytes) and the peak while it ran."""

    whole_model: int = 0
    peak: int = 0


def measured_preparation(model: Any, prepare: Any) -> Any:
    """Run ``prepare()`` (accelerate's FSDP2 sharding, as Trainer.train() runs it before step 1) under the tracker:
    accelerate keeps the whole model (``original_sd``) while ``fully_shard`` makes each unit's shard, so the peak
    is the whole model plus its shards. Kept on ``model`` for the step's figures."""
    import warnings

    tracker = tracker_class()()
    tracker.track_external(model)
    with tracker, warnings.catch_warnings():
        # MemTracker's module tracker expects a forward; preparing runs none (its "hierarchy ... messed up" warning).
        warnings.filterwarnings("ignore", message="The module hierarchy tracking", category=UserWarning)
        whole = _snapshot(tracker, "current", "cpu").get("Total", 0)
        prepared = prepare()
        peak = _snapshot(tracker, "peak", "cpu").get("Total", 0)
    prepared._nbhw_preparation = Preparation(whole, peak)
    return prepared


# --------------------------------------------------------------------------------------------- depth: identical layers


class Timeline:
    """The tracker's total after every op of forward and backward, each tagged with the decoder layer running."""

    def __init__(self, layers: list[Any]) -> None:
        self.layers = layers
        self.names: dict[str, int] | None = None
        self.values: list[int] = []
        self.grads: list[int] = []
        self.tags: list[tuple[bool, int | None]] = []

    def record(self, tracker: Any, total: int, grads: int) -> None:
        mods = tracker._mod_tracker
        layer = None
        if self.names is None and self.layers and self.layers[0] in mods._known_modules:
            known = mods._known_modules
            self.names = {known[m]: i for i, m in enumerate(self.layers)}
        if self.names is not None:
            for name in mods.parents:
                layer = self.names.get(name, layer)
        self.values.append(total)
        self.grads.append(grads)
        self.tags.append((mods.is_bw, layer))


def _blocks(timeline: Timeline, backward: bool) -> dict[int, tuple[int, int]]:
    """Each layer's (first, last+1) op index in the forward or the backward phase."""
    spans: dict[int, list[int]] = {}
    for i, (bw, layer) in enumerate(timeline.tags):
        if bw == backward and layer is not None:
            span = spans.setdefault(layer, [i, i + 1])
            span[1] = i + 1
    return {k: (v[0], v[1]) for k, v in spans.items()}


def synthesize_peak(timeline: Timeline, layers: int) -> tuple[int, int]:
    """The forward/backward peak (and the gradients held at it) the same step reaches with ``layers`` identical
    decoder layers, from a timeline recorded with fewer.

    In each phase the ops from one middle layer's start to the next one's form a period; the recorded timeline
    must hold two periods that differ by a constant (what one more layer holds), byte for byte at every op.
    The L-layer timeline is the recorded one with L - recorded more periods inserted after those two, each one
    constant higher, and everything after them shifted. Raises when the periods do not repeat.
    """
    recorded = len(timeline.layers)
    if recorded < 5 or layers < recorded:
        raise ValueError("need a timeline of at least 5 layers (first, three middle, last) and no more than asked")
    values, grads = timeline.values, timeline.grads
    inserts = []
    for backward in (False, True):
        spans = _blocks(timeline, backward)
        # Three middle layers in execution order, from the centre: two periods away from both ends (FSDP2's
        # prefetch makes the periods next to the first and last layers differ).
        middle = list(range(1, recorded - 1))
        middle = middle if not backward else middle[::-1]
        centre = (len(middle) - 3) // 2
        order = middle[centre : centre + 3]
        a, b, c = (spans[i][0] for i in order)
        if b - a != c - b:
            raise ValueError("the middle decoder layers do not repeat exactly; run the full depth")
        step = values[b] - values[a]
        gstep = grads[b] - grads[a]
        if any(values[b + j] - values[a + j] != step or grads[b + j] - grads[a + j] != gstep for j in range(b - a)):
            raise ValueError("the middle decoder layers do not repeat exactly; run the full depth")
        inserts.append((c, b, step, gstep))
    copies = layers - recorded
    best = (0, 0)
    shift = gshift = cursor = 0
    for at, period, step, gstep in sorted(inserts):
        pairs = zip(values[cursor:at], grads[cursor:at], strict=True)
        best = max([best, *((v + shift, g + gshift) for v, g in pairs)])
        if copies > 0:
            top = max(range(period, at), key=values.__getitem__)
            # Copy q (1..copies) is the last recorded period plus q steps: the largest is the first or the last.
            for q in (1, copies):
                best = max(best, (values[top] + shift + q * step, grads[top] + gshift + q * gstep))
        shift += copies * step
        gshift += copies * gstep
        cursor = at
    return max([best, *((v + shift, g + gshift) for v, g in zip(values[cursor:], grads[cursor:], strict=True))])


def uniform_depth(config: Any) -> str | None:
    """Why a config's decoder layers might not do the same work (None: nothing says so)."""
    text = config.get_text_config()
    kinds = set(getattr(text, "layer_types", None) or [])
    if len(kinds) > 1:
        return f"layer_types mixes {', '.join(sorted(kinds))}"
    return None


def with_depth(config: Any, layers: int) -> Any:
    """A copy of the config with ``layers`` decoder layers (layer_types cut to match)."""
    small = copy.deepcopy(config)
    text = small.get_text_config()
    kinds = list(getattr(text, "layer_types", None) or [])
    text.num_hidden_layers = layers
    if kinds:
        text.layer_types = (kinds * (layers // len(kinds) + 1))[:layers] if len(set(kinds)) > 1 else kinds[:1] * layers
    return small
