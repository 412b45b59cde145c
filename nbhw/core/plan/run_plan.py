"""The run of one load plan: its context, the dry run on its placement, the reserves, and the verdict that counts it.

The stages of :mod:`nbhw.core.plan.stages` ask these functions for what generating at ``batch x context`` needs on
the placement transformers computes: :func:`dry_run` (one dry run of :mod:`nbhw.core.plan.run`, each allocation
counted on the device its module runs on), :func:`reserves` (what each backend holds outside tensors),
:func:`with_run` (the placement's devices with weights / cache / activations / reserve against their budgets and a
verdict), :func:`context_fit` / :func:`batch_fit` (the largest context and batch that fit) and :func:`load_peak`
(the host while the checkpoint is read). Every function takes the stages it reads: the inputs, the build, the
placement, the run.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbhw.core import render
from nbhw.core.errors import UserError
from nbhw.core.hardware.data import DeviceInfo
from nbhw.core.hardware.presence import device_type
from nbhw.core.hf import dryrun, model_config
from nbhw.core.plan import headroom, outside_tensors, run, run_figures, run_parts, run_search
from nbhw.core.plan.arguments import DEFAULT_CONTEXT, DISK
from nbhw.core.plan.outside_tensors import LoadPeak, Reserve
from nbhw.core.plan.placement import DeviceShare, Placement, budget_key, device_name, is_accelerator
from nbhw.core.plan.run_figures import RunEstimate
from nbhw.core.plan.run_search import Fit

if TYPE_CHECKING:
    from collections.abc import Callable

    from nbhw.core.plan.arguments import PlanArgs
    from nbhw.core.plan.estimate import Estimate
    from nbhw.core.plan.placement import LiveMemory
    from nbhw.core.plan.stages import Built, Inputs, Placed, Ran

BATCH_LIMIT = 4096


def default_context(limit: int | None) -> int:
    """4,096 tokens, or the model's maximum when it is smaller."""
    return min(DEFAULT_CONTEXT, limit) if limit else DEFAULT_CONTEXT


def check_sizes(made: Inputs, built: Callable[[], Built]) -> None:
    """The checks of context and encoder_length that need the model's config (``built()``: the build, made only
    for an encoder's fixed length); a one-line UserError each."""
    if not made.config.available:
        return
    config = made.config.config
    context = made.args.context
    limit = run_search.context_limit(config)
    if context is not None and context > limit:
        field = run_search.context_limit_name(config) or "its config"
        raise UserError(
            f"context {context:,} is more than {made.model} takes: at most {limit:,} tokens ({field}); "
            f"valid: 2 to {limit:,}"
        )
    length = made.args.encoder_length
    if length is None:
        return
    if not getattr(config, "is_encoder_decoder", False):
        raise UserError(
            f"encoder_length is for encoder-decoder models (T5, Whisper); {made.model} is decoder-only: "
            "its context is --context"
        )
    model = built().model
    fixed = run_parts.fixed_encoder_length(model) if model is not None else None
    if fixed is not None and length != fixed:
        raise UserError(f"encoder_length {length:,}: this encoder takes exactly {fixed:,} positions; valid: {fixed:,}")


# ---------------------------------------------------------------- where the run runs


def backend_of(label: Hashable, made: Inputs, live: LiveMemory) -> str:
    """The backend a device_map value means here: cuda, rocm, mps, xpu, cpu, disk (a bare index with no
    accelerator here: cuda, the accelerator plans for other hardware usually mean)."""
    if label in ("cpu", DISK, "meta"):
        return str(label)
    kind = device_type(label if isinstance(label, int | str) else str(label), live.accelerator)
    if kind in (None, "cuda"):
        rocm = any(row.key == "rocm" and row.usable for row in made.rows)
        return "rocm" if rocm else "cuda"
    return str(kind)


def run_target(placement: Placement | None, made: Inputs, live: LiveMemory) -> str:
    """Whose attention kernels size the run: the CPU's (torch asked) or CUDA's rules for every accelerator."""
    main = dryrun.execution_device(placement.device_map) if placement and placement.device_map else "cpu"
    return "cpu" if backend_of(main, made, live) == "cpu" else "cuda"


def _device_info(label: Hashable, made: Inputs, live: LiveMemory) -> DeviceInfo | None:
    if not isinstance(label, int):
        return None
    for row in made.rows:
        if row.usable and row.device == live.accelerator:
            return next((d for d in row.devices if d.index == label), None)
    return None


def _capability(info: DeviceInfo | None) -> tuple[int, int] | None:
    text = getattr(info, "compute_capability", None)
    if not text or "." not in str(text):
        return None
    major, _, minor = str(text).partition(".")
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None


def _cuda_context_exists() -> bool:
    torch = sys.modules.get("torch")  # never imported here for this: it is a question about this process
    return bool(torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized())


def reserve(label: Hashable, made: Inputs, live: LiveMemory) -> Reserve | None:
    """What the framework holds on one device outside tensors; None for disk (nothing runs there)."""
    backend = backend_of(label, made, live)
    # Free memory read now counts what this process already holds; a catalog target's memory is the whole device's.
    live_budget = made.args.max_memory is None and made.target is None
    override = made.args.reserve_bytes
    if backend in (DISK, "meta"):
        return None
    if backend == "cpu":
        if live_budget:
            return Reserve("cpu", 0, "already in use: this process's imports count in the free memory read now", "")
        return outside_tensors.framework_reserve("cpu", override=override)
    if override is None and live_budget and backend in ("cuda", "rocm") and _cuda_context_exists():
        return Reserve(backend, 0, "this process's CUDA context exists: the free memory read now counts it", "")
    info = _device_info(label, made, live)
    total = getattr(info, "total_memory", None)
    return outside_tensors.framework_reserve(
        backend, capability=_capability(info), total_memory=total, override=override
    )


def reserves(made: Inputs, placed: Placed, labels: list[Hashable]) -> dict[Hashable, Reserve]:
    """The reserve of every device the run uses."""
    found = {label: reserve(label, made, placed.live) for label in labels}
    return {k: v for k, v in found.items() if v is not None}


# ---------------------------------------------------------------- the dry run


@dataclass(frozen=True)
class Outcome:
    """The plan's dry run, or why there is none."""

    run: RunEstimate | None
    problem: str | None = None


def generation(args: PlanArgs) -> dict[str, Any] | None:
    """The generate() options a plan's dry runs pass (the cache it asks for)."""
    impl = args.cache_implementation
    return None if impl is None else {"cache_implementation": impl}


def dry_run(made: Inputs, built: Built, placed: Placed) -> Outcome:
    """generate()'s prefill and one decode step at the plan's batch and context, on its placement (meta device)."""
    model, placement = built.model, placed.placement
    if model is None:
        return Outcome(None, "no meta model to run (the config is not available or transformers refused it)")
    if placement is None or not placement.device_map:
        return Outcome(None, "no placement to run on (transformers could not place the model)")
    try:
        found = run.run_estimate(
            model, batch=made.batch, context=made.context, encoder_tokens=made.args.encoder_length,
            target=placed.run_target, device_map=dict(placement.device_map), generation=made.generation,
            padding=made.args.padding,
        )  # fmt: skip
    except run_figures.DryRunError as exc:
        return Outcome(None, str(exc))
    return Outcome(found)


def run_budget(args: PlanArgs, live: LiveMemory, share: DeviceShare) -> int | None:
    """What the run may use on a device: the plan's ``budget`` for it (the device's memory, when max_memory lets
    the weights fill less of it), else the budget the weights were placed against."""
    return (args.budget_bytes or {}).get(budget_key(share.key, live.accelerator), share.budget)


def _share_of(placement: Placement, label: Hashable, args: PlanArgs, live: LiveMemory) -> DeviceShare:
    """The placement's share of a device the run uses, against the device's budget for the run."""
    found = next((share for share in placement.devices if share.key == label), None)
    if found is None:
        budget = (placement.budget or {}).get(budget_key(label, live.accelerator))  # type: ignore[arg-type]
        key = label if isinstance(label, int | str) else str(label)
        found = DeviceShare(device_name(key, live.accelerator), key, 0, 0, budget)
    return replace(found, budget=run_budget(args, live, found))


def limits(
    made: Inputs, placed: Placed, placement: Placement, outcome: RunEstimate, held: Mapping[int | str, Reserve]
) -> dict[Hashable, int]:
    """Per device, the bytes the dry run's tensors may reach: its budget less its reserve and less what the placed
    weights take beyond the dry run's (quantized weights are placed at their quantized size)."""
    found: dict[Hashable, int] = {}
    for label, measured in outcome.devices.items():
        share = _share_of(placement, label, made.args, placed.live)
        if share.budget is None or label == DISK:
            continue
        reserved = held.get(share.key)
        found[label] = share.budget - (reserved.bytes if reserved else 0) - (share.bytes - measured.weight_bytes)
    return found


def with_run(
    made: Inputs,
    placed: Placed,
    outcome: Outcome,
    held: Mapping[int | str, Reserve],
    context_fit: Callable[[], Fit | None],
) -> Placement | None:
    """The weight placement with each device's run figures and the verdict that counts the run (``context_fit``:
    asked only when the run doesn't fit)."""
    placement = placed.placement
    if placement is None or placement.kind in ("none", "too_big"):
        return placement
    if outcome.run is None:
        why = f": {outcome.problem}" if outcome.problem else " (see the estimate)"
        verdict = f"weights only: {_where(placement)}; the run is not covered{why}"
        return replace(placement, verdict=verdict, run_kind="not_covered")
    shares = run_shares(made, placed, placement, outcome.run, held)
    over = [s for s in shares if s.over_bytes is not None and s.over_bytes > 0]
    text, kind = _run_verdict(made, placement, over, tight_shares(shares), context_fit)
    return replace(placement, devices=shares, verdict=text, run_kind=kind)


def run_shares(
    made: Inputs, placed: Placed, placement: Placement, outcome: RunEstimate, held: Mapping[int | str, Reserve]
) -> list[DeviceShare]:
    """The placement's devices with the dry run's figures filled in, in the placement's order."""
    args, live = made.args, placed.live
    shares = [
        _filled(_share_of(placement, label, args, live), m, made, live, held) for label, m in outcome.devices.items()
    ]
    shares += [replace(s, budget=run_budget(args, live, s)) for s in placement.devices if s.key not in outcome.devices]
    order = {s.key: i for i, s in enumerate(placement.devices)}
    shares.sort(key=lambda s: order.get(s.key, -1))
    return shares


def tight_shares(shares: list[DeviceShare]) -> list[DeviceShare]:
    """The devices the run fits by its tensors but with less room left than their allocator needs."""
    return [s for s in shares if headroom.is_tight(s.headroom_bytes, s.margin_bytes)]


def margin(label: Hashable, made: Inputs, live: LiveMemory, largest_block: int) -> headroom.Margin | None:
    """What the allocator of the device ``label`` needs left free beyond the run's peak; None for disk."""
    backend = backend_of(label, made, live)
    if backend in (DISK, "meta"):
        return None
    return headroom.allocator_margin(backend, largest_block)


def margins_of(made: Inputs, live: LiveMemory) -> run_search.Margins:
    """Per device of a run, the bytes its allocator needs left free (the searches keep them)."""

    def margins(estimate: RunEstimate) -> dict[Hashable, int]:
        found = {
            label: margin(label, made, live, measured.largest_block_bytes)
            for label, measured in estimate.devices.items()
        }
        return {label: room.bytes for label, room in found.items() if room is not None}

    return margins


def margin_notes(made: Inputs, live: LiveMemory, outcome: RunEstimate | None, placement: Placement | None) -> list[str]:
    """Per device with a caching allocator, the room it needs left free beyond the run's peak and why."""
    if outcome is None or placement is None:
        return []
    out = []
    for share in placement.devices:
        measured = outcome.devices.get(share.key)
        room = margin(share.key, made, live, measured.largest_block_bytes) if measured is not None else None
        if room is not None and room.bytes:
            out.append(f"allocator margin on {share.device}: {room.why}")
    return out


def _filled(
    share: DeviceShare,
    measured: run_figures.DeviceRun,
    made: Inputs,
    live: LiveMemory,
    reserves: Mapping[int | str, Reserve],
) -> DeviceShare:
    held = reserves.get(share.key)
    weights = share.bytes  # as placed: the quantizer's size where there is one
    room = margin(share.key, made, live, measured.largest_block_bytes)
    return replace(
        share,
        cache_bytes=measured.held_cache_bytes,
        activation_bytes=measured.activation_bytes,
        peak_bytes=measured.peak_bytes - measured.weight_bytes + weights,
        reserve_bytes=held.bytes if held else 0,
        margin_bytes=room.bytes if room is not None else None,
    )


def _where(placement: Placement) -> str:
    """The weights-only words of the verdict ('fits on one device (cpu)', 'split across 2 devices (...)')."""
    return placement.verdict


def _short(over: list[DeviceShare]) -> str:
    return " and ".join(f"{render.size(s.over_bytes)} more on {s.device}" for s in over)


def _tight_words(tight: list[DeviceShare]) -> str:
    return " and ".join(
        f"{render.size(s.headroom_bytes or 0)} left on {s.device}, its allocator needs {render.size(s.margin_bytes)}"
        for s in tight
    )


def _run_verdict(
    made: Inputs,
    placement: Placement,
    over: list[DeviceShare],
    tight: list[DeviceShare],
    context_fit: Callable[[], Fit | None],
) -> tuple[str, str]:
    where, tokens = _where(placement), f"{made.context:,} tokens"
    at = f" at batch {made.batch}" if made.batch > 1 else ""
    if not over and tight:
        if placement.kind == "one_device":
            device = placement.verdict.removeprefix("fits on one device ")
            return f"tight on one device {device} at {tokens}{at}: {_tight_words(tight)}", "tight"
        return f"{where}: tight at {tokens}{at} ({_tight_words(tight)})", "tight"
    if not over:
        if placement.kind == "one_device":
            return where, "fits"
        return f"{where}: fits at {tokens}{at}", "fits"
    fit = context_fit()
    shorter = fit.value if fit is not None and 2 <= fit.value < made.context else None
    if placement.kind == "one_device":
        device = placement.verdict.removeprefix("fits on one device ")
        if shorter is not None:
            return f"fits on one device {device} up to {shorter:,} tokens{at}, not {tokens}", "fits_shorter"
        return f"does not fit on one device {device} at {tokens}{at} (needs {_short(over)})", "does_not_fit"
    if shorter is not None:
        return f"{where}: fits up to {shorter:,} tokens{at}, not {tokens}", "fits_shorter"
    return f"{where}: does not fit at {tokens}{at} (needs {_short(over)})", "does_not_fit"


# ---------------------------------------------------------------- searches


def weights_alone_over(made: Inputs, placed: Placed, placement: Placement, *, least_margin: bool) -> bool:
    """Whether some device the run uses can't hold its placed weights and its reserve (``least_margin``: and the
    least its allocator needs left free, a run's smallest margin): a run's peak holds its weights, so no dry run can
    fit it (read from the placement: no dry run)."""
    running = set(placement.device_map.values())
    for share in placement.devices:
        budget = run_budget(made.args, placed.live, share)
        if budget is None or share.key == DISK or share.key not in running:
            continue
        held = reserve(share.key, made, placed.live)
        room = margin(share.key, made, placed.live, 0) if least_margin else None
        if share.bytes + (held.bytes if held else 0) + (room.bytes if room else 0) > budget:
            return True
    return False


WEIGHTS_ALONE = "the weights, the reserve and the allocator's least margin alone are over a budget"


def context_fit(made: Inputs, built: Built, placed: Placed, ran: Callable[[], Ran]) -> Fit | None:
    """The largest context (prompt + generated) that fits every device at the plan's batch; None without a run
    (``ran()``: the run stage, made only when the weights alone don't answer)."""
    placement = placed.placement
    if placement is not None and weights_alone_over(made, placed, placement, least_margin=True):
        return Fit(0, made.context_limit or run_search.NO_LIMIT, 0, WEIGHTS_ALONE)
    outcome = ran().outcome.run
    if outcome is None or placement is None:
        return None
    found = limits(made, placed, placement, outcome, ran().reserves)
    try:
        return run_search.max_context(
            built.model, found, batch=made.batch, target=placed.run_target, start=made.context,
            device_map=dict(placement.device_map), encoder_tokens=made.args.encoder_length,
            generation=made.generation, margins=margins_of(made, placed.live), padding=made.args.padding,
        )  # fmt: skip
    except run_figures.DryRunError:
        return None  # a loop over tokens at a longer context: the plan's own context is what is covered


def batch_fit(made: Inputs, built: Built, placed: Placed, ran: Callable[[], Ran]) -> Fit | None:
    """The most sequences of the plan's context that fit every device together; None without a run."""
    placement = placed.placement
    if placement is not None and weights_alone_over(made, placed, placement, least_margin=True):
        return Fit(0, BATCH_LIMIT, 0, WEIGHTS_ALONE)
    outcome = ran().outcome.run
    if outcome is None or placement is None:
        return None
    found = limits(made, placed, placement, outcome, ran().reserves)
    try:
        return run_search.max_batch(
            built.model, found, context=made.context, target=placed.run_target,
            device_map=dict(placement.device_map), encoder_tokens=made.args.encoder_length,
            limit=BATCH_LIMIT, generation=made.generation, margins=margins_of(made, placed.live),
            padding=made.args.padding,
        )  # fmt: skip
    except run_figures.DryRunError:
        return None


# ---------------------------------------------------------------- the host while loading


def checkpoint_bytes(made: Inputs, weights: Estimate) -> tuple[int, str]:
    """The checkpoint's size: its safetensors files when they are here, else parameters x the checkpoint's dtype."""
    files = _weight_files(made.model, made.config.source)
    if files:
        return sum(f.stat().st_size for f in files), "the checkpoint's files"
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    size = getattr(torch, made.checkpoint_dtype).itemsize
    return weights.parameters * size, f"parameters x {size} B ({made.checkpoint_dtype})"


def _weight_files(model: str, source: str | None) -> list[Path]:
    if source == model_config.LOCAL:
        return sorted(Path(model).expanduser().glob("*.safetensors"))
    return []


def load_peak(made: Inputs, weights: Estimate | None, placed: Placed) -> LoadPeak | None:
    """The host's peak while from_pretrained reads the checkpoint, by transformers' loading path."""
    placement = placed.placement
    if placement is None or weights is None:
        return None
    on_cpu = sum(s.bytes for s in placement.devices if s.key == "cpu")
    stored, _ = checkpoint_bytes(made, weights)
    return outside_tensors.host_load_peak(on_cpu, stored, cast=made.dtype != made.checkpoint_dtype)


def accelerators(placement: Placement) -> list[DeviceShare]:
    """The devices of a placement that run layers (not cpu or disk)."""
    return [s for s in placement.devices if is_accelerator(s.key)]
