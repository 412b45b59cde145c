"""The options the solver searches, and the one order they are ranked by (stated here once; the guide page
"How do I make it fit?" says the same).

An option is one way to call ``from_pretrained`` (dtype, quantization, attn_implementation, use_kernels, the
device_map strategy and a share of each accelerator's budget, ``max_memory``) and ``generate`` (its
cache_implementation). Options are ranked by, in turn:

1. **where the layers are**: every layer on accelerators, then with CPU offload, then with disk offload
   (a budget with no accelerator at all counts the CPU as the device);
2. **precision**: the checkpoint's dtype, then smaller floating dtypes, then quantization by the bits it keeps per
   weight, more first (8-bit methods, then 4-bit ones; a method whose bits can't be read here, its config needing its
   package, after them). Within the same bits: methods that quantize as the weights load before those that
   calibrate on a dataset at load (gptq), then bitsandbytes (the plan's words ``8bit`` / ``4bit``), torchao, HQQ and
   quanto, in that order (:data:`QUANTIZATION_FIRST`: the most used, with kernels on most devices, then the portable
   ones), then the rest in transformers' own order. Whether a method can run here (or on the target) is its plan's
   check: one that can't is a rejection with its reason and fix, never an answer;
3. **cache**: the model's own cache (full precision, on the device), then an offloaded cache, then a quantized
   cache (:data:`CACHE_ORDER`);
4. **attention**: faster before slower (:data:`ATTENTION_ORDER`);
5. **kernels**: use_kernels off, then on (its Hub downloads are not checked before load);
6. **device_map strategy**, in the order transformers lists them (auto first);
7. **memory share**: each accelerator's whole budget, then less (:data:`MEMORY_SHARES`), leaving room for the run:
   ``max_memory`` bounds what from_pretrained fills with weights, and the plan's ``budget`` keeps each device's whole
   memory for the run (the cache and activations may use what the weights leave).

Why the cache comes after the weights' precision and before attention: an offloaded cache loses nothing (it costs
decode speed: each layer's keys and values cross to the host and back every token), and a quantized cache
loses precision only in the cached keys and values (the recent tokens stay full precision), where quantizing the
weights changes every computation; so every weight precision is tried with each cache before the next, lower
precision. Offloaded comes before quantized for the same reason (slower, but exact). A cache choice changes only
the run, never where the layers go, so stage 1 (layers on accelerators) still beats any cache on a smaller stage.

The first option that fits by this order is the answer. Every list is read at run time from what transformers
offers (its attention registry, its device_map strategies, its cache implementations, the quantization words a plan
takes: every method nbhw.quantization() finds transformers quantizes on load with, sized by the same quantizer
stand-in the plan uses).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nbhw.core.advice.quantization_methods import Loads, build_config, loads, method_key, plan_words
from nbhw.core.advice.quantization_sizes import SizingQuantizer
from nbhw.core.plan.arguments import MemoryKey, cache_implementations, strategy_names

# Where the layers are, best first: the placement kinds of a weights-only placement (nbhw.core.plan.placement).
WHERE = ("on accelerators", "with CPU offload", "with disk offload")
WHERE_OF_KIND = {"one_device": 0, "split": 0, "cpu_offload": 1, "disk": 2}
# attn_implementation words, fastest first; a registered name not listed here (flex, paged, Hub kernels) is only
# searched when you pin it.
ATTENTION_ORDER = ("flash_attention_3", "flash_attention_2", "sdpa", "eager")
SMALLER_DTYPES = ("bfloat16", "float16")  # tried below a float32 checkpoint's own dtype, in this order
# Within the same bits, these quantization words first, in this order (module docstring, 2.); the rest follow in
# transformers' order. A word this transformers doesn't take is left out.
QUANTIZATION_FIRST = ("8bit", "4bit", "torchao", "hqq", "quanto")
# cache_implementation words, best first (None: the model's own cache, what generate() makes unasked); another one
# transformers lists (static, offloaded_static) is only searched when you pin it: neither holds less than these.
CACHE_ORDER = (None, "offloaded", "quantized")
MEMORY_SHARES = (1.0, 0.85, 0.7, 0.55)
KERNELS = (False, True)
UNCUT = ("cpu", "disk", "mps")  # max_memory keys a share leaves whole (they hold layers, or run with shared memory)
ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Option:
    """One combination of from_pretrained arguments the solver plans."""

    dtype: str
    quantization: str | None
    attn_implementation: str | None
    use_kernels: bool
    device_map: Any
    share: float = 1.0
    cache_implementation: str | None = None

    def words(self) -> str:
        """The option as a person reads it: 'bfloat16, 4bit, sdpa, device_map=auto, 70% of each accelerator'."""
        parts = [self.dtype if self.quantization is None else f"{self.quantization} ({self.dtype} compute)"]
        if self.cache_implementation is not None:
            parts.append(f"cache_implementation={self.cache_implementation}")
        parts.append(f"attn_implementation={self.attn_implementation or 'default'}")
        if self.use_kernels:
            parts.append("use_kernels=True")
        parts.append(f"device_map={self.device_map}")
        if self.share < 1.0:
            parts.append(f"max_memory {round(self.share * 100)}% of each accelerator")
        return ", ".join(parts)


def attention_words() -> tuple[str, ...]:
    """The attention implementations of ATTENTION_ORDER that transformers registers here."""
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    registered = {"eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()}
    return tuple(a for a in ATTENTION_ORDER if a in registered)


@functools.cache
def quantization_order() -> tuple[str, ...]:
    """Every ``quantization=`` word a plan takes, in the documented order: more bits per weight first, then on-load
    before calibrated, then :data:`QUANTIZATION_FIRST`, then transformers' order."""

    # reads transformers' quantizers (importing every installed quantization package), once per process
    def rank(index_word: tuple[int, str]) -> tuple[float, bool, int, int]:
        index, word = index_word
        key = method_key(word)
        bytes_per_weight = SizingQuantizer(key, build_config(key, "bfloat16")[0]).element
        bits = -8 * bytes_per_weight if bytes_per_weight is not None else float("inf")
        first = QUANTIZATION_FIRST.index(word) if word in QUANTIZATION_FIRST else len(QUANTIZATION_FIRST)
        return bits, loads(key)[0] is Loads.CALIBRATED, first, index

    return tuple(word for _, word in sorted(enumerate(plan_words()), key=rank))


def precisions(checkpoint_dtype: str, pinned: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(dtype, quantization) pairs, higher precision first; a pinned dtype or quantization is kept."""
    size = ITEMSIZE.get(checkpoint_dtype, 4)
    floats = ["auto", *(d for d in SMALLER_DTYPES if ITEMSIZE[d] < size)]
    dtypes = [pinned["dtype"]] if "dtype" in pinned else floats
    quantized = quantization_order()
    if "quantization" in pinned:
        return [(d, pinned["quantization"]) for d in dtypes]
    # quantizing starts from the checkpoint's own dtype (bitsandbytes keeps it as the compute dtype)
    return [(d, None) for d in dtypes] + [(dtypes[0], q) for q in quantized]


def caches(pinned: dict[str, Any]) -> list[str | None]:
    """cache_implementation values: the pinned one, else CACHE_ORDER's that transformers' generate() takes here."""
    if "cache_implementation" in pinned:
        return [pinned["cache_implementation"]]
    offered = cache_implementations()
    return [c for c in CACHE_ORDER if c is None or c in offered]


def strategies(pinned: dict[str, Any]) -> list[Any]:
    """device_map values: the pinned one, else transformers' strategies in its own order."""
    return [pinned["device_map"]] if "device_map" in pinned else list(strategy_names())


def shares(has_budget: bool) -> tuple[float, ...]:
    """Memory shares of each accelerator's budget (yours, or this machine's free memory); only the whole of it
    when no accelerator budget is known."""
    return MEMORY_SHARES if has_budget else (1.0,)


def options(checkpoint_dtype: str, pinned: dict[str, Any], *, has_budget: bool) -> list[Option]:
    """Every option, in the documented order of precision, cache, attention, kernels, strategy and share."""
    attns = [pinned["attn_implementation"]] if "attn_implementation" in pinned else list(attention_words())
    kernels = [pinned["use_kernels"]] if "use_kernels" in pinned else list(KERNELS)
    found = []
    for (dtype, quant), cache, attn, kern, strategy, share in itertools.product(
        precisions(checkpoint_dtype, pinned), caches(pinned), attns, kernels, strategies(pinned), shares(has_budget)
    ):
        found.append(Option(dtype, quant, attn, kern, strategy, share, cache))
    return found


def memory_for(
    share: float, budget: dict[MemoryKey, int], written: Mapping[MemoryKey, int | str] | None = None
) -> dict[MemoryKey, int | str]:
    """max_memory with each accelerator's budget cut to ``share`` (the CPU's stays, as ``written``): whole MiB as
    code reads best, bytes below 64 MiB (tiny test budgets)."""
    mib = 2**20
    words = written or {}

    def cut(v: int) -> int | str:
        left = int(v * share)
        return f"{left // mib}MiB" if left >= 64 * mib else left

    return {k: (cut(v) if k not in UNCUT else words.get(k, v)) for k, v in budget.items()}


def budget_for(
    share: float, budget: dict[MemoryKey, int], written: Mapping[MemoryKey, int | str] | None = None
) -> dict[MemoryKey, int | str] | None:
    """The plan's ``budget`` beside ``memory_for(share, budget)``: each cut device's whole memory (as ``written``),
    which the run may use (max_memory only bounds the weights); None for the whole share."""
    words = written or {}
    return None if share >= 1.0 else {k: words.get(k, v) for k, v in budget.items() if k not in UNCUT}
