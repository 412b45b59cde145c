"""The arguments of ``nbhw.attention()`` / ``%hw attention``, declared once (see nbhw.core.argument)."""

from __future__ import annotations

from dataclasses import dataclass

from nbhw.core.argument import argument, arguments
from nbhw.core.dtypes import DTYPE, check_dtype
from nbhw.core.errors import UserError
from nbhw.core.hardware.targets import TARGET, Target
from nbhw.core.hf.meta_build import is_hub_kernel


def check_kernel(kernel: str | None) -> str | None:
    """A user's Hub kernel id, checked with transformers' own pattern."""
    if kernel is None:
        return None
    value = kernel.strip()
    if not is_hub_kernel(value):
        raise UserError(f"--kernel {kernel!r} is not a Hub kernel id; valid: ORG/REPO, ORG/REPO@REV, ORG/REPO[:FUNC]")
    return value


def check_advice_dtype(value: str | None) -> str | None:
    """None (advise one) or a dtype of the one vocabulary."""
    return None if value is None else check_dtype(value)


@dataclass(frozen=True)
class AdviceArgs:
    """What the advice is for: a device (here or not), a dtype (None: advise one), and a Hub kernel to check."""

    device: str | None = argument(
        metavar="DEV", help="device to advise for, e.g. cuda:0, cpu, mps (default: the best usable)"
    )  # fmt: skip
    dtype: str | None = argument(**{**DTYPE, "check": check_advice_dtype})
    kernel: str | None = argument(
        metavar="ORG/REPO[:FUNC]", check=check_kernel, help="also check this Hub kernel as attn_implementation"
    )  # fmt: skip
    target: Target | None = argument(**TARGET)


@dataclass(frozen=True)
class QuantizationArgs:
    """What the quantization advice is for: a target (None: this machine) and a dtype (None: the advised one)."""

    target: Target | None = argument(**TARGET)
    dtype: str | None = argument(**{**DTYPE, "check": check_advice_dtype})


ADVICE_ARGUMENTS = arguments(AdviceArgs)
QUANTIZATION_ARGUMENTS = arguments(QuantizationArgs)
