"""Run nbhw's serving cell under torchrun on CPU ranks and write what each rank's real manager made (test helper).

    torchrun --nproc_per_node 2 tests/support/serve_rank.py OUT_DIR NAME=SCRIPT=DEVICE_BYTES ...

The device is faked at the one function transformers' continuous batching asks (``get_device_and_memory_breakdown``):
DEVICE_BYTES of memory, and allocated on it what this rank really holds once the model is loaded (the local shards
of its parameters and buffers, as a GPU's allocator would count them). Everything else is the real run: the model
loaded with the cell's ``DistributedConfig(tp_plan="auto")`` over gloo, the cache sized by transformers (the min
across the ranks), the requests served. A checkpoint saved without a tokenizer (the tests' tiny families) gets a
stand-in that turns each prompt into a few token ids. Each script runs in turn in the same two processes (one
start-up); OUT_DIR/rank<RANK>.json gets this rank's figures, by NAME.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any


def held(model: Any) -> int:
    """The bytes this rank's copy of the model holds: each parameter's and buffer's local shard."""
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        total += local.numel() * local.element_size()
    return total


def main() -> None:
    import torch
    import transformers
    from transformers.generation.continuous_batching import cache as cb_cache

    out = Path(sys.argv[1])
    rank = int(os.environ.get("RANK", "0"))
    seen: dict[str, Any] = {"caches": []}
    load = transformers.AutoModelForCausalLM.from_pretrained

    def loaded(*args: Any, **kwargs: Any) -> Any:
        model = load(*args, **kwargs)
        seen["held"] = held(model)
        seen["sharded"] = sum(hasattr(p, "to_local") for p in model.parameters())
        return model

    made = cb_cache.PagedAttentionCache.__init__

    def init(cache: Any, *args: Any, **kwargs: Any) -> None:
        made(cache, *args, **kwargs)
        seen["caches"].append(cache)

    tokenizer = transformers.AutoTokenizer.from_pretrained

    def tokenizer_or_stand_in(folder: str, *args: Any, **kwargs: Any) -> Any:
        if any(Path(folder, name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
            return tokenizer(folder, *args, **kwargs)
        return lambda text: {"input_ids": [(ord(c) % 200) + 1 for c in text][:8]}

    transformers.AutoTokenizer.from_pretrained = tokenizer_or_stand_in  # type: ignore[method-assign]
    transformers.AutoModelForCausalLM.from_pretrained = loaded  # type: ignore[method-assign]
    cb_cache.PagedAttentionCache.__init__ = init  # type: ignore[method-assign]
    figures, cpu = {}, torch.device("cpu")
    for run in sys.argv[2:]:
        name, script, device_bytes = run.split("=")
        seen["device_bytes"] = int(device_bytes)
        cb_cache.get_device_and_memory_breakdown = lambda: (cpu, seen["device_bytes"], seen["held"], seen["held"])
        scope = runpy.run_path(script, run_name="__main__")
        cache = seen["caches"][-1]
        results = [r for r in scope["results"] if r is not None]
        figures[name] = {
            "rank": rank, "held": seen["held"], "sharded": seen["sharded"], "sectors": int(cache.num_sectors),
            "cache_bytes": int(cache.cache_tensor.numel()), "blocks": int(cache.num_blocks),
            "max_batch_tokens": int(cache.max_batch_tokens), "bytes_per_sector": int(cache.bytes_per_sector),
            "results": len(scope["results"]),
            "answered": sum(bool(r.generated_tokens) and not r.error for r in results),
            "errors": sorted({str(r.error) for r in results if r.error})[:1],
        }  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(figures))


if __name__ == "__main__":
    main()
