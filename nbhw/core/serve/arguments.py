"""The words of ``nbhw.plan(task="serve")``, ``%hw serve`` and ``python -m nbhw serve``. Declarations only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nbhw.core.argument import argument, arguments, checked
from nbhw.core.dtypes import DTYPE
from nbhw.core.errors import UserError
from nbhw.core.hardware.targets import TARGET, Target
from nbhw.core.plan.arguments import (
    check_attn,
    check_context,
    check_device_memory,
    check_reserve,
    tokens,
    word,
)

PERCENT_WORDS = "a fraction in (0, 1], e.g. 0.9"


def _tokens(what: str) -> Any:
    return lambda text: tokens(text, what)


def check_optional_count(what: str, noun: str = "a token count", example: int = 512) -> Any:
    """The check of an optional whole number of at least 1 (``noun``: what it counts, in the message)."""

    def check(value: Any) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{what} {value!r} is not {noun}; valid: a whole number of at least 1, e.g. {example}")
        return value

    return check


def check_optional_tokens(what: str) -> Any:
    return check_optional_count(what)


def check_memory_percent(value: Any) -> float | None:
    """``max_memory_percent``: the share of the memory left after the weights that the cache may take."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise UserError(f"memory_percent {value!r} is out of range; valid: {PERCENT_WORDS}")
    return float(value)


def percent_from_text(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UserError(f"memory_percent {text!r} is not a number; valid: {PERCENT_WORDS}") from None


COMPILE_LEVELS = (0, 1, 2, 3)  # ContinuousBatchingConfig.default_compile_level
# The attention implementations continuous batching serves (what the Serve mode's dropdown offers; any key
# transformers knows is taken as a word).
SERVED_ATTENTION = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")
# The torch devices of a catalog target a serving plan is made for: transformers' continuous batching asks torch for
# the device by this name (torch has no "tpu", "neuron" or "npu" device without its vendor's package).
SERVED_ON = ("cuda", "xpu", "hpu", "mps")


TP_SIZES = (1, 2, 4, 8)  # what the Serve mode's dropdown offers; any whole number of devices is taken as a word


# ``tp_size``: tensor-parallel ranks, one device each (the model's own TP plan, ``tp_plan="auto"``)
check_tp_size = check_optional_count("tp_size", "a number of devices", 2)


def tp_size_from_text(text: str) -> int:
    return int(text) if text.strip().isdigit() else check_tp_size(text)  # a word that is not a count: its message


def check_compile_level(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or value not in COMPILE_LEVELS:
        raise UserError(f"compile_level {value!r} is not valid; valid: {', '.join(map(str, COMPILE_LEVELS))}")
    return int(value)


def compile_level_from_text(text: str) -> int:
    if not text.strip().isdigit():
        raise UserError(f"compile_level {text!r} is not valid; valid: {', '.join(map(str, COMPILE_LEVELS))}")
    return int(text)


@dataclass(frozen=True)
class ServeArgs:
    """What the user asked of continuous batching (``generate_batch``, ``init_continuous_batching``,
    ``transformers serve --continuous-batching``), checked."""

    target: Target | None = argument(**TARGET, control="dropdown")
    tp_size: int | None = argument(
        metavar="DEVICES", parse=tp_size_from_text, check=check_tp_size, control="dropdown",
        help="tensor-parallel ranks (tp_plan='auto' under torchrun), one device each (default: every card of a "
        "target whose heads split over them, else 1)",
    )  # fmt: skip
    dtype: str = argument(**DTYPE, default="auto", control="dropdown")
    attn_implementation: str | None = argument(
        metavar="IMPL", aliases=("--attn",), check=check_attn, control="dropdown",
        help="sdpa (default), eager (served as paged|eager), flash_attention_2, flash_attention_3",
    )  # fmt: skip
    device_memory: int | str | None = argument(
        metavar="SIZE", check=check_device_memory, control="text",
        help="the serving device's memory, e.g. 24GiB (default: this machine's first accelerator, else its CPU)",
    )  # fmt: skip
    reserve: int | str | None = argument(
        metavar="SIZE", check=check_reserve,
        help="what the device holds outside tensors (CUDA context, workspaces); default: nbhw's figure",
    )  # fmt: skip
    context: int | None = argument(
        metavar="TOKENS", parse=_tokens("context"), check=check_context, word=word, control="text",
        help="tokens per request at full length, prompt + answer: 4096, 32k (default 4,096, or the model's maximum "
        "when smaller)",
    )  # fmt: skip
    prompt: int | None = argument(
        metavar="TOKENS", parse=_tokens("prompt"), check=check_optional_tokens("prompt"), word=word, control="text",
        help="a typical request's prompt tokens (with --answer: how many such requests fit too)",
    )  # fmt: skip
    answer: int | None = argument(
        metavar="TOKENS", parse=_tokens("answer"), check=check_optional_tokens("answer"), word=word, control="text",
        help="a typical request's generated tokens",
    )  # fmt: skip
    memory_percent: float | None = argument(
        metavar="FRACTION", parse=percent_from_text, check=check_memory_percent, control="text",
        help="ContinuousBatchingConfig.max_memory_percent: the share of the memory left after the weights the "
        "cache may take (default: transformers' own choice)",
    )  # fmt: skip
    page_size: int | None = argument(
        metavar="TOKENS", parse=_tokens("page_size"), check=check_optional_tokens("page_size"), word=word,
        control="text",
        help="tokens per page of a full-attention layer (default: transformers' 256)",
    )  # fmt: skip
    compile_level: int | None = argument(
        metavar="LEVEL", parse=compile_level_from_text, check=check_compile_level, control="dropdown",
        help="ContinuousBatchingConfig.default_compile_level: 0 (no compile, the default) to 3; the graphs decision "
        "reads the compile configs it makes",
    )  # fmt: skip
    max_batch_tokens: int | None = argument(
        metavar="TOKENS", parse=_tokens("max_batch_tokens"), check=check_optional_tokens("max_batch_tokens"),
        word=word, control="text", help="tokens one forward takes at most (default: transformers' 8,192)",
    )  # fmt: skip


SERVE_ARGUMENTS = arguments(ServeArgs)
SERVE_NAMES = frozenset(a.name for a in SERVE_ARGUMENTS)


def serve_args(**values: Any) -> ServeArgs:
    """Check every argument; the first mistake raises a one-line UserError naming the valid values."""
    unknown = sorted(set(values) - SERVE_NAMES)
    if unknown:
        raise UserError(f"{unknown[0]} is not a serving argument; task='serve' takes: {', '.join(sorted(SERVE_NAMES))}")
    found: ServeArgs = checked(ServeArgs, values)
    if found.target is not None and found.target.accelerator.device not in SERVED_ON:
        kind = found.target.accelerator.device
        raise UserError(f"target={found.target.text!r} is a {kind} device; a serving plan is made for "
                        f"{', '.join(SERVED_ON)} targets (or this machine)")  # fmt: skip
    if found.target is not None and found.device_memory is not None:
        raise UserError("target and device_memory both set the memory to plan for; give one")
    if found.target is not None and found.tp_size is not None and found.tp_size > found.target.count:
        raise UserError(f"tp_size {found.tp_size} needs {found.tp_size} devices; target={found.target.text!r} has "
                        f"{found.target.count}; valid: 1 to {found.target.count}")  # fmt: skip
    if (found.prompt is None) != (found.answer is None):
        raise UserError("prompt and answer describe a typical request together; give both, e.g. 512 and 256")
    return found
