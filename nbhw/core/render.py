"""Formatting shared by every text and HTML view: sizes people read, aligned tables, escaping."""

from __future__ import annotations

import html
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
.nbhw .sub { margin-left: 18px; }
.nbhw .src { color: var(--jp-ui-font-color2, #777); font-size: 11px; overflow-wrap: anywhere; }
</style>"""


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
