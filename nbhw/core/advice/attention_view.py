"""Text and HTML renderings of the attention / kernel / dtype advice, from plain data (no IPython, no widgets)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbhw.core.hardware.detect_view import STYLE
from nbhw.core.render import esc, html_table, text_table

if TYPE_CHECKING:
    from nbhw.core.advice.attention import AttentionAdvice, AttentionRow

HEADERS = ("attn_implementation", "status", "checked", "why", "fix")
CSS = {
    "works": "ok",
    "won't work": "no",
    "works via Hub kernel download": "warn",
    "needs download, not checked": "warn",
    "depends on the device": "warn",
}


def _title(a: AttentionAdvice) -> str:
    what = f"{a.model} ({a.model_class}, config from {a.model_source})" if a.model else "this hardware alone"
    here = "" if a.present else " — not present here"
    dtype = f"dtype {a.dtype}" + ("" if a.dtype_given else " (advised)")
    return f"nbhw attention: {what} on {a.device}{here}, {dtype}, transformers {a.transformers}"


def _key(row: AttentionRow) -> str:
    return f"{row.key} -> {row.resolves_to}" if row.resolves_to else row.key


def _checked(row: AttentionRow) -> str:
    return "yes" if row.checked else "no"


def _why(row: AttentionRow) -> str:
    return "; ".join([row.reason, *row.notes])


def _cells(row: AttentionRow) -> list[str]:
    return [_key(row), row.status, _checked(row), _why(row), row.fix or ""]


def _reference_line(a: AttentionAdvice) -> str | None:
    if a.model:
        return None
    return f"No model given: rows are checked with nbhw's tiny {a.model_class}, a class that supports every kind."


def _kernel_lines(a: AttentionAdvice) -> list[str]:
    k = a.kernels
    lines = [f"use_kernels=True: {'can work' if k.use_kernels else 'will not work'} here — {k.reason}"]
    if k.fix:
        lines.append(f"  fix: {k.fix}")
    if k.problem:
        lines.append(f"  the default mapping could not be read: {k.problem}")
    elif k.layers:
        marked = set(k.model_layers or [])
        shown = [
            e.layer + ("*" if e.layer in marked else "") + (f" ({e.condition})" if e.condition else "")
            for e in k.layers
        ]
        lines.append(f"  default mapping for {k.device_key} ({k.source}): {', '.join(shown)}")
        lines.append(f"  * marked for Hub kernels in {a.model_class}'s code: {', '.join(k.model_layers) or 'none'}")
    else:
        lines.append(f"  the default mapping ({k.source}) has no entries for {k.device_key}")
    lines.append(f"  KernelConfig device keys: {', '.join(k.kernel_config_keys)}")
    return lines


def _dtype_lines(a: AttentionAdvice) -> list[str]:
    p = a.precision
    lines = [f"dtype for {p.device}: {p.dtype} — {p.reason}"]
    if p.tf32:
        lines.append(f"  tf32: {p.tf32}")
    lines.append(f"  training: {p.training} — {p.training_reason}")
    for launch in p.launch:
        lines.append(f"  launch: {launch}")
    lines += [f"  {n}" for n in p.notes]
    return lines


def text(a: AttentionAdvice) -> str:
    """The advice for terminals: the table, then the fixes, silent behaviours, kernels and dtype."""
    rows = [[_key(r), r.status, _checked(r), _why(r)] for r in a.rows]
    out = [_title(a), ""]
    out.append(text_table(HEADERS[:4], rows, indent="  "))
    by_fix: dict[str, list[str]] = {}
    for r in a.rows:
        if r.fix:
            by_fix.setdefault(r.fix, []).append(r.key)
    fixes = [f"  {', '.join(keys)}: {fix}" for fix, keys in by_fix.items()]
    if fixes:
        out += ["", "Fixes:", *fixes]
    ref = _reference_line(a)
    out += [f"  note: {n}" for n in a.notes]
    out += ["", "What transformers does without telling you:", *[f"  - {n}" for n in a.silent]]
    if ref:
        out += ["", ref]
    out += ["", "Hub kernels (use_kernels=True):", *["  " + line for line in _kernel_lines(a)]]
    out += ["", "  " + a.kernels.example.replace("\n", "\n  ")]
    out += ["", "dtype:", *["  " + line for line in _dtype_lines(a)]]
    return "\n".join(out)


def _html_rows(a: AttentionAdvice) -> str:
    table = html_table(HEADERS, [_cells(r) for r in a.rows], css_class="nbhw-table nbhw-attention")
    # Colour the status cells: html_table escapes every cell, so mark them after the fact by exact text.
    for status, css in CSS.items():
        cell = f'<td class="{css}" style="white-space: nowrap">{esc(status)}</td>'
        table = table.replace(f"<td>{esc(status)}</td>", cell)
    return table


def html(a: AttentionAdvice) -> str:
    """The advice as an HTML fragment for Jupyter."""
    ref = _reference_line(a)
    parts = [STYLE, '<div class="nbhw nbhw-attention-advice">', f"<h3>{esc(_title(a))}</h3>"]
    parts += [f'<p class="warn">{esc(n)}</p>' for n in a.notes]
    parts.append(_html_rows(a))
    if ref:
        parts.append(f'<p class="no">{esc(ref)}</p>')
    parts.append("<h3>What transformers does without telling you</h3><ul>")
    parts += [f"<li>{esc(n)}</li>" for n in a.silent]
    parts.append("</ul><h3>Hub kernels (use_kernels=True)</h3><ul>")
    parts += [f"<li>{esc(line.strip())}</li>" for line in _kernel_lines(a)]
    parts.append(f"</ul><pre><code>{esc(a.kernels.example)}</code></pre><h3>dtype</h3><ul>")
    parts += [f"<li>{esc(line.strip())}</li>" for line in _dtype_lines(a)]
    parts.append("</ul></div>")
    return "".join(parts)
