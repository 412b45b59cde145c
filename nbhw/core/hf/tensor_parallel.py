"""Tensor parallelism as transformers applies it, on the meta device: a fake process group of N ranks, the model
sharded by its own TP plan (``prepare_distribute_model`` / ``maybe_distribute_model``, what
``from_pretrained(distributed_config=DistributedConfig(tp_plan="auto"))`` applies), what one rank then holds, and
the head counts the plan can't split. Training (:mod:`nbhw.core.train`) and serving (:mod:`nbhw.core.serve`) both
plan tensor-parallel runs from here."""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator
from typing import Any

# Process-wide patches and the process-wide default process group: one at a time.
PATCH_LOCK = threading.RLock()


@contextlib.contextmanager
def fake_world(world_size: int) -> Iterator[None]:
    """torch's fake process group of ``world_size`` ranks in this one process (no communication happens).

    The default process group is process-wide: refuse when a real one is already up (e.g. inside torchrun).
    """
    import torch.distributed as dist  # lazy: import nbhw stays free of torch
    from torch.testing._internal.distributed.fake_pg import FakeStore  # lazy: import nbhw stays free of torch

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized here; plan sharded strategies in a fresh process")
    with PATCH_LOCK:
        dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
        try:
            yield
        finally:
            dist.destroy_process_group()


def tp_plan_of(config: Any) -> dict[str, str]:
    """The model's own tensor-parallel plan (``base_model_tp_plan`` of its text config; empty: it has none)."""
    return dict(getattr(config.get_text_config(), "base_model_tp_plan", None) or {})


def tp_problems(config: Any, world_size: int, otherwise: str = "") -> list[str]:
    """What stops tensor parallelism at this size, in transformers' own terms (``otherwise``: what to use instead
    of a model with no TP plan).

    transformers 5.24 shards a colwise projection unevenly when its size is not a multiple of the TP size
    (``_from_local_last_dim_shard``) and only checks head counts for generation caches
    (``get_kv_heads_per_rank``); a rank holding part of a head breaks attention's reshape. So the heads are
    checked here with transformers' own rule, on the attention and the key/value heads.
    """
    import transformers  # lazy: import nbhw stays free of transformers
    from transformers.distributed.tensor_parallel import get_kv_heads_per_rank  # lazy: import nbhw stays free of it

    plan = tp_plan_of(config)
    if not plan:
        cls = transformers.AutoModelForCausalLM._model_mapping[type(config)]
        instead = f"; {otherwise}" if otherwise else ""
        return [f"{cls.__name__} has no tensor-parallel plan (config.base_model_tp_plan){instead}"]
    text = config.get_text_config()
    heads = {what: int(getattr(text, what)) for what in ("num_attention_heads", "num_key_value_heads")
             if isinstance(getattr(text, what, None), int)}  # fmt: skip

    def splits(size: int, count: int) -> bool:
        return get_kv_heads_per_rank(plan, count, size) is not None

    uneven = [f"{what}={count}" for what, count in heads.items() if not splits(world_size, count)]
    if not uneven:
        return []
    valid = [n for n in range(2, max(heads.values()) + 1) if all(splits(n, count) for count in heads.values())]
    return [
        f"tensor parallelism over {world_size} devices needs {' and '.join(uneven)} to divide evenly; TP sizes that "
        f"do: {', '.join(map(str, valid)) or 'none'}"
    ]


def tp_sharded(config: Any, dtype: Any, world_size: int) -> Any:
    """The model as rank 0 of ``world_size`` holds it under transformers' own TP sharding, on meta (inside
    :func:`fake_world`): its parameters are DTensors whose local shards are that rank's.

    In from_pretrained's order: the model is made with its weights untied (``initialization.no_tie_weights``: the
    TP plan names a tied head's own weight), sharded, then tied again."""
    import torch  # lazy: import nbhw stays free of torch
    import transformers  # lazy: import nbhw stays free of transformers
    from transformers import DistributedConfig, initialization  # lazy: import nbhw stays free of transformers

    cls = transformers.AutoModelForCausalLM._model_mapping[type(config)]
    dist_config, _, mesh = cls.prepare_distribute_model(DistributedConfig(tp_plan="auto", tp_size=world_size))
    untied = getattr(initialization, "no_tie_weights", contextlib.nullcontext)
    with PATCH_LOCK, torch.device("meta"), untied():  # no_tie_weights patches PreTrainedModel for its block
        model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), dtype=dtype)
    model = cls.maybe_distribute_model(model, dist_config, mesh)
    model.tie_weights()
    return model


def local_nbytes(t: Any) -> int:
    """Bytes this rank holds for ``t`` (a DTensor's local shard)."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return int(local.nbytes)


def rank_bytes(model: Any) -> int:
    """What one rank holds of a sharded model: each parameter's and buffer's local shard (tied weights once).
    Where a dimension does not split evenly, rank 0 holds the larger share (torch's sharding), so rank 0's bytes
    are the most any rank holds."""
    return sum(local_nbytes(t) for t in [*model.parameters(), *model.buffers()])
