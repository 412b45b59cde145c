"""The training cell's own steps, as the dry run and the real run both take them (:mod:`nbhw.core.train.step`): the
model ``from_config`` builds with the 4-bit quantizer and peft's LoRA, the optimizer ``Trainer`` makes, a batch of
rows, and one optimizer step with gradient clipping."""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Any

from nbhw.core.errors import UserError
from nbhw.core.plan import run_parts
from nbhw.core.train.arguments import TrainArgs
from nbhw.core.train.meta_patches import recompute_contexts

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


def torch_dtype(name: str) -> Any:
    import torch  # lazy: import nbhw stays free of torch

    return getattr(torch, name)


def quantization_config(args: TrainArgs) -> Any:
    """The BitsAndBytesConfig the emitted cell passes for QLoRA."""
    from transformers import BitsAndBytesConfig  # lazy: import nbhw stays free of transformers

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=QUANT_TYPE,
        bnb_4bit_compute_dtype=torch_dtype(args.dtype),
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
    built = run_parts.build(config, dtype=args.dtype, auto_name=CAUSAL_LM, attn_implementation=None)
    if not built.ok:
        raise UserError(f"transformers can't build this model for causal-LM training: {built.error}")
    model = built.model
    if args.method == "qlora":
        _quantize_on_meta(model, args)
    return prepare_for_training(model, args, meta=True)


def load_for_training(path: str, args: TrainArgs, *, device: str = "cpu") -> Any:
    """The same model loaded for real, as the emitted cell loads it (tests run the step on it)."""
    import transformers  # lazy: import nbhw stays free of transformers

    kwargs: dict[str, Any] = {"dtype": torch_dtype(args.dtype), "device_map": device}
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
        recompute = functools.partial(recompute_contexts, attention_target(args))
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
