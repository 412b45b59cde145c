"""Formatting shared by every text and HTML view: sizes people read, aligned tables, escaping."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any

GIB = 1024**3
MIB = 1024**2

# The CSS of every core view's HTML (devices, attention advice, load plan).
STYLE = """<style>
.nbhw { font-family: var(--jp-ui-font-family, sans-serif); font-size: 13px; line-height: 1.4; }
.nbhw h3 { font-size: 14px; margin: 10px 0 4px; }
.nbhw table.nbhw-table { border-collapse: collapse; margin: 2px 0 6px; }
.nbhw table.nbhw-table th, .nbhw table.nbhw-table td {
  text-align: left; padding: 2px 8px; border-bottom: 1px solid var(--jp-border-color2, #ddd); vertical-align: top; }
.nbhw table.nbhw-table th { font-weight: 600; }
.nbhw .ok { color: var(--jp-success-color1, #1a7f37); font-weight: 600; }
.nbhw .no { color: var(--jp-ui-font-color2, #777); }
.nbhw .fix code, .nbhw code { font-family: var(--jp-code-font-family, monospace); font-size: 12px; }
.nbhw .warn { color: var(--jp-warn-color1, #9a6700); }
.nbhw .bad { color: var(--jp-error-color1, #d1242f); font-weight: 600; }
.nbhw .sub { margin-left: 18px; }
.nbhw .src { color: var(--jp-ui-font-color2, #777); font-size: 11px; overflow-wrap: anywhere; }
</style>"""

# One colour per device in every picture (the memory graph, the placement): device N takes PALETTE[N].
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
HOST_COLORS = {"cpu": "#9e9e9e", "host": "#9e9e9e", "disk": "#616161"}


def device_color(device: str) -> str:
    """The colour of a device wherever nbhw draws it: cuda:1, gpu1 (NVML's index) and "accelerator 1" alike."""
    if device in HOST_COLORS:
        return HOST_COLORS[device]
    m = re.search(r"(\d+)$", device)
    return PALETTE[int(m.group(1)) % len(PALETTE)] if m else PALETTE[0]


def size(nbytes: float | None) -> str:
    """Bytes as a person reads them: '23.5 GiB', '512 MiB', 'N/A' when unknown."""
    if nbytes is None:
        return "N/A"
    value = float(nbytes)
    for unit, scale in (("TiB", 1024**4), ("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{int(value)} B"


def yes_no(value: bool | None) -> str:
    """A tri-state flag for a table cell."""
    if value is None:
        return "N/A"
    return "yes" if value else "no"


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Rows as aligned columns, headers first, for terminals and bug reports."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = [indent + "  ".join(h.ljust(widths[i]) for i, h in enumerate(headers)).rstrip()]
    lines.append(indent + "  ".join("-" * w for w in widths))
    lines.extend(indent + "  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip() for row in rows)
    return "\n".join(lines)


def field_lines(rows: Sequence[tuple[str, str]], indent: str = "  ") -> list[str]:
    """``name  value`` lines, the names padded to the longest (a plan's estimate, a serving plan, a loaded model)."""
    width = max((len(name) for name, _ in rows), default=0)
    return [f"{indent}{name.ljust(width)}  {value}" for name, value in rows]


def esc(value: object) -> str:
    """HTML-escape any value."""
    return html.escape(str(value), quote=True)


def html_table(headers: Sequence[str], rows: Sequence[Sequence[str]], css_class: str = "nbhw-table") -> str:
    """Rows as an HTML table; cells are escaped here."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{css_class}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


class Shown:
    """A result that shows as HTML in Jupyter and as aligned text in a terminal or ``print``.

    Subclasses give ``text()`` and ``html()``; IPython picks the form its front end can show.
    """

    def text(self) -> str:
        raise NotImplementedError

    def html(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.text()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self.html()}

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text())


# ---------------------------------------------------------------- Python source


def py_str(text: str) -> str:
    """A string literal for ``text``, double-quoted like black writes it when that needs no extra escapes."""
    literal = repr(text)
    if literal.startswith("'") and '"' not in text:
        literal = '"' + literal[1:-1].replace("\\'", "'") + '"'
    return literal


def py_literal(value: Any) -> str:
    """Source for an int, a string, or a dict of those."""
    if isinstance(value, bool | int):
        return repr(value)
    if isinstance(value, str):
        return py_str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{py_literal(k)}: {py_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no literal for {type(value).__name__}")
