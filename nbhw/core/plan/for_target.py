"""A plan for hardware that is not here: what ``target=`` changes in a plan's dry run and notes.

The budget needs nothing here: a target gives the backend rows detection would give on it
(:meth:`nbhw.core.hardware.targets.Target.rows`), so the plan's placement reads the target's memory per device
exactly as it reads this machine's free memory (the run planner subtracts its framework reserve from those
budgets). What this module adds are the checks a build on this machine can't answer for the target: the
attention implementation (transformers' rules for the target's device and capability, from the attention advice),
the quantization (transformers' checks as if on the target), and a device_map strategy that leaves the target's
devices unused.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from nbhw.core.advice.attention import row_for
from nbhw.core.advice.attention_rules import FLASH_KEY
from nbhw.core.advice.quantization import plan_check
from nbhw.core.advice.status import Status
from nbhw.core.hardware.targets import Target
from nbhw.core.hf import meta_build
from nbhw.core.plan.placement import Placement
from nbhw.core.render import size


def device_dependent(attn: str | None) -> bool:
    """Whether a build here can't answer for ``attn`` on a target (flash attention, a Hub kernel)."""
    if attn is None:
        return False
    key = attn.removeprefix("paged|")
    return bool(FLASH_KEY.match(key)) or meta_build.is_hub_kernel(key)


def attention_problems(model: str, attn: str | None, dtype: str, target: Target, offline: bool) -> list[str]:
    """attn_implementation on the target: the attention advice's row for it, when it says it won't work."""
    return advised_problems(model, attn, dtype, offline, target.accelerator.name, target=target)


def attention_problems_here(model: str, attn: str | None, dtype: str, devices: list[str], offline: bool) -> list[str]:
    """attn_implementation on devices of this machine that a build can't answer for (a Hub kernel download): the
    attention advice's row for each device, so ``plan.check()`` and ``nbhw.attention()`` give one answer."""
    return [p for device in devices for p in advised_problems(model, attn, dtype, offline, device, device=device)]


# Within rows_kept() (one fit search), the answers by their arguments: every option of a search asks the same few.
_KEPT: contextvars.ContextVar[dict[tuple[Any, ...], list[str]] | None] = contextvars.ContextVar(
    "nbhw_attention_rows", default=None
)


@contextlib.contextmanager
def rows_kept() -> Iterator[None]:
    """Within the block, each attention answer is worked out once (the hardware doesn't change under a search)."""
    token = _KEPT.set({})
    try:
        yield
    finally:
        _KEPT.reset(token)


def advised_problems(
    model: str, attn: str | None, dtype: str, offline: bool, where: str, **hardware: str | Target
) -> list[str]:
    """The attention advice's row for ``attn`` (on ``target=`` or ``device=``), as a problem when it won't work."""
    if not device_dependent(attn):
        return []
    assert attn is not None
    kept = _KEPT.get()
    if kept is None:
        return _advised(model, attn, dtype=dtype, offline=offline, where=where, hardware=hardware)
    key = (model, attn, dtype, offline, where, tuple(sorted(hardware.items())))
    if key not in kept:
        kept[key] = _advised(model, attn, dtype=dtype, offline=offline, where=where, hardware=hardware)
    return list(kept[key])


def _advised(
    model: str, attn: str, *, dtype: str, offline: bool, where: str, hardware: dict[str, str | Target]
) -> list[str]:
    kernel = attn if meta_build.is_hub_kernel(attn) else None
    row = row_for(attn, model, dtype=dtype, kernel=kernel, offline=offline, **hardware)
    # "depends on the device": nbhw can't see the device it depends on, so the plan can't say it will load.
    if row.status in {Status.WONT, Status.DEPENDS}:
        fix = f" (fix: {row.fix})" if row.fix else ""
        return [f"attn_implementation={attn!r} on the {where}: {row.reason}{fix}"]
    return []


def quantization_findings(
    word: str | None, config: Any, device_map: Any, dtype: str, target: Target
) -> tuple[list[str], list[str]]:
    """(problems, notes) of the quantization asked for, or of a pre-quantized checkpoint, as if on the target."""
    prequantized = getattr(config, "quantization_config", None) is not None
    if word is None and not prequantized:
        return [], []
    return plan_check(word, config, device_map, dtype, target)


def unused_devices(used: list[Any], target: Target, strategy: str | None) -> list[str]:
    """A strategy that places nothing on the target's devices (accelerate's get_max_memory has no tpu / neuron)."""
    kind = target.accelerator.device
    on_target = [v for v in used if isinstance(v, int) or re.match(rf"{kind}(:\d+)?$", str(v))]
    if strategy is None or on_target:
        return []
    return [
        f"device_map={strategy!r} leaves the {target.accelerator.name} unused: accelerate's get_max_memory doesn't "
        f"budget {kind} devices, so every layer goes to {', '.join(map(str, dict.fromkeys(used)))}; pass "
        f"device_map={target.device_name(0)!r} (or a dict naming {kind} devices)"
    ]


def unlisted_budgets(placement: Placement, target: Target) -> Placement:
    """The target's devices a device_map names but accelerate doesn't budget (tpu:0, neuron:0) get their catalog
    memory as their budget too, so what goes there is checked against it as on any other device."""
    a = target.accelerator
    mine = re.compile(rf"{re.escape(a.device)}(:\d+)?$")
    unlisted = {id(s) for s in placement.devices if s.budget is None and mine.match(str(s.key))}
    if not unlisted:
        return placement
    shares = [replace(s, budget=a.memory_bytes) if id(s) in unlisted else s for s in placement.devices]
    budget = {**(placement.budget or {}), **{s.key: a.memory_bytes for s in shares if s.budget == a.memory_bytes}}
    over = [
        f"{s.device} needs {size(s.bytes)} for the weights, {size(a.memory_bytes)} on the {a.name}"
        for s, old in zip(shares, placement.devices, strict=True)
        if id(old) in unlisted and s.bytes > a.memory_bytes
    ]
    if not over:
        return replace(placement, budget=budget, devices=shares)
    problems = [*placement.problems, *(f"{o}: loading would run out of memory" for o in over)]
    return replace(
        placement, budget=budget, devices=shares, verdict=f"does not fit: {'; '.join(over)}", kind="too_big",
        problems=problems,
    )  # fmt: skip


def notes(target: Target, dtype: str) -> list[str]:
    """What a reader of a plan for a target should know first."""
    a = target.accelerator
    per = f"{a.memory_bytes / 1024**3:g} GiB"
    unified = f" (of {a.memory_gib:g} GiB unified memory: Metal's working set)" if a.unified_memory else ""
    out = [
        target.not_here,
        f"budget: {per} per {a.device} device from the catalog{unified}; the CPU gets "
        f"{target.host_memory / 1024**3:.0f} GiB (assumed: the catalog has no host memory)",
    ]
    bf16 = a.dtypes["bf16"]
    if dtype == "bfloat16" and not bf16:
        out.append(f"the {a.name} has no native bfloat16 ({a.compute_capability or a.arch}): load in float16 there")
    if dtype == "float16" and a.backend == "tpu":
        out.append(f"the {a.name} computes in bfloat16; float16 is not native on TPUs")
    return out
