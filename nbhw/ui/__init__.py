"""Notebook views (ipywidgets + plotly) over nbhw.core; one module per view."""
