"""The arguments of a training plan, declared once: what to train (full / LoRA / QLoRA), at which batch and
sequence length, with which optimizer, and on how many devices with which strategy.

Each field of :class:`TrainArgs` declares one argument (:func:`nbhw.core.argument.argument`): ``nbhw.train_plan()``'s
keywords, the options of ``%hw train`` and ``python -m nbhw train``, and ``to_dict()`` all derive from it. The words
are the ones ``TrainingArguments`` and peft use. Importing this module is cheap; transformers is imported when a
value needs it (the optimizer names).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from nbhw.core.argument import argument, arguments, checked
from nbhw.core.errors import UserError, one_of
from nbhw.core.hardware.targets import TARGET, Target, target_of
from nbhw.core.plan.arguments import check_device_memory, size_bytes, tokens, word

METHODS = ("full", "lora", "qlora")
PRECISIONS = ("auto", "bfloat16", "float16", "float32")
STRATEGIES = ("auto", "single", "ddp", "fsdp2", "zero2", "zero3", "tp")
DEVICE_TYPES = ("auto", "cuda", "cpu")
ALL_LINEAR = "all-linear"  # peft's word for every linear layer but the output embedding
DEFAULT_CONTEXT = 2048
MOST_TOKENS = 1 << 24
MOST_ROWS = 65_536


def _whole(value: Any, what: str, low: int, high: int, unit: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{what} {value!r} is not a whole number; valid: {low:,} to {high:,} {unit}")
    if not low <= value <= high:
        raise UserError(f"{what} must be a whole number of at least {low:,} (up to {high:,} {unit}), got {value:,}")
    return value


def _int_word(what: str) -> Any:
    def parse(text: str) -> int:
        try:
            return int(text.strip())
        except ValueError:
            raise UserError(f"{what} {text!r} is not a whole number") from None

    return parse


def check_batch(value: Any) -> int:
    """per_device_train_batch_size: 1 to 65,536 rows."""
    return _whole(value, "batch", 1, MOST_ROWS, "rows per device per step")


def check_context(value: Any) -> int:
    """Tokens per training row: 2 to 16,777,216."""
    return _whole(value, "context", 2, MOST_TOKENS, "tokens per row, e.g. 2048, 4k")


def check_accumulation(value: Any) -> int:
    """gradient_accumulation_steps: 1 to 65,536."""
    return _whole(value, "gradient_accumulation_steps", 1, MOST_ROWS, "micro-batches per optimizer step")


def check_lora_r(value: Any) -> int:
    """The LoRA rank: a whole number of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"lora_r must be a whole number of at least 1 (the LoRA rank; 8-64 is usual), got {value!r}")
    return value


def check_lora_alpha(value: Any) -> int | None:
    """LoRA's scaling numerator; None: twice the rank."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"lora_alpha must be a whole number of at least 1 (default: 2 x lora_r), got {value!r}")
    return value


def check_targets(value: Any) -> tuple[str, ...] | str | None:
    """Module names LoRA wraps (last name component, as peft matches them), 'all-linear', or None (peft's default
    for the model type). Whether they exist is the model's question: the dry run answers it."""
    if value is None or value == ALL_LINEAR:
        return value  # type: ignore[no-any-return]
    if isinstance(value, str):
        value = (value,)
    names = tuple(value)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise UserError(
            f"lora_target_modules {value!r} is not a list of module names, e.g. q_proj v_proj, or all-linear"
        )
    return ("all-linear",)[0] if names == (ALL_LINEAR,) else names


def targets_word(value: tuple[str, ...] | str | None) -> tuple[str, ...]:
    """lora_target_modules as --lora-target-modules words."""
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else value


@lru_cache(maxsize=1)
def optimizer_names() -> tuple[str, ...]:
    """The ``optim`` names TrainingArguments takes (its OptimizerNames enum)."""
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.training_args import OptimizerNames

    return tuple(o.value for o in OptimizerNames)


def check_optimizer(value: Any) -> str:
    """A TrainingArguments ``optim`` name (adamw_torch, adamw_bnb_8bit, adafactor, sgd, ...)."""
    if value in optimizer_names():
        return str(value)
    raise UserError(f"unknown optimizer {value!r}; TrainingArguments' optim takes: {', '.join(optimizer_names())}")


def _choice(what: str, valid: tuple[str, ...]) -> Any:
    def check(value: Any) -> str:
        if value in valid:
            return str(value)
        raise one_of(what, value, valid)

    return check


def check_count(what: str) -> Any:
    def check(value: Any) -> int:
        return _whole(value, what, 1, 65_536, "")

    return check


def context_word(text: str) -> int:
    return tokens(text, "context")


@dataclass(frozen=True)
class TrainArgs:
    """What to fine-tune and how, in the words TrainingArguments and peft use. Frozen and hashable: it keys the
    per-process cache of dry runs."""

    method: str = argument(
        default="lora", choices=METHODS, check=_choice("method", METHODS), control="dropdown",
        help="full fine-tuning, LoRA (peft) or QLoRA (bitsandbytes 4-bit base + LoRA); default lora",
    )  # fmt: skip
    batch: int = argument(
        default=1, metavar="N", parse=_int_word("batch"), check=check_batch, word=word, control="text",
        help="rows per device per step: TrainingArguments' per_device_train_batch_size (default 1)",
    )  # fmt: skip
    context: int = argument(
        default=DEFAULT_CONTEXT, metavar="TOKENS", parse=context_word, check=check_context, word=word,
        control="text", help=f"tokens per training row: 512, 2048, 4k (default {DEFAULT_CONTEXT:,})",
    )  # fmt: skip
    gradient_checkpointing: bool = argument(
        default=False, kind="switch", aliases=("--activation-checkpointing",), check=bool, control="checkbox",
        help="recompute activations in backward (TrainingArguments' activation_checkpointing)",
    )  # fmt: skip
    optimizer: str = argument(
        default="adamw_torch", metavar="OPTIM", check=check_optimizer, control="text",
        help="TrainingArguments' optim: adamw_torch (default), adamw_bnb_8bit, adafactor, sgd, ...",
    )  # fmt: skip
    dtype: str = argument(
        default="auto", choices=PRECISIONS, check=_choice("dtype", PRECISIONS), control="dropdown",
        help="weights and compute: bfloat16, float16, float32, or auto (bf16 where the device has it, else fp16; "
        "float32 on a CPU)",
    )  # fmt: skip
    lora_r: int = argument(
        default=16, metavar="R", parse=_int_word("lora_r"), check=check_lora_r, word=word, control="text",
        help="LoRA rank (default 16)",
    )  # fmt: skip
    lora_alpha: int | None = argument(
        metavar="ALPHA", parse=_int_word("lora_alpha"), check=check_lora_alpha, word=word, control="text",
        help="LoRA alpha (default 2 x lora_r)",
    )  # fmt: skip
    lora_target_modules: tuple[str, ...] | str | None = argument(
        kind="words", metavar="NAME", check=check_targets, word=targets_word, control="text",
        help="layers LoRA wraps, e.g. q_proj v_proj, or all-linear (default: peft's list for the model type)",
    )  # fmt: skip
    gradient_accumulation_steps: int = argument(
        default=1, metavar="N", parse=_int_word("gradient_accumulation_steps"), check=check_accumulation, word=word,
        control="text", help="micro-batches per optimizer step (default 1)",
    )  # fmt: skip
    devices: int = argument(
        default=1, metavar="N", parse=_int_word("devices"), check=check_count("devices"), word=word,
        control="text", help="devices per node, one process each (default 1)",
    )  # fmt: skip
    nodes: int = argument(
        default=1, metavar="M", parse=_int_word("nodes"), check=check_count("nodes"), word=word, control="text",
        help="machines (default 1)",
    )  # fmt: skip
    strategy: str = argument(
        default="auto", choices=STRATEGIES, check=_choice("strategy", STRATEGIES), control="dropdown",
        help="auto (the cheapest that fits), single, ddp, fsdp2, zero2, zero3, tp",
    )  # fmt: skip
    offload: bool = argument(
        default=False, kind="switch", check=bool, control="checkbox",
        help="fsdp2 / zero2 / zero3: keep optimizer state (and sharded weights) in host memory",
    )  # fmt: skip
    device_memory: int | str | None = argument(
        metavar="SIZE", check=check_device_memory, control="text",
        help="memory per device, e.g. 80GiB (default: this machine's first accelerator)",
    )  # fmt: skip
    device_type: str = argument(
        default="auto", choices=DEVICE_TYPES, check=_choice("device_type", DEVICE_TYPES), control="dropdown",
        help="the devices trained on: cuda or cpu (default: this machine's accelerator, else cpu)",
    )  # fmt: skip
    # A catalog target: its device type, memory and count (devices) are the catalog's.
    target: Target | None = argument(**TARGET, control="dropdown")
    # Resolved by the plan, not an argument: fp16 autocast over float32 weights (full fine-tuning in fp16).
    mixed_precision: str | None = None

    @property
    def alpha(self) -> int:
        """lora_alpha as peft gets it (twice the rank unless given)."""
        return self.lora_alpha or 2 * self.lora_r

    @property
    def world_size(self) -> int:
        return self.devices * self.nodes

    @property
    def device_memory_bytes(self) -> int | None:
        return None if self.device_memory is None else size_bytes(self.device_memory, "device_memory")


TRAIN_ARGUMENTS = arguments(TrainArgs)


def require_peft() -> None:
    """LoRA needs peft: say how to get it (the floor transformers states), not an ImportError deep inside."""
    if importlib.util.find_spec("peft") is None:
        # lazy: import nbhw and %load_ext nbhw stay free of transformers
        from transformers.integrations.peft import MIN_PEFT_VERSION

        raise UserError(f"method='lora' and 'qlora' need peft: pip install 'peft>={MIN_PEFT_VERSION}'")


def require_bitsandbytes() -> None:
    """QLoRA and 8-bit optimizers need bitsandbytes (the floor transformers states)."""
    if importlib.util.find_spec("bitsandbytes") is None:
        # lazy: import nbhw and %load_ext nbhw stay free of transformers
        from transformers.utils.import_utils import BITSANDBYTES_MIN_VERSION

        raise UserError(
            "method='qlora' and 8-bit optimizers need bitsandbytes: "
            f"pip install 'bitsandbytes>={BITSANDBYTES_MIN_VERSION}'"
        )


def _together(args: TrainArgs) -> None:
    """The checks that read two arguments at once."""
    if args.method != "full":
        require_peft()
    if args.method == "qlora" or "bnb" in args.optimizer:
        require_bitsandbytes()
    if args.method == "qlora" and args.dtype == "float32":
        raise UserError("method='qlora' computes in bfloat16 or float16 (bnb_4bit_compute_dtype); got dtype='float32'")
    if args.strategy == "single" and args.world_size > 1:
        raise UserError(f"strategy='single' runs on one device; for {args.world_size} devices pick one of "
                        f"{', '.join(s for s in STRATEGIES if s not in ('auto', 'single'))}")  # fmt: skip
    if args.offload and args.strategy not in ("fsdp2", "zero2", "zero3", "auto"):
        raise UserError(f"offload applies to fsdp2, zero2 and zero3, not strategy={args.strategy!r}")
    if args.strategy == "tp" and args.nodes > 1:
        raise UserError("tensor parallelism (tp_plan='auto') runs within one node; use fsdp2 or zero3 across nodes")


TRAINED_ON = ("cuda",)  # the torch devices a catalog target may have to be trained on (NVIDIA and AMD GPUs)


def _on_target(args: TrainArgs) -> TrainArgs:
    """A catalog target sets the device type, the memory and the number of devices: not given beside it."""
    target = target_of(args.target)
    if target is None:
        return args
    given = [f"{name}={getattr(args, name)!r}" for name in ("device_memory", "device_type")
             if getattr(args, name) not in (None, "auto")]  # fmt: skip
    if args.devices not in (1, target.count):
        given.append(f"devices={args.devices}")
    if given:
        raise UserError(f"target={target.text!r} sets the devices and their memory; drop {', '.join(given)} (or "
                        "drop the target and give device_memory / devices)")  # fmt: skip
    if target.accelerator.device not in TRAINED_ON:
        raise UserError(f"training plans are for {', '.join(TRAINED_ON)} devices and the CPU; {target.text} is a "
                        f"{target.accelerator.device} device")  # fmt: skip
    return dataclasses.replace(args, devices=target.count)


def train_args(**values: Any) -> TrainArgs:
    """Check every argument; the first mistake raises a one-line UserError naming the valid values."""
    found: TrainArgs = _on_target(checked(TrainArgs, values))
    _together(found)
    return found
