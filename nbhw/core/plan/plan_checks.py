"""What transformers would refuse of a load plan, one line each: ``LoadPlan.check()``.

Each check asks the installed libraries (transformers' quantizer and device-map checks, its flash-attention
compatibility matrix, kernelize, the attention advice) about the plan's public parts: its arguments, config, build,
placement and target. :func:`checked` runs them in the order a load meets them and is computed once per plan
(``LoadPlan.checked``).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nbhw.core.advice import quantization
from nbhw.core.advice.quantization_gates import fix_for
from nbhw.core.advice.quantization_methods import build_config, method_key
from nbhw.core.hardware import presence
from nbhw.core.hf import kernel_tables, meta_build
from nbhw.core.plan import for_target
from nbhw.core.plan.arguments import DISK, NO_DEVICE_MAP, strategy_names
from nbhw.core.plan.placement import Placement

if TYPE_CHECKING:
    from nbhw.core.plan.load_plan import LoadPlan


@dataclass(frozen=True)
class Checked:
    """A plan's problems, and whether the check stopped at the quantization asked for (refused here or on the
    target, before any placement was made)."""

    problems: tuple[str, ...]
    quantization_refused: bool = False


def with_fix(problem: str) -> str:
    """A quantization refusal with the fix nbhw.quantization() gives for it, unless the message already says it."""
    fix = fix_for(problem)
    return problem if fix in problem else f"{problem} (fix: {fix})"


def checked(plan: LoadPlan) -> Checked:
    """Every check of ``plan``, in the order a load meets them."""
    if not plan.config.available:
        return Checked((plan.config.problem or f"config of {plan.model!r} not available",))
    problems = kernel_problems(plan)
    build = plan.built.build
    if build is not None and not build.ok:
        problems.append(f"transformers refuses the model build: {build.error_type}: {build.error}")
    problems += quantization_problems(plan) if plan.target is None else target_problems(plan)
    if plan.args.quantization is not None and any(p.startswith("quantization") for p in problems):
        return Checked(tuple(problems), True)  # the method can't run there: where its layers go is moot
    placement = plan.weight_placement
    if placement is not None:
        problems += placement_problems(plan, placement)
    return Checked(tuple(problems))


def placement_problems(plan: LoadPlan, placement: Placement) -> list[str]:
    """What the placement meets: its own problems, the quantizer's, absent devices, offline kernels, flash."""
    build = plan.built.build
    problems = list(placement.problems)
    problems += [with_fix(e) for e in plan.quantizer.errors] if plan.quantizer is not None else []
    problems += device_problems(plan, placement)
    problems += offline_kernel_problems(plan, placement) if plan.target is None else []
    if build is not None and build.ok:
        problems += flash_problems(plan, placement)
    elif build is None and plan.built.attn_download and plan.target is None:
        problems += advised_attention(plan, placement)
    if plan.target is not None:
        used = list(placement.device_map.values())
        problems += for_target.unused_devices(used, plan.target, placement.strategy)
    return problems


def target_problems(plan: LoadPlan) -> list[str]:
    """What a build here can't answer for the target: its attention rules and its quantization checks."""
    assert plan.target is not None
    found = for_target.attention_problems(
        plan.model, plan.args.attn_implementation, plan.dtype, plan.target, plan.offline
    )
    found_quantization, _ = plan.target_quantization
    return found + found_quantization


def target_quantization(plan: LoadPlan) -> tuple[list[str], list[str]]:
    """(problems, notes) of the quantization, as if on the target (for_target's rules)."""
    assert plan.target is not None
    return for_target.quantization_findings(
        plan.args.quantization, plan.config.config, plan.args.device_map, plan.dtype, plan.target
    )


def kernel_problems(plan: LoadPlan) -> list[str]:
    """use_kernels=True's problems here (yours or the default): kernels unusable, or kernelize refusing."""
    if not plan.use_kernels:
        return []
    ok, why = meta_build.kernels_status()
    given = "" if plan.args.use_kernels else f" (transformers' default: {plan.kernels_default.why})"
    if not ok:
        return [f"use_kernels=True{given}: {why}"]
    refused = [kernel_tables.kernelize_refuses(kind) for kind in named_device_types(plan)]
    return [f"use_kernels=True{given}: kernelize fails: {r}" for r in dict.fromkeys(refused) if r]


def named_device_types(plan: LoadPlan) -> list[str]:
    """The device types the device_map names itself ("cpu", "meta"; a strategy names none)."""
    device_map = plan.args.device_map
    named = list(device_map.values()) if isinstance(device_map, dict) else [device_map]
    skip = (*strategy_names(), NO_DEVICE_MAP, DISK)
    kinds = [presence.device_type(v, plan.placed.live.accelerator) for v in named if v is not None and v not in skip]
    return [k for k in dict.fromkeys(kinds) if k]


def quantization_problems(plan: LoadPlan) -> list[str]:
    """transformers' quantizer checks: the one asked for, or the one a pre-quantized checkpoint names."""
    prequantized = getattr(plan.config.config, "quantization_config", None) is not None
    if plan.args.quantization is None and not prequantized:
        return []
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.integrations.accelerate import check_and_set_device_map

    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.quantizers.auto import get_hf_quantizer

    asked = None
    if plan.args.quantization is not None:
        asked, problem = build_config(method_key(plan.args.quantization), plan.dtype)
        if asked is None:
            return [with_fix(f"quantization={plan.args.quantization}: the config can't be built here: {problem}")]
    try:
        with meta_build.quiet():
            device_map = check_and_set_device_map(copy.deepcopy(plan.args.device_map))
            get_hf_quantizer(copy.deepcopy(plan.config.config), asked, device_map, True, {})
    except Exception as exc:
        what = f"quantization={plan.args.quantization}" if asked is not None else "this pre-quantized checkpoint"
        return [with_fix(f"{what}: {type(exc).__name__}: {' '.join(str(exc).split())}")]
    if plan.args.quantization is None:
        return []
    with meta_build.quiet():  # the method's gate, as nbhw.quantization() reads it (past transformers' quirks)
        return quantization.here_check(plan.args.quantization, plan.dtype, plan.args.device_map, plan.rows)


def device_problems(plan: LoadPlan, placement: Placement) -> list[str]:
    """The devices of the placement that are not on this machine."""
    return presence.absent(list(placement.device_map.values()), plan.rows, plan.placed.live.accelerator)


def offline_kernel_problems(plan: LoadPlan, placement: Placement) -> list[str]:
    """Hub kernels the load would fetch while the Hub is offline here and that are not in the local cache:
    from_pretrained stops at kernelize (kernels raises), so the cell fails."""
    if not plan.use_kernels or kernel_problems(plan) or not kernel_tables.hub_offline():
        return []
    cls = meta_build.model_class(plan.config.config, plan.inputs.auto_class)
    given = "" if plan.args.use_kernels else " (transformers' default)"
    out = []
    accelerator = plan.placed.live.accelerator
    for kind in dict.fromkeys(presence.device_type(v, accelerator) for v in placement.device_map.values()):
        missing = kernel_tables.uncached_kernel_repos(cls, kind) if kind else []
        if missing is None:
            out.append(f"use_kernels=True{given} on {kind} with the Hub offline (HF_HUB_OFFLINE): whether its "
                       "kernels are in the local cache is unknown (no kernels cache reader here)")  # fmt: skip
        elif missing:
            out.append(f"use_kernels=True{given} fetches {', '.join(missing)} on {kind}, the Hub is offline here "
                       "(HF_HUB_OFFLINE) and the local cache has no version of it: from_pretrained fails; pass "
                       "use_kernels=False (--no-kernels), or download the kernels while online")  # fmt: skip
    return out


def advised_attention(plan: LoadPlan, placement: Placement) -> list[str]:
    """A Hub-kernel attention a build can't check here: the attention advice's answer for each device used."""
    accelerator = plan.placed.live.accelerator or "cuda"
    devices = [f"{accelerator}:{v}" if isinstance(v, int) else str(v) for v in placement.device_map.values()]
    used = [d for d in dict.fromkeys(devices) if d not in (DISK, "meta")]  # "meta" runs nothing
    return for_target.attention_problems_here(plan.model, plan.args.attn_implementation, plan.dtype, used, plan.offline)


def flash_problems(plan: LoadPlan, placement: Placement) -> list[str]:
    """flash_attention_N on a device its installed package does not support (transformers' compatibility matrix)."""
    impl = (plan.args.attn_implementation or "").removeprefix("paged|")
    m = re.fullmatch(r"flash_attention_(\d)", impl)
    if m is None or not meta_build.flash_package_installed(int(m.group(1))):
        return []
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.modeling_flash_attention_utils import FLASH_ATTENTION_COMPATIBILITY_MATRIX

    entry = FLASH_ATTENTION_COMPATIBILITY_MATRIX.get(int(m.group(1)), {})
    supported = [name for _, name in entry.get("supported_devices", ())]
    used = {presence.device_type(v, plan.placed.live.accelerator) for v in placement.device_map.values() if v != DISK}
    off = sorted(t for t in used if t is not None and t not in supported)
    if not off:
        return []
    return [f"attn_implementation={impl!r} runs on {', '.join(supported)}; this plan puts layers on {', '.join(off)}"]
