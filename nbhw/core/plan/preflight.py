"""The pre-flight findings a plan's cell would hit (nbhw.doctor()), as warnings in the plan's notes.

A finding names the from_pretrained options that hit it (a device, ``attn_implementation``, the quantization
method, ``use_kernels``, a Hub kernel); a plan collects its own options and asks for those findings only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbhw.core.hardware import doctor
from nbhw.core.hardware.findings import Finding
from nbhw.core.plan.arguments import QUANTIZATION

if TYPE_CHECKING:
    from nbhw.core.plan.load_plan import LoadPlan

HUB_KERNEL_ORG_SEPARATOR = "/"


def _quantization(plan: LoadPlan) -> str | None:
    """transformers' quantization method the cell would use: the one asked for, or a pre-quantized checkpoint's."""
    asked = plan.args.quantization
    if asked in QUANTIZATION:
        return f"bitsandbytes_{asked}"  # the key transformers' AUTO_QUANTIZER_MAPPING gives BitsAndBytesConfig
    if asked is not None:
        return str(asked)
    config = getattr(plan.config, "config", None) if plan.config.available else None
    method: Any = getattr(config, "quantization_config", None)
    if isinstance(method, dict) and method.get("quant_method") == "bitsandbytes":
        return "bitsandbytes_8bit" if method.get("load_in_8bit") else "bitsandbytes_4bit"
    return None


def _devices(plan: LoadPlan) -> list[str]:
    placement = plan.weight_placement if plan.config.available else None  # the devices only: no dry run
    found = [share.device for share in placement.devices] if placement is not None else []
    device_map = plan.args.device_map
    if isinstance(device_map, str) and ":" in device_map:
        found.append(device_map)
    return found


def findings(plan: LoadPlan) -> list[Finding]:
    """The findings this plan's cell would hit on this machine (a LoadPlan; read through its public fields)."""
    attn = plan.args.attn_implementation
    kernels = [attn] if attn and HUB_KERNEL_ORG_SEPARATOR in attn else []
    return doctor.recent().for_plan(
        devices=_devices(plan),
        attn_implementation=attn,
        quantization=_quantization(plan),
        use_kernels=bool(plan.use_kernels),
        kernels=kernels,
    )


def warnings(plan: LoadPlan) -> list[str]:
    """One note per finding the cell would hit: what fails, when, and the command that fixes it."""
    return [f.line() for f in findings(plan)]
