"""Pure logic: facts and decisions as plain data. Never imports IPython, ipywidgets, plotly or jupyter_server."""
