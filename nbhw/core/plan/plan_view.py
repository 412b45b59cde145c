"""A plan's text, HTML and dict: every way a load plan is shown.

The notes, the estimate's rows and the placement's columns in words (the text and the HTML show the same rows), the
plan as text for terminals, as an HTML fragment and as plain JSON-ready data, the displayable :class:`PlanView`, and
the Load tab's pieces of HTML that only read a preview (the placement's blocks, each device's budget bar, the dry
run's line). Every function takes the plan (:class:`~nbhw.core.plan.load_plan.LoadPlan`) or the Load tab's preview
and reads their public properties; nothing here builds a widget.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from nbhw.core import argument, render
from nbhw.core.hardware import presence
from nbhw.core.hf import kernel_tables, meta_build
from nbhw.core.plan import for_target, headroom, run_plan
from nbhw.core.plan.arguments import DEFAULT_PADDING, DISK
from nbhw.core.plan.estimate import Estimate
from nbhw.core.plan.pinned import plan_beside_pin
from nbhw.core.plan.placement import DeviceShare, Placement
from nbhw.core.plan.preflight import warnings as preflight_warnings
from nbhw.core.plan.run_figures import PADDINGS, RunEstimate
from nbhw.core.plan.run_plan import BATCH_LIMIT
from nbhw.core.render import Shown

if TYPE_CHECKING:
    from nbhw.core.hardware.targets import Target
    from nbhw.core.plan.load_form import Choices, Preview, Unit
    from nbhw.core.plan.load_plan import LoadPlan

size = render.size


# ---------------------------------------------------------------- the notes


def _dtype_note(plan: LoadPlan) -> str | None:
    if plan.args.dtype != "auto":
        return None
    if plan.inputs.config_dtype:
        return f'dtype="auto" picks {plan.dtype}, the dtype the config names'
    if plan.config.available and plan.dtype != "float32":
        return f'dtype="auto" picks {plan.dtype}, the dtype of the local weights (the config names none)'
    if plan.config.available:
        return 'dtype="auto": neither the config nor local weights name a dtype; float32 assumed'
    return None


def plan_notes(plan: LoadPlan, *, run: bool = True) -> list[str]:
    """Everything worth knowing that is not a problem (``run=False``: not yet what the run's dry run says)."""
    out: list[str] = for_target.notes(plan.target, plan.dtype) if plan.target is not None else []
    if plan.target is not None and plan.config.available:
        out += plan.target_quantization[1]
        if plan.built.attn_on_target:
            out.append(f"attn_implementation={plan.args.attn_implementation!r}: read from transformers' rules for the "
                       f"{plan.target.accelerator.name}, not built here")  # fmt: skip
    if not plan.config.available:
        out.append(f"config not available, so the cell assumes a causal LM ({plan.inputs.auto_class})")
    out += plan.arguments.omitted
    out += [n for n in [_dtype_note(plan)] if n]
    attn = plan.args.attn_implementation
    unbuilt = attn is not None and plan.built.build is None and plan.config.available and not plan.built.attn_on_target
    # check() only where the note could be said: notes are read before a dry run too (the Load tab's first stage).
    if unbuilt and not any(p.startswith(f"attn_implementation={attn!r}") for p in plan.check()):
        out.append(f"attn_implementation={attn!r} needs a Hub kernel download at load: not checked")
    out += kernels_notes(plan)
    if plan.args.device_map == "meta":
        out.append("device_map='meta' loads the model without weights (transformers accepts it silently)")
    if plan.args.max_memory is not None and not (
        isinstance(plan.args.device_map, str) and plan.weight_placement and plan.weight_placement.strategy
    ):
        out.append(
            "max_memory only changes what transformers does with device_map auto / balanced / balanced_low_0 / "
            "sequential; nbhw still plans against it as each device's budget"
        )
    estimate = plan.weight_estimate if plan.config.available else None
    if estimate is not None:
        out += estimate.notes
    placement = plan.weight_placement if plan.config.available else None
    if placement is not None:
        out += placement.notes
    if plan.config.available and run:
        out += run_notes(plan)
    out += preflight_warnings(plan)  # the hook: nbhw.doctor()'s findings this cell would hit, as warnings
    return out


def kernels_notes(plan: LoadPlan) -> list[str]:
    """What use_kernels will do at load: transformers' default when the cell leaves it out, and the downloads."""
    out = []
    default = plan.kernels_default
    if plan.args.use_kernels is None and default.value is None:
        out.append(f"use_kernels is left out, and what transformers then does is unknown: {default.why}; pass "
                   "use_kernels=True or False (--kernels / --no-kernels) to know")  # fmt: skip
    elif plan.args.use_kernels is None and default.value:
        out.append(f"use_kernels is left out, so Hub kernels are on: {default.why}; the load swaps the layers the "
                   "kernel mapping has for this device (on a GPU it downloads them); to keep every layer's own code "
                   "pass use_kernels=False (--no-kernels) or set USE_HUB_KERNELS=0")  # fmt: skip
    if plan.use_kernels and not plan.kernel_problems():
        out += _swaps(plan)
    return out


def _swaps(plan: LoadPlan) -> list[str]:
    """Which layers use_kernels=True swaps on the plan's devices (each a Hub download at load, not checked)."""
    placement = plan.weight_placement if plan.config.available else None
    if placement is None:
        return ["use_kernels=True needs Hub kernel downloads at load: not checked"]
    cls = meta_build.model_class(plan.config.config, plan.inputs.auto_class)
    values = [v for v in placement.device_map.values() if v != DISK]
    kinds = {presence.device_type(v, plan.placed.live.accelerator) for v in values}
    swaps = {kind: kernel_tables.swapped_layers(cls, kind) for kind in sorted(k for k in kinds if k)}
    found = {kind: layers for kind, layers in swaps.items() if layers}
    out = []
    if None in kinds:  # a bare index, and no accelerator here to say which backend it means
        bare = ", ".join(str(v) for v in dict.fromkeys(v for v in values if isinstance(v, int)))
        out.append(f"use_kernels=True: what is swapped on device {bare} is unknown here (no accelerator says which "
                   "backend a bare index means); Hub kernel downloads at load, not checked")  # fmt: skip
    if found:
        each = "; ".join(f"{', '.join(layers)} on {kind}" for kind, layers in found.items())
        out.append(f"use_kernels=True swaps {each}: Hub kernel downloads at load, not checked")
    elif swaps:
        out.append(f"use_kernels=True: the kernel mapping has no {'/'.join(swaps)} kernel for {cls.__name__}'s "
                   "layers: nothing is swapped or downloaded")  # fmt: skip
    return out


# ---------------------------------------------------------------- the run's rows, the placement's columns


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
    held = [(k, r) for k, r in plan.ran.reserves.items()]
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
    peak = plan.ran.load_peak
    if peak is None:
        return None
    pages = f"{size(peak.file_bytes)} of the checkpoint's mapped pages (reclaimable page cache, counted in RSS)"
    if not peak.private_bytes:
        return f"{size(peak.rss_bytes)} resident at the peak: {pages}; no private copy"
    why = f"the weights cast to {plan.dtype}" if plan.dtype != plan.inputs.checkpoint_dtype else "the weights"
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
    out += run_plan.margin_notes(plan.inputs, plan.placed.live, plan.run, plan.placement)
    out += budget_notes(plan)
    sources = {r.source for r in plan.ran.reserves.values() if r.source}
    out += [f"reserve figure: {s} (--reserve SIZE sets your own)" for s in sorted(sources)]
    if plan.ran.load_peak is not None:
        out.append(f"host at load: {plan.ran.load_peak.note}")
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
        "run_target": plan.placed.run_target,
        "max_context": plan.max_context,
        "max_batch": plan.max_batch,
        "run": plan.run.to_dict() if plan.run is not None else None,
        "run_problem": plan.dry_run.problem,
        "reserves": {str(k): vars(r) for k, r in plan.ran.reserves.items()},
    }


# ---------------------------------------------------------------- the plan as text, HTML and plain data


def _pinned_title(plan: LoadPlan) -> str:
    pin = plan.pinned
    assert pin is not None
    return f"Pinned run ({pin.path}): {pin.data.get('model_class', '?')}, created {pin.data.get('created', '?')}"


def plan_to_dict(plan: LoadPlan) -> dict[str, Any]:
    """Plain JSON-ready data."""
    args = plan.args
    estimate = plan.estimate if plan.config.available else None
    placement = plan.placement if plan.config.available else None
    return {
        "model": plan.model,
        "config_source": plan.config.source,
        "auto_class": plan.inputs.auto_class,
        "arguments": argument.to_dict(args),
        "target": plan.target.label if plan.target is not None else None,
        "dtype": plan.dtype if plan.config.available or args.dtype != "auto" else None,
        "code": plan.code,
        "problems": plan.check(),
        "notes": plan_notes(plan),
        "estimate": estimate.to_dict() if estimate is not None else None,
        "placement": placement.to_dict() if placement is not None else None,
        **(run_dict(plan) if plan.config.available else {}),
        "pinned": None if plan.pinned is None else {"path": plan.pinned.path, "differences": plan_beside_pin(plan)},
    }


def _placement_title(plan: LoadPlan, p: Placement) -> str:
    how = f'device_map="{p.strategy}"' if p.strategy else f"device_map={plan.args.device_map!r}"
    if plan.args.device_map is None:
        how = "no device_map"
    return f"{how}, against {p.budget_source}"


def _problems_title(problems: list[str], target: Target | None = None) -> str:
    if not problems and target is not None:
        return f"Dry run: transformers' checks, read for {target.label}, accept this plan"
    if not problems:
        return "Dry run: transformers accepts this plan here"
    return f"Dry run: {len(problems)} problem{'s' if len(problems) > 1 else ''}"


def _header(plan: LoadPlan) -> str:
    where = plan.config.source or "not available"
    on = f" on {plan.target.label} — hardware that is not here" if plan.target is not None else ""
    return f"nbhw: load plan for {plan.model!r}{on} (config: {where}; {plan.inputs.auto_class}, {plan.dtype})"


def plan_text(plan: LoadPlan, *, code: bool = True) -> str:
    """The plan for a terminal."""
    lines = [_header(plan), ""]
    if code:
        lines += ["Code", *("    " + line if line else "" for line in plan.code.splitlines()), ""]
    problems = plan.check()
    lines += [_problems_title(problems, plan.target), *(f"  - {p}" for p in problems), ""]
    estimate = plan.estimate if plan.config.available else None
    if estimate is not None:
        lines += [run_title(plan), *render.field_lines(estimate_rows(plan, estimate)), ""]
    placement = plan.placement if plan.config.available else None
    if placement is not None:
        lines += [f"Placement: {placement.verdict}", f"  {_placement_title(plan, placement)}"]
        table = render.text_table(share_headers(placement), share_rows(placement), indent="  ")
        lines += [table, ""]
    if plan.pinned is not None:
        beside = plan_beside_pin(plan) or ["as pinned: same versions, arguments and weights per device"]
        lines += [_pinned_title(plan), *(f"  - {n}" for n in beside), ""]
    extra = plan_notes(plan)
    if extra:
        lines += ["Notes", *(f"  - {n}" for n in extra)]
    return "\n".join(lines).rstrip() + "\n"


def plan_html(plan: LoadPlan, *, code: bool = True, run: bool = True, searches: bool = True) -> str:
    """The plan as an HTML fragment (every value escaped); without the run, the weights and what is coming."""
    esc = render.esc
    parts = [f'<div class="nbhw-plan"><p><b>{esc(_header(plan))}</b></p>']
    if code:
        parts.append(f'<pre class="nbhw-code">{esc(plan.code)}</pre>')
    problems = plan.check()
    items = "".join(f"<li>{esc(p)}</li>" for p in problems)
    parts.append(
        f"<p><b>{esc(_problems_title(problems, plan.target))}</b></p>" + (f"<ul>{items}</ul>" if items else "")
    )
    estimate = (plan.estimate if run else plan.weight_estimate) if plan.config.available else None
    if estimate is not None:
        rows = [list(r) for r in estimate_rows(plan, estimate, run=run, searches=searches)]
        parts.append(f"<p><b>{esc(run_title(plan, run=run))}</b></p>" + render.html_table(("", ""), rows))
    placement = (plan.placement if run else plan.weight_placement) if plan.config.available else None
    if placement is not None:
        parts.append(f"<p><b>Placement: {esc(placement.verdict)}</b><br>{esc(_placement_title(plan, placement))}</p>")
        parts.append(render.html_table(share_headers(placement), share_rows(placement)))
    if plan.pinned is not None:
        beside = plan_beside_pin(plan) or ["as pinned: same versions, arguments and weights per device"]
        items = "".join(f"<li>{esc(n)}</li>" for n in beside)
        parts.append(f"<p><b>{esc(_pinned_title(plan))}</b></p><ul>{items}</ul>")
    extra = plan_notes(plan, run=run)
    if extra:
        parts.append("<p><b>Notes</b></p><ul>" + "".join(f"<li>{esc(n)}</li>" for n in extra) + "</ul>")
    parts.append("</div>")
    return "".join(parts)


class PlanView(Shown):
    """A plan's report with or without its code; renders as HTML in Jupyter and as text elsewhere."""

    def __init__(self, plan: LoadPlan, *, code: bool) -> None:
        self.plan = plan
        self.code = code

    def text(self) -> str:
        return self.plan.text(code=self.code)

    def html(self) -> str:
        return self.plan.html(code=self.code)


# ---------------------------------------------------------------- the Load tab's pieces of HTML


def device_colors(devices: list[str]) -> dict[str, str]:
    """Each device's colour (the same as in the memory graph), in the order given."""
    return {device: render.device_color(device) for device in dict.fromkeys(devices)}


def picture_html(preview: Preview, *, run: bool = True) -> str:
    """The placement as a row of blocks in model order (decoder layers tall), coloured by device, with a legend;
    its title is the verdict (``run=False``: the weights' verdict, the run's still to come)."""
    blocks: list[Unit] = preview.units
    if not blocks:
        return ""
    colors = device_colors([u.device for u in blocks])
    cells = "".join(
        f'<span data-device="{render.esc(u.device)}" title="{render.esc(u.name)} → {render.esc(u.device)} '
        f'({render.size(u.bytes)})" style="height:{28 if u.layer else 14}px;background:{colors[u.device]}"></span>'
        for u in blocks
    )
    legend = []
    for device, color in colors.items():
        mine = [u for u in blocks if u.device == device]
        layers = sum(u.layer for u in mine)
        what = f"{layers} layer{'s' if layers != 1 else ''}" + (
            f" + {len(mine) - layers} other" if len(mine) > layers else ""
        )
        size = render.size(sum(u.bytes for u in mine))
        legend.append(f'<span class="swatch" style="background:{color}"></span>{render.esc(device)}: {what}, {size}')
    verdict = preview.verdict if run else preview.weight_verdict
    return (
        f'<div class="nbhw-placement"><b>Placement: {render.esc(verdict)}</b>'
        f'<div class="nbhw-placement-blocks">{cells}</div>'
        f'<div class="nbhw-placement-legend nbhw-note">{"".join(legend)}</div></div>'
    )


def note_html(text: str, bad: bool = False) -> str:
    """A short note beside a control."""
    return f'<span class="nbhw-note{" nbhw-bad" if bad else ""}">{render.esc(text)}</span>'


def message_html(preview: Preview, choices: Choices | None) -> str:
    """The line above the code: the mistake in an entry, or what the dry run says."""
    if preview.error is not None:
        return f'<span class="nbhw-message nbhw-bad">✗ {render.esc(preview.error)}</span>'
    extra = f" ({render.esc(choices.problem)})" if choices is not None and choices.problem else ""
    target = preview.plan.target if preview.plan is not None else None
    lead = f"<b>{render.esc(target.not_here)}</b><br>" if target is not None else ""
    if preview.problems:
        n = len(preview.problems)
        return f'{lead}<span class="nbhw-message nbhw-bad">Dry run: {n} problem{"s" if n > 1 else ""}</span>{extra}'
    accepted = (
        f"transformers' checks, read for {target.label}, accept this plan"
        if target
        else "transformers accepts this plan here"
    )
    return f'{lead}<span class="nbhw-message">✓ Dry run: {accepted}</span>{extra}'


PARTS = {"weights": "weights", "cache": "#f2a541", "activations": "#e4572e", "reserve": "#8d8d8d"}


def _headroom_words(share: DeviceShare) -> str:
    """', 1.2 GiB left' (', tight: 2.0 MiB left, the allocator needs 24.0 MiB'); nothing when over or unknown."""
    room = share.headroom_bytes
    if room is None or room < 0:
        return ""
    if headroom.is_tight(room, share.margin_bytes):
        return f", tight: {render.size(room)} left, the allocator needs {render.size(share.margin_bytes)}"
    return f", {render.size(room)} left"


def budget_html(preview: Preview) -> str:
    """Per device, a bar of its budget stacked with weights / cache / activations / reserve (the run's peak there)."""
    shares = [s for s in preview.devices if s.peak_bytes is not None and (s.budget or s.needed_bytes)]
    if not shares:
        return ""
    rows = []
    for share in shares:
        scale = float(max(share.budget or 0, share.needed_bytes or 0, 1))
        parts = {"weights": share.bytes, "cache": share.cache_bytes or 0, "activations": share.activation_bytes or 0,
                 "reserve": share.reserve_bytes or 0}  # fmt: skip
        color = render.device_color(share.device)
        cells = "".join(
            f'<div class="part" data-part="{name}" title="{name}: {render.size(value)}" '
            f'style="width:{100 * value / scale:.2f}%;background:{color if name == "weights" else PARTS[name]}"></div>'
            for name, value in parts.items()
            if value
        )
        over = ""
        if share.budget is not None and (share.needed_bytes or 0) > share.budget:
            over = f'<div class="over" style="left:{100 * share.budget / scale:.2f}%" title="budget"></div>'
        budget = f" of {render.size(share.budget)}" if share.budget is not None else " (no budget known)"
        budget += _headroom_words(share)
        rows.append(
            f'<div class="nbhw-budget-row" data-device="{render.esc(share.device)}">'
            f'<span class="nbhw-budget-name">{render.esc(share.device)}</span>'
            f'<div class="nbhw-budget-bar">{cells}{over}</div>'
            f'<span class="nbhw-note">{render.size(share.needed_bytes)}{budget}</span></div>'
        )
    legend = "".join(
        f'<span class="swatch" style="background:{"#999" if c == "weights" else c}"></span>{name}'
        for name, c in PARTS.items()
    )
    return (
        f'<div class="nbhw-budget"><b>The run on each device: {render.esc(preview.verdict)}</b>{"".join(rows)}'
        f'<div class="nbhw-placement-legend nbhw-note">{legend} (weights in the device\'s colour)</div></div>'
    )


def coming(text: str) -> str:
    """A note for a part still being computed."""
    return f'<p class="nbhw-note nbhw-coming">{render.esc(text)}</p>'
