"""The arguments of a load plan, checked up front by the libraries' own rules: one-line UserErrors for mistakes.

A value that is well formed but names hardware this machine lacks (``cuda:1`` on a laptop) is *not* a mistake
here: the plan may be for other hardware, and the dry run reports it instead. Importing this module is cheap;
torch, transformers and accelerate are imported when a value needs them.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from nbhw.core.advice.quantization_methods import check_method
from nbhw.core.argument import argument, arguments, checked
from nbhw.core.dtypes import DTYPE
from nbhw.core.errors import UserError, one_of
from nbhw.core.hardware import backends
from nbhw.core.hardware.targets import TARGET, Target, check_target_args
from nbhw.core.hf import library_source
from nbhw.core.hf.meta_build import is_hub_kernel, quiet
from nbhw.core.plan.pinned import check_pinned
from nbhw.core.plan.run_figures import PADDINGS
from nbhw.core.render import py_literal

# --quantize word -> the BitsAndBytesConfig flag it sets (the other words are transformers' method keys).
QUANTIZATION = {"4bit": "load_in_4bit", "8bit": "load_in_8bit"}
DISK = "disk"
NO_DEVICE_MAP = "none"  # the word for device_map=None

DeviceMap = str | int | dict[str, int | str] | None
# Device strings of nbhw's backends that torch knows only once their plugin package is imported.
PLUGIN_DEVICES = tuple(sorted({b.device for b in backends.BUILTIN} - {"cpu", "cuda", "mps", "xpu", "hpu", "meta"}))
MemoryKey = int | str


# ---------------------------------------------------------------- device_map


@lru_cache(maxsize=1)
def strategy_names() -> tuple[str, ...]:
    """The device_map strings transformers computes a map for: read from its source (no import, so the Load tab's
    first code doesn't wait for transformers' modeling code), else from its own error message."""
    found = library_source.device_map_strategies()
    if found:
        return found
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.integrations.accelerate import check_and_set_device_map

    try:
        check_and_set_device_map("nbhw: not a device")
    except ValueError as exc:
        return tuple(re.findall(r"'([A-Za-z0-9_]+)'", str(exc)))
    return ()


def _valid_device_maps() -> str:
    names = ", ".join(strategy_names()) or "auto"
    return f"{names}, a torch device (cpu, cuda:0, mps, xpu:0, ...), an int >= 0, or a dict of module -> device"


def _torch_device(text: str) -> str:
    """A device string as torch parses it ('cuda' stays 'cuda'); UserError when torch knows no such device."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    try:
        return str(torch.device(text))
    except (RuntimeError, ValueError, TypeError) as exc:
        if re.fullmatch(rf"({'|'.join(PLUGIN_DEVICES)})(:\d+)?", text):
            # A plugin's device (tpu:0 without torch_tpu imported here): well formed, for hardware that isn't here.
            return text

        why = (
            "neither a device_map strategy nor a device type this torch knows"
            if "device type" in str(exc)
            else f"not valid here ({exc})"
        )
        raise UserError(f"device_map {text!r} is {why}; valid: {_valid_device_maps()}") from None


def _is_strategy(text: str) -> bool:
    """Whether transformers treats this string as a strategy (auto, balanced, ...) rather than a device: its
    check_and_set_device_map returns exactly those strings as they are."""
    return text in strategy_names()


def _dict_value(module: str, value: Any) -> int | str:
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    if isinstance(value, bool):
        raise UserError(
            f"device_map[{module!r}] = {value!r} is not a device; valid: an int >= 0, 'cpu', 'disk', cuda:0"
        )
    if isinstance(value, int):
        if value < 0:
            raise UserError(f"device_map[{module!r}] = {value}: device indices are >= 0")
        return value
    if isinstance(value, torch.device):
        return str(value)
    if isinstance(value, str):
        return value if value == DISK else _torch_device(value)
    raise UserError(f"device_map[{module!r}] = {value!r} is not a device; valid: an int >= 0, 'cpu', 'disk', cuda:0")


def check_device_map(value: Any) -> DeviceMap:
    """Normalise a device_map the way transformers' check_and_set_device_map reads it; UserError when it can't."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    if value is None:
        return None
    if isinstance(value, torch.device):
        return str(value)
    if isinstance(value, bool):
        raise UserError(f"device_map {value!r} is not valid; valid: {_valid_device_maps()}")
    if isinstance(value, int):
        if value < 0:
            raise UserError(f"device_map {value} is negative; valid: {_valid_device_maps()} (use 'cpu' for the CPU)")
        return value
    if isinstance(value, Mapping):
        if not value:
            raise UserError(f"device_map {{}} is empty; valid: {_valid_device_maps()}")
        for key in value:
            if not isinstance(key, str):
                raise UserError(f"device_map keys are module names (strings, '' for the whole model), not {key!r}")
        return {key: _dict_value(key, v) for key, v in value.items()}
    if isinstance(value, str):
        if _is_strategy(value):
            return value
        if value == DISK:
            raise UserError(f"device_map 'disk' only works per module in a dict; valid: {_valid_device_maps()}")
        return _torch_device(value)
    raise UserError(f"device_map {value!r} is not valid; valid: {_valid_device_maps()}")


def device_map_from_text(text: str) -> DeviceMap:
    """``--device-map`` words: a strategy, a device, an int, a dict literal like {"": "cpu"}, or none."""
    text = text.strip()
    if text.lower() == NO_DEVICE_MAP:
        return None
    if re.fullmatch(r"-?\d+", text):
        return check_device_map(int(text))
    if text.startswith("{"):
        try:
            parsed = ast.literal_eval(text)
        # TypeError: an unhashable key ({[1]: 0}); RecursionError / MemoryError: nesting too deep for the parser.
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
            raise UserError(f'device_map {text!r} is not a dict literal like {{"": "cpu"}}') from None
        return check_device_map(parsed)
    return check_device_map(text)


# ---------------------------------------------------------------- attention, quantization


def check_attn(value: Any) -> str | None:
    """An attn_implementation transformers knows: its registered keys, paged|key, or a Hub kernel 'org/repo'."""
    if value is None:
        return None
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    keys = ["eager", *sorted(set(ALL_ATTENTION_FUNCTIONS.valid_keys()) - {"eager"})]
    if isinstance(value, str) and (value.removeprefix("paged|") in keys or is_hub_kernel(value)):
        return value
    raise one_of("attn_implementation", value, [*keys, "a Hub kernel 'org/repo[@rev][:func]'"])


def check_quantization(value: Any) -> str | None:
    """'4bit', '8bit' (bitsandbytes), a method transformers quantizes on load with ('torchao', ...), or None."""
    return check_method(value)


def cache_implementations() -> tuple[str, ...]:
    """The cache_implementation words generate() takes, read from transformers (its deprecated aliases left out)."""
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.generation import configuration_utils as generation

    return (*generation.DYNAMIC_CACHE_IMPLEMENTATIONS, *generation.STATIC_CACHE_IMPLEMENTATIONS)


def check_cache_implementation(value: Any) -> str | None:
    """A cache_implementation transformers' generate() takes (dynamic, offloaded, quantized, static, ...), or None."""
    if value is None:
        return None
    valid = cache_implementations()
    if value not in valid:
        raise one_of("cache_implementation", value, valid)
    return str(value)


# ---------------------------------------------------------------- max_memory


def size_bytes(size: int | str, what: str = "max_memory size") -> int:
    """A size as accelerate's convert_file_size_to_int reads it ('70GiB', '500MB', or bytes as an int)."""
    # lazy: import nbhw and %load_ext nbhw stay free of accelerate
    from accelerate.utils import convert_file_size_to_int

    if isinstance(size, bool) or not isinstance(size, int | str):
        raise UserError(f"{what} {size!r} is not a size; valid: bytes as an int, or '70GiB', '500MB'")
    if isinstance(size, int) and size < 0:
        raise UserError(f"{what} {size} is negative")
    try:
        value = int(convert_file_size_to_int(size))
    except (ValueError, OverflowError):
        value = -1
    if value < 0:
        raise UserError(
            f"{what} {size!r} is not valid; valid: a number with a unit, e.g. 70GiB, 512MiB, 80GB, 500MB "
            "(accelerate's convert_file_size_to_int), or bytes as an int"
        )
    return value


@lru_cache(maxsize=1)
def _memory_device_names() -> tuple[str, ...]:
    """The non-GPU max_memory keys accelerate accepts, read from its own error message."""
    from accelerate.utils import get_max_memory  # lazy: import nbhw and %load_ext nbhw stay free of accelerate

    try:
        get_max_memory({"nbhw: not a device": 0})
    except ValueError as exc:
        return tuple(re.findall(r"'([a-z]+)'", str(exc)))
    return ()


def _memory_key(key: Any, what: str = "max_memory") -> MemoryKey:
    names = _memory_device_names()
    valid = f"an int >= 0 (GPU/XPU index), {', '.join(names)}"
    if isinstance(key, bool):
        raise UserError(f"{what} device {key!r} is not valid; valid: {valid}")
    if isinstance(key, int):
        if key < 0:
            raise UserError(f"{what} device {key} is negative; valid: {valid}")
        return key
    if isinstance(key, str):
        if re.fullmatch(r"\d+", key):
            return int(key)
        if key in names:
            return key
    raise UserError(f"{what} device {key!r} is not valid; valid: {valid}")


def check_max_memory(
    value: Mapping[Any, Any] | Iterable[str] | None, what: str = "max_memory"
) -> dict[MemoryKey, int | str] | None:
    """A max_memory dict ({0: "70GiB", "cpu": "200GiB"}) or DEV=SIZE words, checked by accelerate's rules."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    items = list(value.items()) if isinstance(value, Mapping) else [_split_item(item, what) for item in value]
    result: dict[MemoryKey, int | str] = {}
    for raw_key, size in items:
        key = _memory_key(raw_key, what)
        if key in result:
            raise UserError(f"{what} names device {key!r} twice")
        size_bytes(size, f"{what} size")
        result[key] = size
    if not result:
        raise UserError(f"{what} is empty; give DEV=SIZE, e.g. 0=70GiB cpu=200GiB")
    return result


def check_device_memory(value: Any) -> int | str | None:
    """A device's memory (``device_memory`` of training and serving plans), as accelerate reads sizes ('80GiB',
    '24GB', or bytes); None: the device's own."""
    if value is None:
        return None
    size_bytes(value, "device_memory")
    return value  # type: ignore[no-any-return]


def check_budget(value: Mapping[Any, Any] | Iterable[str] | None) -> dict[MemoryKey, int | str] | None:
    """``budget``: DEV=SIZE like max_memory (each device's memory for the run)."""
    return check_max_memory(value, "budget")


def check_budget_against(
    budget: dict[MemoryKey, int | str] | None, max_memory: dict[MemoryKey, int | str] | None
) -> None:
    """A budget names devices of max_memory, each at least what max_memory lets the weights fill."""
    if budget is None:
        return
    if max_memory is None:
        raise UserError("budget is each device's memory when max_memory is less: give max_memory with it")
    for key, size in budget.items():
        if key not in max_memory:
            valid = ", ".join(str(k) for k in max_memory)
            raise UserError(f"budget names device {key!r}, which max_memory does not; valid: {valid}")
        if size_bytes(size) < size_bytes(max_memory[key]):
            raise UserError(
                f"budget {key}={size} is less than max_memory {key}={max_memory[key]} (what the weights may fill); "
                f"valid: at least {max_memory[key]}"
            )


def _split_item(item: Any, what: str) -> tuple[str, str]:
    if not isinstance(item, str) or item.count("=") != 1:
        raise UserError(f"{what} entry {item!r} is not DEV=SIZE, e.g. 0=70GiB cpu=200GiB")
    key, size = item.split("=")
    return key.strip(), size.strip()


# ---------------------------------------------------------------- the run: context, batch, encoder length, reserve

DEFAULT_CONTEXT = 4096
MOST_TOKENS = 1 << 24  # 16,777,216: past any published model's positions; a larger figure is a typo
MOST_SEQUENCES = 65_536
_SUFFIX = {"": 1, "k": 1024, "m": 1024**2}


def tokens(text: str, what: str = "context") -> int:
    """A token count as people write it: 32768, 32k, 32K, 128k, 1m (k = 1,024, as 32k context windows are)."""
    m = re.fullmatch(r"\s*(-?\d[\d_,]*)\s*([kKmM]?)\s*", text)
    if m is None:
        raise UserError(f"{what} {text!r} is not a token count; valid: a whole number like 4096, 32k, 32K or 128k")
    return int(m.group(1).replace("_", "").replace(",", "")) * _SUFFIX[m.group(2).lower()]


def _count(value: Any, what: str, low: int, high: int, unit: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{what} {value!r} is not a whole number; valid: {low:,} to {high:,} {unit}")
    if not low <= value <= high:
        raise UserError(f"{what} {value:,} is out of range; valid: {low:,} to {high:,} {unit}")
    return value


def check_context(value: Any) -> int | None:
    """Tokens per sequence, prompt + generated: 2 (one prompt token and one generated) up to 16,777,216."""
    if value is None:
        return None
    return _count(value, "context", 2, MOST_TOKENS, "tokens per sequence (prompt + generated), e.g. 4096, 32k")


def check_batch(value: Any) -> int:
    """Sequences generated together: 1 to 65,536."""
    return _count(value, "batch", 1, MOST_SEQUENCES, "sequences")


def batch_from_text(text: str) -> int:
    """``--batch`` words: a whole number (4, 16)."""
    if not re.fullmatch(r"\s*-?\d+\s*", text):
        raise UserError(f"batch {text!r} is not a whole number; valid: 1 to {MOST_SEQUENCES:,} sequences")
    return int(text)


PADDING_WORDS = tuple(PADDINGS)
DEFAULT_PADDING = "left"  # a batch from a tokenizer is padded; at batch 1 it is the same run as "none"


def check_padding(value: Any) -> str:
    """How the batch's prompts come to generate(): left (padded on the left to the longest) or none (no padding)."""
    if value not in PADDING_WORDS:
        raise one_of("padding", value, PADDING_WORDS)
    return str(value)


def encoder_length_from_text(text: str) -> int:
    """``--encoder-length`` words: a token count like 512 or 4k."""
    return tokens(text, "encoder_length")


def check_encoder_length(value: Any) -> int | None:
    """Tokens the encoder of an encoder-decoder model reads: 1 up to 16,777,216 (the model's own limit: in the plan)."""
    if value is None:
        return None
    return _count(value, "encoder_length", 1, MOST_TOKENS, "tokens the encoder reads, e.g. 512, 4k")


def check_reserve(value: Any) -> int | str | None:
    """A size per accelerator as accelerate reads sizes ('600MiB', '1GiB', or bytes), kept as written."""
    if value is None:
        return None
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
        value = int(value)
    size_bytes(value, "reserve")
    return value  # type: ignore[no-any-return]


KERNELS_WORDS = {"true": True, "on": True, "yes": True, "false": False, "off": False, "no": False}


def kernels_from_text(text: str) -> bool:
    """use_kernels from a word: true / false (on / off, yes / no)."""
    found = KERNELS_WORDS.get(text.strip().lower())
    if found is None:
        raise UserError(f"use_kernels {text!r}: valid: true, false (or leave it out for transformers' default)")
    return found


def check_use_kernels(value: Any) -> bool | None:
    """use_kernels: True, False, or None (transformers' default)."""
    if value is None or isinstance(value, bool):
        return value
    raise UserError(f"use_kernels {value!r}: valid: True, False, None (transformers' default)")


def word(value: Any) -> Any:
    """A number as the text field shows it (None stays None: the field is empty)."""
    return None if value is None else str(value)


# ---------------------------------------------------------------- the declaration


def device_map_word(value: DeviceMap) -> str:
    """The word for a device_map value (None -> "none", a dict as a literal), as --device-map takes it."""
    if value is None:
        return NO_DEVICE_MAP
    if isinstance(value, str):
        return value
    return py_literal(value)


def memory_words(value: dict[MemoryKey, int | str] | None) -> tuple[str, ...]:
    """max_memory as DEV=SIZE words, as --max-memory takes them."""
    return tuple(f"{k}={v}" for k, v in (value or {}).items())


@dataclass(frozen=True)
class PlanArgs:
    """What the user asked ``from_pretrained`` to do, normalised (sizes kept as written for the code).

    Each field declares one argument (:func:`nbhw.core.argument.argument`): every surface reads it from here.
    """

    target: Target | None = argument(**TARGET, control="dropdown")
    dtype: str = argument(**DTYPE, default="auto", control="dropdown", emits="dtype")
    device_map: DeviceMap = argument(
        default="auto", metavar="MAP", parse=device_map_from_text, check=check_device_map, word=device_map_word,
        control="dropdown", emits="device_map",
        help='auto (default), balanced, balanced_low_0, sequential, a device (cpu, cuda:0), an int, {"": "cpu"}, none',
    )  # fmt: skip
    max_memory: dict[MemoryKey, int | str] | None = argument(
        kind="words", metavar="DEV=SIZE", check=check_max_memory, word=memory_words, control="sizes",
        emits="max_memory", help="per-device memory budget, e.g. 0=70GiB cpu=200GiB",
    )  # fmt: skip
    budget: dict[MemoryKey, int | str] | None = argument(
        kind="words", metavar="DEV=SIZE", check=check_budget, word=memory_words,
        help="each device's memory for the run when max_memory is less (from_pretrained fills max_memory with "
        "weights; the rest is left for the cache and activations), e.g. 0=24GiB 1=24GiB; default: max_memory",
    )  # fmt: skip
    attn_implementation: str | None = argument(
        metavar="IMPL", aliases=("--attn",), check=check_attn, control="dropdown", emits="attn_implementation",
        help="attn_implementation, e.g. sdpa, eager, flash_attention_2, or a Hub kernel org/repo",
    )  # fmt: skip
    use_kernels: bool | None = argument(
        kind="toggle", aliases=("--kernels",), parse=kernels_from_text, check=check_use_kernels, word=word,
        control="dropdown", emits="use_kernels",
        help="use_kernels=True swaps supported layers for Hub kernels, --no-kernels writes use_kernels=False; not "
        "given: transformers' own default (on since 5.25, unless USE_HUB_KERNELS turns it off)",
    )  # fmt: skip
    quantization: str | None = argument(
        aliases=("--quantize",), metavar="METHOD", check=check_quantization, control="dropdown",
        emits="quantization_config",
        help="quantize the weights on load: 4bit or 8bit (bitsandbytes), or a method transformers quantizes on load "
        "with (torchao, quanto, ...; %hw quantization lists them)",
    )  # fmt: skip
    cache_implementation: str | None = argument(
        metavar="IMPL", check=check_cache_implementation, control="dropdown", emits="cache_implementation",
        help="the cache generate() makes: dynamic (the default), offloaded (layers not in use kept in host memory), "
        "quantized (optimum-quanto, recent tokens kept in full precision), static, offloaded_static",
    )  # fmt: skip
    # The run: what generating needs besides the weights. Not from_pretrained keywords, so the cell is the same.
    context: int | None = argument(
        metavar="TOKENS", parse=tokens, check=check_context, word=word, control="text",
        help=f"tokens per sequence, prompt + generated: 4096, 32k, 128k (default {DEFAULT_CONTEXT:,}, or the model's "
        "maximum when smaller); for encoder-decoder models the decoder's",
    )  # fmt: skip
    batch: int = argument(
        default=1, metavar="N", parse=batch_from_text, check=check_batch, word=word, control="text",
        help="sequences generated together (default 1)",
    )  # fmt: skip
    padding: str = argument(
        default=DEFAULT_PADDING, choices=PADDING_WORDS, check=check_padding, control="dropdown",
        help="how the batch's prompts come: left (default: a tokenizer's batch for generate(), padded on the left to "
        "the longest prompt, so transformers builds a batch x prompt x context attention mask; at batch 1 nothing "
        "is padded) or none (every prompt the same length, unpadded)",
    )  # fmt: skip
    encoder_length: int | None = argument(
        metavar="TOKENS", parse=encoder_length_from_text, check=check_encoder_length, word=word,
        control="text", help="encoder-decoder models (T5, Whisper): tokens the encoder reads; default: the context "
        "(speech encoders: their fixed window, Whisper 1,500)",
    )  # fmt: skip
    reserve: int | str | None = argument(
        metavar="SIZE", check=check_reserve,
        help="memory each accelerator holds outside tensors (CUDA context, cuBLAS workspaces), e.g. 600MiB; "
        "default: nbhw's stated figure for the backend",
    )  # fmt: skip

    # A pinned run to check this one against: its arguments fill in what the call does not give.
    pinned: str | None = argument(
        metavar="PATH", check=check_pinned,
        help="a JSON file nbhw.pin() / %hw pin wrote: plan that run again (its model and arguments, where not "
        "given) and compare with what it measured",
    )  # fmt: skip

    @property
    def max_memory_bytes(self) -> dict[MemoryKey, int] | None:
        """``max_memory`` with every size in bytes, as accelerate converts it."""
        if self.max_memory is None:
            return None
        return {k: size_bytes(v) for k, v in self.max_memory.items()}

    @property
    def budget_bytes(self) -> dict[MemoryKey, int] | None:
        """``budget`` (each device's memory for the run, where max_memory is less) in bytes."""
        return None if self.budget is None else {k: size_bytes(v, "budget") for k, v in self.budget.items()}

    @property
    def reserve_bytes(self) -> int | None:
        """``reserve`` in bytes (None: nbhw's stated figure per backend)."""
        return None if self.reserve is None else size_bytes(self.reserve, "reserve")


PLAN_ARGUMENTS = arguments(PlanArgs)


def plan_args(**values: Any) -> PlanArgs:
    """Check every argument; the first mistake raises a one-line UserError naming the valid values."""
    with quiet():
        found: PlanArgs = checked(PlanArgs, values)
    check_target_args(found.target, found.max_memory)
    check_budget_against(found.budget, found.max_memory)
    return found
