"""Sharded worlds on the meta device (:mod:`nbhw.core.train.step`): a fake process group of N ranks, tensor
parallel and FSDP2 applied by torch's and transformers' own code, the plans they refuse, and FSDP2's optimizer step
as one rank runs it on its shards."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from nbhw.core.errors import UserError
from nbhw.core.hf import tensor_parallel
from nbhw.core.hf.tensor_parallel import PATCH_LOCK
from nbhw.core.train.arguments import TrainArgs
from nbhw.core.train.meta_patches import quiet_tracking, snapshot, tracker_class
from nbhw.core.train.training_build import linear_layer_names, prepare_for_training, torch_dtype


@contextlib.contextmanager
def global_shapes_uncounted() -> Iterator[None]:
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

    with PATCH_LOCK:
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
    """What stops training with tensor parallelism at this size (transformers' own rules)."""
    return tensor_parallel.tp_problems(config, world_size, otherwise="use fsdp2 or zero3")


def tp_model(config: Any, args: TrainArgs, world_size: int) -> Any:
    """The model under transformers' own TP sharding (prepare_distribute_model / maybe_distribute_model, what
    from_pretrained(distributed_config=...) applies before loading), on meta, then LoRA / checkpointing."""

    if args.method == "qlora":
        raise UserError(
            "qlora with tensor parallelism is not planned (bitsandbytes 4-bit weights are not sharded by "
            "the TP plan); use ddp"
        )
    model = tensor_parallel.tp_sharded(config, torch_dtype(args.dtype), world_size)
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
    plan = tensor_parallel.tp_plan_of(config)
    linear = set(linear_layer_names(model))
    column = sorted({key.rsplit(".", 1)[-1] for key, style in plan.items() if style == "colwise"} & linear)
    layers = ", ".join(f"{n} ({a} of {b} inputs)" for n, (a, b) in sorted(refused.items()))
    raise StepRefused(
        f"peft {version('peft')} gives LoRA on a row-wise sharded layer an A matrix of this rank's input slice, "
        f"which transformers {version('transformers')}'s row-wise forward takes as the whole width: {layers}; the "
        "step fails there (a real torchrun too). LoRA on the column-wise layers only "
        f"(lora_target_modules={column}) runs under tensor parallelism, or use fsdp2"
    )


def fsdp2_model(model: Any, mesh: Any, fake: Any) -> Any:
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
    tracker = tracker_class()()
    tracker.track_external(model)
    with tracker, quiet_tracking():  # MemTracker's module tracker expects a forward; preparing runs none
        whole = snapshot(tracker, "current", "cpu").get("Total", 0)
        prepared = prepare()
        peak = snapshot(tracker, "peak", "cpu").get("Total", 0)
    prepared._nbhw_preparation = Preparation(whole, peak)
    return prepared


# torch.optim classes whose step is elementwise per parameter: on Shard(0) DTensors each rank runs the same ops on
# its local shards, and no placement is redistributed.
_ELEMENTWISE_OPTIMIZERS = ("Adam", "AdamW", "SGD")


class ShardwiseStep:
    """``optimizer.step()`` over FSDP2's DTensor parameters as one rank runs it: the same ops on its local shards
    (the parameters' and gradients' own local tensors) by a fresh optimizer of the same class over the same groups,
    kept with its state. DTensor's dispatch of each foreach op over hundreds of parameters costs a second of CPU
    and allocates nothing a rank holds; the tests compare every figure with the step over the DTensors."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer
        self.local: Any = None

    def __call__(self) -> None:
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        for p in params:
            p._local_tensor.grad = None if p.grad is None else p.grad._local_tensor
        groups = [{**g, "params": [p._local_tensor for p in g["params"]]} for g in self.optimizer.param_groups]
        self.local = type(self.optimizer)(groups)  # every option is in the groups
        self.local.step()
        for p in params:  # the DTensors' gradients hold them, as without this step
            p._local_tensor.grad = None


def shardwise_step(optimizer: Any) -> ShardwiseStep | None:
    """The optimizer's step on the local shards where that is the same step (see :class:`ShardwiseStep`): every
    parameter and gradient a DTensor sharded on dim 0 of one mesh, an elementwise torch optimizer whose
    implementation is set (foreach or not; torch's default would look at the local tensors' type), no state yet."""
    from torch.distributed.tensor import DTensor, Shard  # lazy: import nbhw stays free of torch

    kind = type(optimizer)
    if not kind.__module__.startswith("torch.optim.") or kind.__name__ not in _ELEMENTWISE_OPTIMIZERS:
        return None
    groups = optimizer.param_groups
    if optimizer.state or any(g.get("foreach") is None or g.get("fused") or g.get("differentiable") for g in groups):
        return None
    params = [p for g in groups for p in g["params"]]
    tensors = [*params, *(p.grad for p in params if p.grad is not None)]
    if not tensors or not all(isinstance(t, DTensor) and t.placements == (Shard(0),) for t in tensors):
        return None
    if len({t.device_mesh for t in tensors}) != 1:
        return None
    if any(p.grad is not None and p.grad._local_tensor.shape != p._local_tensor.shape for p in params):
        return None
    return ShardwiseStep(optimizer)
