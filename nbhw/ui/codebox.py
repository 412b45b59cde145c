"""The code box of the Load tab: the previewed cell, syntax highlighted and selectable, with "Insert cell below"
and "Copy" run in the browser (static/codebox.js; insertion by nbhw's JupyterLab extension, js/src/index.js).
"""

from __future__ import annotations

import functools
import html
import threading
from pathlib import Path
from typing import Any

import anywidget
import traitlets
from pygments import highlight as render
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

STATIC = Path(__file__).parent / "static"
CSS = """
.nbhw-codebox { display: flex; flex-direction: column; gap: 4px; max-width: 900px; }
.nbhw-codebox-code { margin: 0; padding: 6px 8px; overflow-x: auto; user-select: text; -webkit-user-select: text;
  font-family: var(--jp-code-font-family, monospace); font-size: var(--jp-code-font-size, 13px); line-height: 1.35;
  background: var(--jp-cell-editor-background, #f7f7f7); border: 1px solid var(--jp-border-color2, #ddd);
  white-space: pre; cursor: text; }
.nbhw-codebox-code[data-empty="true"] { display: none; }
.nbhw-codebox-bar { display: flex; gap: 6px; align-items: center; }
.nbhw-codebox-status { color: var(--jp-ui-font-color2, #555); font-size: 12px; }
"""


_lexer_ready = threading.Event()  # set once pygments has compiled the Python lexer's rules (its first use)


@functools.lru_cache(maxsize=32)
def highlight(code: str) -> str:
    """Python source as inline-styled HTML spans (no CSS classes needed): its text is exactly ``code``."""
    if not code:
        return ""
    try:
        return _highlight(code)
    finally:
        _lexer_ready.set()


def quick_html(code: str) -> str:
    """The code's HTML without waiting: highlighted once the lexer is ready, else the code as plain text (the
    lexer's first use compiles its rules, 50-200 ms of CPU; the highlighted form follows with the next part)."""
    return highlight(code) if _lexer_ready.is_set() else html.escape(code, quote=False)


def _highlight(code: str) -> str:
    # stripnl/ensurenl off and nowrap on: the spans' text is the code, character for character, except for the
    # line end pygments' formatter still adds after the last line.
    lexer = PythonLexer(stripnl=False, ensurenl=False)
    found = str(render(code, lexer, HtmlFormatter(nowrap=True, noclasses=True, style="default")))
    return found[:-1] if found.endswith("\n") and not code.endswith("\n") else found


class CodeBox(anywidget.AnyWidget):
    """The previewed code (``code``), its highlighted form (``html``) and a status line (``note``)."""

    _esm = (STATIC / "codebox.js").read_text()
    _css = CSS
    code = traitlets.Unicode("").tag(sync=True)
    html = traitlets.Unicode("").tag(sync=True)
    note = traitlets.Unicode("").tag(sync=True)

    def show(self, code: str, note: str = "", html: str | None = None) -> None:
        """Show ``code`` (empty: no code, buttons off) in one message; ``html``: its highlighted form, when made
        already (off the widgets' lock)."""
        with self.hold_sync():
            self.code = code
            self.html = highlight(code) if html is None else html
            self.note = note


def codebox(**kwargs: Any) -> Any:
    """A new code box."""
    return CodeBox(**kwargs)
