"""The run in a plan's text, HTML and dict: the estimate's rows, the placement's columns, the notes, in words.

Every function takes the plan (:class:`~nbhw.core.plan.load_plan.LoadPlan`) and reads its public properties; the
text and the HTML show the same rows.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from nbhw.core import render
from nbhw.core.plan import headroom, run_plan
from nbhw.core.plan.arguments import DEFAULT_PADDING
from nbhw.core.plan.estimate import Estimate
from nbhw.core.plan.placement import DeviceShare, Placement
from nbhw.core.plan.run_figures import PADDINGS, RunEstimate
from nbhw.core.plan.run_plan import BATCH_LIMIT

if TYPE_CHECKING:
    from nbhw.core.plan.load_plan import LoadPlan

size = render.size


def count(n: int) -> str:
    """A parameter count as model cards write it: 8.03B, 596.0M, 112.5K."""
    for unit, scale, digits in (("B", 10**9, 2), ("M", 10**6, 1), ("K", 10**3, 1)):
        if n >= scale:
            return f"{n / scale:.{digits}f}{unit}"
    return str(n)


def run_title(plan: LoadPlan, *, run: bool = True) -> str:
    """What the run is: tokens per sequence (and the encoder's), batch, and whether they are the defaults."""
    tokens = f"{plan.context:,} tokens per sequence (prompt + generated"
    tokens += ", the default: 4,096 or the model's maximum when smaller)" if plan.args.context is None else ")"
    encoder = plan.run.encoder_tokens if run and plan.run is not None else plan.args.encoder_length
    if encoder is not None:
        tokens = f"decoder {tokens}, encoder {encoder:,} tokens"
    return f"Estimate for {tokens}, batch {plan.batch}{padding_words(plan)}"


def padding_words(plan: LoadPlan) -> str:
    """How the batch's prompts come (said when there is more than one), and whether that is the default."""
    if plan.batch == 1:
        return ""
    padding = plan.args.padding
    default = ", the default" if padding == DEFAULT_PADDING else ""
    return f", prompts {PADDINGS[padding]} (padding={padding}{default})"


def _cache_row(plan: LoadPlan, e: Estimate) -> str:
    run = plan.run
    if run is None:
        return f"not covered: {e.run_problem}"
    if run.cache_class == "none":
        return "none: this model does not generate (one forward at batch x context)"
    layers = ", ".join(f"{n} {name}" for name, n in run.layer_classes.items())
    return (
        f"{size(e.cache_bytes)} right after the prefill, {size(e.cache_decode_bytes)} after the decode step that "
        f"reaches {plan.context:,} tokens ({run.cache_class}: {layers})"
    )


def _reserve_row(plan: LoadPlan) -> str:
    held = [(k, r) for k, r in plan.reserves.items()]
    if not held:
        return "none"
    total = sum(r.bytes for _, r in held)
    kinds = {(r.bytes, r.what) for _, r in held}
    if len(kinds) == 1:
        each = f", {size(held[0][1].bytes)} on each of {len(held)} devices" if len(held) > 1 else ""
        return f"{size(total)}{each}: {held[0][1].what}"
    return f"{size(total)}: " + "; ".join(f"{device_label(plan, k)} {size(r.bytes)} ({r.what})" for k, r in held)


def device_label(plan: LoadPlan, key: Hashable) -> str:
    placement = plan.weight_placement
    for share in placement.devices if placement else []:
        if share.key == key:
            return str(share.device)
    return str(key)


def _max_context_row(plan: LoadPlan) -> str:
    fit = plan.context_fit
    if fit is None:
        return "not covered (no dry run)"
    if fit.value == 0:
        return f"none: not even 2 tokens fit at batch {plan.batch}"
    top = " (the model's maximum)" if fit.value >= fit.limit else ""
    return f"{fit.value:,} tokens per sequence at batch {plan.batch} on this placement{top}"


def _max_batch_row(plan: LoadPlan) -> str:
    fit = plan.batch_fit
    if fit is None:
        return "not covered (no dry run)"
    if fit.value == 0:
        return f"none: not one sequence of {plan.context:,} tokens fits"
    more = " or more (searched up to that)" if fit.value >= BATCH_LIMIT else ""
    return f"{fit.value:,}{more} sequences of {plan.context:,} tokens together"


def _load_row(plan: LoadPlan) -> str | None:
    peak = plan.load_peak
    if peak is None:
        return None
    pages = f"{size(peak.file_bytes)} of the checkpoint's mapped pages (reclaimable page cache, counted in RSS)"
    if not peak.private_bytes:
        return f"{size(peak.rss_bytes)} resident at the peak: {pages}; no private copy"
    why = f"the weights cast to {plan.dtype}" if plan.dtype != plan.checkpoint_dtype else "the weights"
    return f"{size(peak.rss_bytes)} resident at the peak: {size(peak.private_bytes)} private ({why}) + {pages}"


PENDING = "planning… (the dry run of generate() fills this in)"
SEARCHING = "searching… (a few more dry runs)"


def estimate_rows(plan: LoadPlan, e: Estimate, *, run: bool = True, searches: bool = True) -> list[tuple[str, str]]:
    """The estimate's rows: weights, then the run, then training. ``run=False``: the weights only, the run's rows
    saying it is coming (the Load tab shows them first); ``searches=False``: max context and batch still coming."""
    quant = f", {e.quantization} weights" if e.quantization else ""
    rows = [
        ("parameters", f"{count(e.parameters)} ({count(e.non_embedding_parameters)} without the input embedding)"),
        ("weights", f"{size(e.total_bytes)} in {e.dtype}{quant}"),
        ("largest layer", f"{size(e.largest_layer_bytes)}  {', '.join(e.largest_layer[:3])}"),
    ]
    if not run:
        rows += [("KV cache", PENDING), ("peak", PENDING)]
        return [*rows, _training_row(e)]
    rows.append(("KV cache", _cache_row(plan, e)))
    if plan.run is not None:
        rows += _run_rows(plan, plan.run, e, searches)
    load = _load_row(plan)
    if load is not None:
        rows.append(("host at load", load))
    return [*rows, _training_row(e)]


def _training_row(e: Estimate) -> tuple[str, str]:
    return (
        "training",
        f"{size(e.training_total)} for weights, gradients and Adam states together "
        f"(largest single stage {size(e.training_peak)}); full fine-tuning in {e.training_precision} "
        "mixed precision, batch size 1, activations not included (accelerate's figures)",
    )


# How the dry run sized each kind of call, in words (dryrun.attention_as_on's names)
KERNEL_WORDS = {
    "cuda_flash": "SDPA's CUDA flash kernel",
    "cuda_efficient": "SDPA's CUDA memory-efficient kernel",
    "cpu_flash": "SDPA's CPU flash kernel",
    "math": "SDPA's math path (scores materialized)",
    "grouped_mm_as_fallback": "grouped_mm as transformers' fallback",
}


def _kernels(run: RunEstimate) -> str:
    calls = [f"{KERNEL_WORDS.get(k, k)} ({n:,} calls)" for k, n in run.kernels.items()]
    return ", ".join(calls) or "no SDPA call"


def _activations(run: RunEstimate, e: Estimate) -> str:
    kernels = _kernels(run)
    if run.logits_to_keep:
        return (
            f"{size(e.activation_bytes)} at the prefill's peak above weights and cache (attention sized as "
            f"{kernels}; logits of the last position only, as generate() asks)"
        )
    return f"{size(e.activation_bytes)} at the peak above weights and cache (attention sized as {kernels})"


def _run_rows(plan: LoadPlan, run: RunEstimate, e: Estimate, searches: bool) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    if e.state_bytes:
        rows.append(("state", f"{size(e.state_bytes)} of the cache: fixed recurrent / conv state"))
    if e.cross_cache_bytes:
        held = f"{size(e.cross_cache_bytes)} of the cache: keys and values of {run.encoder_tokens:,} encoder tokens"
        rows.append(("cross-attention", held))
    together = ", every device together" if len(run.devices) > 1 else ""
    return [
        *rows,
        ("activations", _activations(run, e)),
        ("peak", f"{size(e.peak_bytes)}: weights, cache and activations at the run's worst moment{together}"),
        ("reserve", _reserve_row(plan)),
        ("max context", _max_context_row(plan) if searches else SEARCHING),
        ("max batch", _max_batch_row(plan) if searches else SEARCHING),
    ]


WEIGHT_HEADERS = ("device", "layers", "weights", "budget", "device_map entries")
RUN_HEADERS = ("device", "layers", "weights", "cache", "activations", "reserve", "total", "budget", "headroom",
               "device_map entries")  # fmt: skip


def _entries(share: DeviceShare) -> str:
    more = f" … +{len(share.names) - 2}" if len(share.names) > 2 else ""
    return ", ".join(share.names[:2]) + more


def share_headers(placement: Placement) -> tuple[str, ...]:
    """The placement table's columns: the run's figures once the dry run has filled them in."""
    return RUN_HEADERS if any(s.peak_bytes is not None for s in placement.devices) else WEIGHT_HEADERS


def _headroom(share: DeviceShare) -> str:
    """What the budget has left at the peak ('-' and the excess when over; 'tight' under the allocator's margin)."""
    room = share.headroom_bytes
    if room is None:
        return ""
    if room < 0:
        return f"-{size(-room)}"
    return f"{size(room)} tight" if headroom.is_tight(room, share.margin_bytes) else size(room)


def share_rows(placement: Placement) -> list[list[str]]:
    """One row per device: what it holds against its budget."""
    run = share_headers(placement) == RUN_HEADERS
    rows = []
    for share in placement.devices:
        budget = size(share.budget) if share.budget is not None else ""
        layers = str(share.layers) if share.layers else ""
        if run:
            figures = [size(share.cache_bytes or 0), size(share.activation_bytes or 0),
                       size(share.reserve_bytes or 0), size(share.needed_bytes)]  # fmt: skip
            rows.append([share.device, layers, size(share.bytes), *figures, budget, _headroom(share), _entries(share)])
        else:
            rows.append([share.device, layers, size(share.bytes), budget, _entries(share)])
    return rows


def run_notes(plan: LoadPlan) -> list[str]:
    """What the reader should know about the run: what the dry run does not see, and where the figures come from."""
    out: list[str] = []
    run = plan.run
    if run is None:
        return out
    out += [f"not in the dry run: {n}" for n in run.not_covered]
    out += run_plan.margin_notes(plan)
    out += budget_notes(plan)
    sources = {r.source for r in plan.reserves.values() if r.source}
    out += [f"reserve figure: {s} (--reserve SIZE sets your own)" for s in sorted(sources)]
    if plan.load_peak is not None:
        out.append(f"host at load: {plan.load_peak.note}")
    return out


def budget_notes(plan: LoadPlan) -> list[str]:
    """Where ``budget`` gives a device more than max_memory: the weights' bound and what the run was checked against."""
    bound, budget = plan.args.max_memory or {}, plan.args.budget or {}
    return [
        f"max_memory {key}={bound[key]} bounds the weights from_pretrained places there; the run is checked against "
        f"the device's budget {key}={size} (the cache and activations use what the weights leave)"
        for key, size in budget.items()
        if key in bound
    ]


def run_dict(plan: LoadPlan) -> dict[str, Any]:
    """The run's plain data for ``plan.to_dict()``."""
    return {
        "context": plan.context,
        "batch": plan.batch,
        "padding": plan.args.padding,
        "run_target": plan.run_target,
        "max_context": plan.max_context,
        "max_batch": plan.max_batch,
        "run": plan.run.to_dict() if plan.run is not None else None,
        "run_problem": plan.dry_run.problem,
        "reserves": {str(k): vars(r) for k, r in plan.reserves.items()},
    }
