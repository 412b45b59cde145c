"""Sphinx configuration for nbhw's documentation site: built by ``scripts/docs.sh`` into ``docs/_build/html``.

The guide's pages are notebooks executed at every build (myst-nb), so a broken example fails the build; the
reference's Python API comes from nbhw's own docstrings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbclient

import nbhw

project = "nbhw"
author = "nbhw developers"
release = nbhw.__version__
version = release

extensions = ["myst_nb", "sphinx.ext.autodoc"]
exclude_patterns = ["_build", "_vendor", "jupyter_execute", "**.ipynb_checkpoints"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}

# Every guide notebook runs at every build, in this environment's python3 kernel; an error in a cell fails the build.
nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_execution_timeout = 600
nb_merge_streams = True

# Widgets: each page keeps its notebook's widget state, drawn in the browser by require.js and
# @jupyter-widgets/html-manager (anywidget's front end, for nbhw's code box and plotly's figures, loaded by it).
# scripts/docs.sh saves them in docs/_vendor/widgets (ignored by git) from the npm registry: then the site draws its
# widgets offline, from its own _static/widgets. Without that copy the pages load the same versions from the jsDelivr
# CDN, and draw their widgets only where it is reachable. _static/nbhw-widgets.js tells require.js where they are.
_WIDGETS = Path(__file__).parent / "_vendor" / "widgets"
_CDN = "https://cdn.jsdelivr.net/npm/"
if (_WIDGETS / "anywidget.js").is_file():
    nb_ipywidgets_js = {
        "widgets/require.js": {},
        "nbhw-widgets.js": {},
        "widgets/embed-amd.js": {},
    }
else:
    nb_ipywidgets_js = {
        f"{_CDN}requirejs@2.3.7/require.js": {
            "integrity": "sha256-ghW5AAC1cb0kHShRLIP1mFXOzDFY25S3my2XTJkjtdI=",
            "crossorigin": "anonymous",
        },
        "nbhw-widgets.js": {"data-widgets": f"{_CDN}@jupyter-widgets/html-manager@1.0.15/dist"},
        f"{_CDN}@jupyter-widgets/html-manager@1.0.15/dist/embed-amd.js": {
            "data-jupyter-widgets-cdn": _CDN,
            "crossorigin": "anonymous",
        },
    }


# nbclient (0.10, 0.11) saves a widget's binary buffers by path and keeps each one until another comes for the same
# path: when a trait that held a buffer is set back to None (plotly's FigureWidget sends each update in
# _py2js_update, then sets it back to None) the saved state keeps the old buffer under a None, and html-manager's
# put_buffers stops the whole page at it ("Cannot read properties of null"): no widget of the page is drawn. The
# buffers whose place is gone are dropped here, when the executed notebook's widget state is written.
_set_widgets_metadata = nbclient.NotebookClient.set_widgets_metadata


def _has_place(state: dict[str, Any] | list[Any], path: list[Any]) -> bool:
    """Whether the container a buffer's path ends in is still in the widget's state."""
    for key in path[:-1]:
        found = key in state if isinstance(state, dict) else isinstance(key, int) and 0 <= key < len(state)
        if not found:
            return False
        state = state[key]
        if not isinstance(state, dict | list):
            return False
    return True


def _set_widgets_metadata_without_stale_buffers(self: nbclient.NotebookClient) -> None:
    _set_widgets_metadata(self)
    saved = self.nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    for widget in saved.get("state", {}).values():
        if "buffers" in widget:
            widget["buffers"] = [b for b in widget["buffers"] if _has_place(widget["state"], b["path"])]
            if not widget["buffers"]:
                del widget["buffers"]


nbclient.NotebookClient.set_widgets_metadata = _set_widgets_metadata_without_stale_buffers  # type: ignore[method-assign]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"

html_theme = "furo"
html_title = f"nbhw {release}"
html_static_path = ["_static", "_vendor"] if _WIDGETS.is_dir() else ["_static"]
