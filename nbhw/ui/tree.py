"""Closing a widget and everything it owns: ipywidgets' ``close()`` closes one widget, not its layout, style or
children, and each of those holds a comm in the kernel and a model in the browser until it is closed too.
"""

from __future__ import annotations

from typing import Any

import ipywidgets
import traitlets


def owned(widget: Any) -> list[Any]:
    """The widgets a widget's synced traits hold: its layout and style, a box's children."""
    found: list[Any] = []
    for name in getattr(widget, "keys", None) or []:
        value = widget._trait_values.get(name)  # never getattr: that would create a default widget to close
        items = value if isinstance(value, list | tuple) else [value]
        found += [item for item in items if isinstance(item, ipywidgets.Widget)]
    return found


def close_tree(*roots: Any, keep: tuple[Any, ...] = ()) -> None:
    """Close each root, then every widget it owns, depth first; closing twice is harmless. ``keep``: widgets left
    open (and what they own), such as a view's :class:`Shared` layouts while only some of its widgets close."""
    seen: set[int] = {id(k) for k in keep}
    stack = [r for r in roots if r is not None]
    while stack:
        widget = stack.pop()
        if id(widget) in seen:
            continue
        seen.add(id(widget))
        stack += owned(widget)
        widget.close()


class Shared:
    """Layouts and styles made once per set of traits and used by every widget of one view that asks for it.

    Each widget's own default layout and style is one more comm in the kernel and one more model the browser makes
    before a panel shows (about half of the Load tab's widgets were layouts and styles). Never change a shared
    one's traits; :meth:`widgets` are closed with the view (a widget closed before it: ``close_tree(widget,
    keep=shared.widgets())``).
    """

    def __init__(self) -> None:
        self._made: dict[tuple[Any, ...], Any] = {}

    def layout(self, **traits: Any) -> Any:
        """The view's Layout with these traits."""
        return self._one(ipywidgets.Layout, traits)

    def style(self, widget: type[traitlets.HasTraits], **traits: Any) -> Any:
        """The view's style for a widget class (the style class ipywidgets declares for it) with these traits."""
        declared = widget.class_traits()["style"]  # an InstanceDict: an Instance trait of the style class
        assert isinstance(declared, traitlets.Instance)
        assert isinstance(declared.klass, type)
        return self._one(declared.klass, traits)

    def looks(
        self, widget: type[traitlets.HasTraits], style: dict[str, Any] | None = None, **layout: Any
    ) -> dict[str, Any]:
        """``layout=`` and ``style=`` for a new ``widget``: the view's Layout with the ``layout`` traits and its
        style with the ``style`` traits."""
        return {"layout": self.layout(**layout), "style": self.style(widget, **(style or {}))}

    def _one(self, kind: type, traits: dict[str, Any]) -> Any:
        key = (kind, *sorted(traits.items()))
        if key not in self._made:
            self._made[key] = kind(**traits)
        return self._made[key]

    def widgets(self) -> list[Any]:
        """Every layout and style made."""
        return list(self._made.values())
