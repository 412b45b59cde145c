"""Text, HTML and plain-data forms of a load plan."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbhw.core import render

if TYPE_CHECKING:
    from nbhw.core.plan.estimate import Estimate
    from nbhw.core.plan.load_plan import LoadPlan
    from nbhw.core.plan.placement import Placement


def count(n: int) -> str:
    """A parameter count as model cards write it: 8.03B, 596.0M, 112.5K."""
    for unit, scale, digits in (("B", 10**9, 2), ("M", 10**6, 1), ("K", 10**3, 1)):
        if n >= scale:
            return f"{n / scale:.{digits}f}{unit}"
    return str(n)


def _dtype_note(plan: LoadPlan) -> str | None:
    if plan.args.dtype != "auto":
        return None
    if plan.config_dtype:
        return f'dtype="auto" picks {plan.dtype}, the dtype the config names'
    if plan.config.available and plan.dtype != "float32":
        return f'dtype="auto" picks {plan.dtype}, the dtype of the local weights (the config names none)'
    if plan.config.available:
        return 'dtype="auto": neither the config nor local weights name a dtype; float32 assumed'
    return None


def notes(plan: LoadPlan) -> list[str]:
    """Everything worth knowing that is not a problem."""
    out: list[str] = []
    if not plan.config.available:
        out.append(f"config not available, so the cell assumes a causal LM ({plan.auto_class})")
    out += plan.arguments.omitted
    out += [n for n in [_dtype_note(plan)] if n]
    attn = plan.args.attn_implementation
    if attn is not None and plan.build is None and plan.config.available:
        out.append(f"attn_implementation={attn!r} needs a Hub kernel download at load: not checked")
    if plan.args.use_kernels and not plan._kernel_problems():
        out.append("use_kernels=True needs Hub kernel downloads at load: not checked")
    if plan.args.device_map == "meta":
        out.append("device_map='meta' loads the model without weights (transformers accepts it silently)")
    if plan.args.max_memory is not None and not (
        isinstance(plan.args.device_map, str) and plan.placement and plan.placement.strategy
    ):
        out.append("max_memory only changes anything with device_map auto / balanced / balanced_low_0 / sequential")
    estimate = plan.estimate if plan.config.available else None
    if estimate is not None:
        out += estimate.notes + ([estimate.kv_note] if estimate.kv_note else [])
    placement = plan.placement if plan.config.available else None
    if placement is not None:
        out += placement.notes
    return out


def to_dict(plan: LoadPlan) -> dict[str, Any]:
    """Plain JSON-ready data."""
    args = plan.args
    estimate = plan.estimate if plan.config.available else None
    placement = plan.placement if plan.config.available else None
    return {
        "model": plan.model,
        "config_source": plan.config.source,
        "auto_class": plan.auto_class,
        "arguments": {
            "device_map": args.device_map,
            "dtype": args.dtype,
            "attn_implementation": args.attn_implementation,
            "use_kernels": args.use_kernels,
            "quantization": args.quantization,
            "max_memory": {str(k): v for k, v in args.max_memory.items()} if args.max_memory else None,
        },
        "dtype": plan.dtype if plan.config.available or args.dtype != "auto" else None,
        "code": plan.code,
        "problems": plan.check(),
        "notes": notes(plan),
        "estimate": estimate.to_dict() if estimate is not None else None,
        "placement": placement.to_dict() if placement is not None else None,
    }


def _estimate_rows(e: Estimate) -> list[tuple[str, str]]:
    kv = e.kv_cache_per_1k_tokens
    growing = len([k for k in e.kv_layers if k.bytes_per_token])
    quant = f", {e.quantization} weights" if e.quantization else ""
    return [
        ("parameters", f"{count(e.parameters)} ({count(e.non_embedding_parameters)} without the input embedding)"),
        ("weights", f"{render.size(e.total_bytes)} in {e.dtype}{quant}"),
        ("largest layer", f"{render.size(e.largest_layer_bytes)}  {', '.join(e.largest_layer[:3])}"),
        ("KV cache", "N/A" if kv is None else f"{render.size(kv)} per 1,000 tokens of one sequence ({growing} layers)"),
        (
            "training",
            f"{render.size(e.training_total)} for weights, gradients and Adam states together "
            f"(largest single stage {render.size(e.training_peak)}); full fine-tuning in {e.training_precision} "
            "mixed precision, batch size 1, activations not included (accelerate's figures)",
        ),
    ]


def _share_rows(p: Placement) -> list[list[str]]:
    rows = []
    for share in p.devices:
        more = f" … +{len(share.names) - 2}" if len(share.names) > 2 else ""
        budget = render.size(share.budget) if share.budget is not None else ""
        layers = str(share.layers) if share.layers else ""
        rows.append([share.device, layers, render.size(share.bytes), budget, ", ".join(share.names[:2]) + more])
    return rows


def _placement_title(plan: LoadPlan, p: Placement) -> str:
    how = f'device_map="{p.strategy}"' if p.strategy else f"device_map={plan.args.device_map!r}"
    if plan.args.device_map is None:
        how = "no device_map"
    return f"{how}, against {p.budget_source}"


SHARE_HEADERS = ("device", "layers", "weights", "budget", "device_map entries")


def _problems_title(problems: list[str]) -> str:
    if not problems:
        return "Dry run: transformers accepts this plan here"
    return f"Dry run: {len(problems)} problem{'s' if len(problems) > 1 else ''}"


def _header(plan: LoadPlan) -> str:
    where = plan.config.source or "not available"
    return f"nbhw: load plan for {plan.model!r} (config: {where}; {plan.auto_class}, {plan.dtype})"


def text(plan: LoadPlan, *, code: bool = True) -> str:
    """The plan for a terminal."""
    lines = [_header(plan), ""]
    if code:
        lines += ["Code", *("    " + line if line else "" for line in plan.code.splitlines()), ""]
    problems = plan.check()
    lines += [_problems_title(problems), *(f"  - {p}" for p in problems), ""]
    estimate = plan.estimate if plan.config.available else None
    if estimate is not None:
        rows = _estimate_rows(estimate)
        width = max(len(k) for k, _ in rows)
        lines += ["Estimate", *(f"  {k.ljust(width)}  {v}" for k, v in rows), ""]
    placement = plan.placement if plan.config.available else None
    if placement is not None:
        lines += [f"Placement: {placement.verdict}", f"  {_placement_title(plan, placement)}"]
        lines += [render.text_table(SHARE_HEADERS, _share_rows(placement), indent="  "), ""]
    extra = notes(plan)
    if extra:
        lines += ["Notes", *(f"  - {n}" for n in extra)]
    return "\n".join(lines).rstrip() + "\n"


def html(plan: LoadPlan, *, code: bool = True) -> str:
    """The plan as an HTML fragment (every value escaped)."""
    esc = render.esc
    parts = [f'<div class="nbhw-plan"><p><b>{esc(_header(plan))}</b></p>']
    if code:
        parts.append(f'<pre class="nbhw-code">{esc(plan.code)}</pre>')
    problems = plan.check()
    items = "".join(f"<li>{esc(p)}</li>" for p in problems)
    parts.append(f"<p><b>{esc(_problems_title(problems))}</b></p>" + (f"<ul>{items}</ul>" if items else ""))
    estimate = plan.estimate if plan.config.available else None
    if estimate is not None:
        parts.append(
            "<p><b>Estimate</b></p>" + render.html_table(("", ""), [list(r) for r in _estimate_rows(estimate)])
        )
    placement = plan.placement if plan.config.available else None
    if placement is not None:
        parts.append(f"<p><b>Placement: {esc(placement.verdict)}</b><br>{esc(_placement_title(plan, placement))}</p>")
        parts.append(render.html_table(SHARE_HEADERS, _share_rows(placement)))
    extra = notes(plan)
    if extra:
        parts.append("<p><b>Notes</b></p><ul>" + "".join(f"<li>{esc(n)}</li>" for n in extra) + "</ul>")
    parts.append("</div>")
    return "".join(parts)
