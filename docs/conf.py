"""Sphinx configuration for nbhw's documentation site: built by ``scripts/docs.sh`` into ``docs/_build/html``.

The guide's pages are notebooks executed at every build (myst-nb), so a broken example fails the build; the
reference's Python API comes from nbhw's own docstrings.
"""

from __future__ import annotations

import nbhw

project = "nbhw"
author = "nbhw developers"
release = nbhw.__version__
version = release

extensions = ["myst_nb", "sphinx.ext.autodoc"]
exclude_patterns = ["_build", "jupyter_execute", "**.ipynb_checkpoints"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}

# Every guide notebook runs at every build, in this environment's python3 kernel; an error in a cell fails the build.
nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_execution_timeout = 600
nb_merge_streams = True

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"

html_theme = "furo"
html_title = f"nbhw {release}"
html_static_path = ["_static"]
