"""Closing a widget and everything it owns: ipywidgets' ``close()`` closes one widget, not its layout, style or
children, and each of those holds a comm in the kernel and a model in the browser until it is closed too.
"""

from __future__ import annotations

from typing import Any

import ipywidgets


def owned(widget: Any) -> list[Any]:
    """The widgets a widget's synced traits hold: its layout and style, a box's children."""
    found: list[Any] = []
    for name in getattr(widget, "keys", None) or []:
        value = widget._trait_values.get(name)  # never getattr: that would create a default widget to close
        items = value if isinstance(value, list | tuple) else [value]
        found += [item for item in items if isinstance(item, ipywidgets.Widget)]
    return found


def close_tree(*roots: Any) -> None:
    """Close each root, then every widget it owns, depth first; closing twice is harmless."""
    seen: set[int] = set()
    stack = [r for r in roots if r is not None]
    while stack:
        widget = stack.pop()
        if id(widget) in seen:
            continue
        seen.add(id(widget))
        stack += owned(widget)
        widget.close()
