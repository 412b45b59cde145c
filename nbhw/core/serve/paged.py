"""transformers' continuous batching, asked on the meta device: the resolved config and the paged cache.

Nothing here sizes anything: the installed transformers resolves the :class:`ContinuousBatchingConfig` (its
``resolve_continuous_batching_config``: CUDA graphs, asynchronous batching, ``max_memory_percent``) and builds its own
``PagedAttentionCache`` on the meta device, reading the device's memory through the one function it asks
(``get_device_and_memory_breakdown``), which answers with the device's memory and what the loaded weights and the
framework hold on it. The requests that fit are counted by that cache's own allocators (``can_store_request_tokens``),
so when a release changes the sizing or the pages, the answer follows it.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.cache import PagedAttentionCache

_lock = threading.Lock()  # the patches below are process-wide: one sizing at a time


@dataclass(frozen=True)
class Device:
    """The device the cache is made on, as transformers would read it after the weights are loaded."""

    kind: str  # "cuda", "xpu", "mps", "cpu"
    total: int  # the memory transformers reads as the device's total
    held: int  # what is allocated on it before the cache: the weights and the framework's reserve
    graphs: bool  # whether the device has CUDA-graph-like objects (an NVIDIA or AMD GPU, an XPU)


@dataclass(frozen=True)
class Pool:
    """One page pool (one attention type): its layers and what one page holds."""

    attention: str  # "full_attention", "sliding_attention"
    layers: int
    tokens_per_page: int
    window: int | None  # a sliding pool's window (its requests keep at most this many tokens)


@dataclass(frozen=True)
class Paged:
    """The resolved config and the paged cache transformers makes with it."""

    config: ContinuousBatchingConfig  # resolved
    available: int  # what the sizing may use: (total - held) x max_memory_percent
    pools: tuple[Pool, ...]
    sectors: int
    bytes_per_sector: int
    tokens_per_sector: int
    cache_bytes: int  # the cache tensor: the sectors and two trash sectors
    blocks: int  # whole-model blocks of page_size tokens the cache holds
    max_batch_tokens: int
    batch_bytes: int  # the tensors that scale with max_batch_tokens (inputs, outputs, the activation peak)
    mask_bytes: int  # the attention masks (none for flash attention)
    fixed_bytes: int  # the trash sectors and, with logits_to_keep, the LM head rows of a batch
    cache: PagedAttentionCache  # made on meta: its allocators count requests
    ranks: int = 1  # tensor-parallel ranks: each holds these pages for its share of the key/value heads


@contextlib.contextmanager
def _as_if(device: Device) -> Iterator[None]:
    """transformers' continuous batching reads ``device`` as the one it runs on: its memory breakdown, and (for
    the graphs decision) whether an accelerator with graphs is there."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch
    from transformers.generation.continuous_batching import cache, utils

    def breakdown() -> tuple[Any, int, int, int]:
        return torch.device(device.kind), device.total, device.held, device.held

    def accelerator() -> Any:
        return torch.cuda if device.graphs else None

    with _lock:
        saved = cache.get_device_and_memory_breakdown, utils.get_available_accelerator_module
        cache.get_device_and_memory_breakdown, utils.get_available_accelerator_module = breakdown, accelerator
        try:
            yield
        finally:
            cache.get_device_and_memory_breakdown, utils.get_available_accelerator_module = saved


def served_config(model: Any, attention: str) -> Any:
    """The model's text config as continuous batching runs it: with the attention implementation it serves (a
    copy: the meta model may have been built with another, where the asked one is not installed here)."""
    text = copy.deepcopy(model.config.get_text_config())
    text._attn_implementation = attention
    return text


def resolved(model: Any, cb_config: Any, device: Device, attention: str) -> Any:
    """transformers' own resolution of ``cb_config`` for this model on ``device`` (a deep copy)."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch
    from transformers.generation.continuous_batching.cb_logits_processors import (
        ContinuousBatchingLogitsProcessorList,
    )
    from transformers.generation.continuous_batching.initialization import resolve_continuous_batching_config

    processors = ContinuousBatchingLogitsProcessorList(
        logits_processor=model._get_logits_processor(model.generation_config),
        per_request_processors=cb_config.per_request_processors,
        drop_unsupported_processors=cb_config.drop_unsupported_processors,
    )
    with _as_if(device):
        return resolve_continuous_batching_config(
            config=served_config(model, attention), cb_config=cb_config, workload_hints=None,
            has_logit_processors=processors.do_processing, device=torch.device(device.kind),
        )  # fmt: skip


@dataclass(frozen=True)
class Ranks:
    """Tensor-parallel serving: how many ranks, and the model's TP plan they shard by (1 and no plan: none)."""

    size: int = 1
    tp_plan: tuple[tuple[str, str], ...] = ()


def _helper(ranks: Ranks) -> Any:
    """transformers' DistributedHelper as rank 0 of ``ranks`` sees it. The group is faked at its one collective:
    the ranks plan the same memory on the same card (rank 0 holds the most weights, torch's sharding), so the
    minimum across them that the cache takes is rank 0's own."""
    from transformers.generation.continuous_batching.distributed import DistributedHelper

    helper = DistributedHelper(device_mesh=None, cpu_group_timeout=None, tp_plan=dict(ranks.tp_plan))
    if ranks.size > 1:
        helper.tp_size = ranks.size
        helper.tp_all_reduce_min = lambda value, on_cpu=False: value
    return helper


@contextlib.contextmanager
def _read_back_on_cpu(ranks: Ranks) -> Iterator[None]:
    """Under tensor parallelism the cache reads its size back from a tensor made on its own device
    (``torch.tensor([...], device=...).item()`` after the min-reduce); on meta that tensor has no value, so it is
    made on the CPU (two integers; every other tensor stays on meta)."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch
    from torch.overrides import TorchFunctionMode

    if ranks.size == 1:
        yield
        return

    class ValuesOnCpu(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if func is torch.tensor and str(kwargs.get("device")) == "meta":
                kwargs["device"] = "cpu"
            return func(*args, **kwargs)

    with ValuesOnCpu():
        yield


def paged(model: Any, config: Any, device: Device, attention: str, ranks: Ranks | None = None) -> Paged:
    """The PagedAttentionCache transformers makes for ``model`` with the resolved ``config`` on ``device`` (on each
    of ``ranks`` tensor-parallel ranks: their share of the heads)."""
    from transformers.generation.continuous_batching.cache import PagedAttentionCache, PagedAttentionMemoryHandler

    ranks = ranks or Ranks()
    helper = _helper(ranks)
    keep = getattr(model, "_supports_logits_to_keep", None)
    keeps = callable(keep) and bool(keep())
    text = served_config(model, attention)
    split = {"kv_tp_size": ranks.size} if ranks.size > 1 and helper.are_kv_heads_tp_ed() else {}
    with _as_if(device), _read_back_on_cpu(ranks):
        cache = PagedAttentionCache(text, config, device="meta", distributed_helper=helper, dtype=model.dtype,
                                    model_supports_logits_to_keep=keeps)  # fmt: skip
        handler = PagedAttentionMemoryHandler(
            config=text, cb_config=config, dtype=model.dtype, bytes_per_sector=cache.bytes_per_sector,
            tokens_per_sector=cache.tokens_per_sector,
            bytes_per_block=sum(a.bytes_per_block for a in cache.cache_allocators.values()),
            attn_types=list(cache.cache_allocators), model_supports_logits_to_keep=keeps, **split,
        )  # fmt: skip
    pools = tuple(
        Pool(name, len(a.layer_indices), int(a.tokens_per_page), getattr(a, "sliding_window", None))
        for name, a in cache.cache_allocators.items()
    )
    sectors = int(cache.num_sectors)
    return Paged(
        config=config, available=int(handler.available_memory), pools=pools, sectors=sectors,
        bytes_per_sector=int(cache.bytes_per_sector), tokens_per_sector=int(cache.tokens_per_sector),
        cache_bytes=int(cache.cache_tensor.numel()), blocks=int(cache.num_blocks),
        max_batch_tokens=int(cache.max_batch_tokens),
        batch_bytes=int(cache.max_batch_tokens) * int(handler.bytes_per_batch_token),
        mask_bytes=int(handler.attention_mask_bytes(int(cache.max_batch_tokens), sectors)),
        fixed_bytes=int(handler.fixed_overhead_bytes), cache=cache, ranks=ranks.size,
    )  # fmt: skip


@dataclass
class _Request:
    """What the cache's allocators read of a request: its id and how many tokens it has so far."""

    request_id: str

    def current_len(self) -> int:
        return 0


def requests_held(found: Paged, length: int, most: int = 1 << 20) -> int:
    """How many requests of ``length`` tokens the cache holds at once, by its own allocators (each request's cache
    allocated whole, as the scheduler admits one; then freed again)."""
    cache, held = found.cache, 0
    try:
        while held < most and cache.can_store_request_tokens(_Request(f"nbhw-{held}"), length):
            held += 1
    finally:
        for i in range(held):
            cache.free_blocks(f"nbhw-{i}", no_cache=True)
        cache.pool.reset()
    return held


def longest_request(found: Paged, limit: int) -> int:
    """The longest single request (tokens, up to ``limit``) the empty cache can hold (0: not even one token)."""
    low, high = 0, limit
    while low < high:
        mid = (low + high + 1) // 2
        if found.cache.can_store_request_tokens(_Request("nbhw-longest"), mid, dry_run=True):
            low = mid
        else:
            high = mid - 1
    return low


@dataclass(frozen=True)
class Together:
    """What the scheduler does with ``requests`` requests of ``prompt`` + ``answer`` tokens sent at once."""

    requests: int
    most_active: int  # the most it ran at the same time
    starved: bool  # whether a running request could not get the cache for its next token (it is then offloaded)


def run_together(found: Paged, requests: int, prompt: int, answer: int) -> Together:
    """The installed transformers' scheduler (the config's ``scheduler_type``, its safety margin, the batch token
    budget) on the cache, fed ``requests`` distinct prompts of ``prompt`` tokens, each generating ``answer``: every
    step as the batch processor takes it, the forward's token left out (it does not change what is allocated)."""
    from transformers.generation.continuous_batching.requests import RequestState, RequestStatus
    from transformers.generation.continuous_batching.scheduler import SCHEDULER_MAPPING

    config, cache = found.config, found.cache
    scheduler = SCHEDULER_MAPPING[config.scheduler_type](cache, config.safety_margin, config.max_requests_per_batch)
    for i in range(requests):  # distinct prompts: no block is shared between them
        tokens = [i * prompt + j + 1 for j in range(prompt)]
        scheduler.add_waiting_request(RequestState(f"nbhw-{i}", tokens, max_new_tokens=answer, eos_token_id=-1))
    most, starved = 0, False
    try:
        while scheduler.has_pending_requests():
            batch = scheduler.schedule_batch(found.max_batch_tokens, cache.max_tokens_read)[0]
            most = max(most, len(scheduler.active_requests))
            starved = starved or batch is None or bool(scheduler.starved_requests)
            if not batch:
                break  # the cache is full: the batch processor would offload a request here
            for future in batch:
                state = future.state
                state.position_offset += len(state.tokens_to_process)  # as the batch's inputs are prepared
                if not future.has_new_token:
                    continue
                if state.generated_len() == 0:
                    state.status = RequestStatus.DECODING
                if state.update_and_check_completion(0, None):
                    scheduler.finish_request(state.request_id)
    finally:
        cache.free_all_requests(clear_ledgers=True)
        cache.pool.reset()
    return Together(requests, most, starved)


def most_together(found: Paged, prompt: int, answer: int, capacity: int) -> Together:
    """The scheduler fed one request more than the cache holds of ``prompt`` + ``answer`` tokens: ``most_active`` is
    the most it runs at once (it admits while the cache and its safety margin let it; every later one waits)."""
    return run_together(found, capacity + 1, prompt, answer)
