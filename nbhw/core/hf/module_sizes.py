"""transformers' ``compute_module_sizes``, kept per model and sizing.

One placement sizes the same model three times (transformers' get_balanced_memory and infer_auto_device_map, then
nbhw's shares per device), and a search places the same model under many budgets and strategies: the answer depends
only on the model and how its weights are sized (unquantized, or a quantizer's :meth:`sizing_key`), so it is
computed once and handed out as a copy. Meta models are never changed after they are built; a quantizer without a
sizing key (one nbhw did not make) is sized every time.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import defaultdict
from collections.abc import Hashable, Iterator
from typing import Any

Sizes = tuple[dict[str, int], dict[str, int]]

_KEPT: weakref.WeakKeyDictionary[Any, dict[Hashable, tuple[Sizes, frozenset[str]]]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_original: list[Any] = []  # transformers' own function, read before any patch


def _compute() -> Any:
    if not _original:
        # lazy: import nbhw and %load_ext nbhw stay free of transformers
        from transformers.integrations.accelerate import compute_module_sizes

        _original.append(compute_module_sizes)
    return _original[0]


def _sizing(quantizer: Any) -> Hashable | None:
    if quantizer is None:
        return "unquantized"
    key = getattr(type(quantizer), "sizing_key", None)
    return key(quantizer) if callable(key) else None


def _on_meta(model: Any) -> bool:
    """A model nbhw built on the meta device (a real one may change as it loads: never kept)."""
    first = next(iter(model.parameters()), None)
    return first is not None and bool(first.is_meta)


def module_sizes(model: Any, hf_quantizer: Any = None, buffers_only: bool = False, only_modules: bool = True) -> Sizes:
    """What ``compute_module_sizes`` returns for these arguments (same signature), computed once per model."""
    sizing = _sizing(hf_quantizer)
    if sizing is None or not _on_meta(model):
        return _compute()(model, hf_quantizer, buffers_only=buffers_only, only_modules=only_modules)  # type: ignore[no-any-return]
    key = (sizing, buffers_only, only_modules)
    with _lock:
        found = _KEPT.get(model, {}).get(key)
    if found is None:
        sizes = _compute()(model, hf_quantizer, buffers_only=buffers_only, only_modules=only_modules)
        scales = frozenset(getattr(hf_quantizer, "scales", ()))
        found = ((dict(sizes[0]), dict(sizes[1])), scales)
        with _lock:
            _KEPT.setdefault(model, {})[key] = found
    (modules, leaves), scales = found
    if scales and hf_quantizer is not None:
        hf_quantizer.scales.update(scales)  # what sizing them told this quantizer (the estimate's words read it)
    return defaultdict(int, modules), defaultdict(int, leaves)


@contextlib.contextmanager
def kept_in_transformers() -> Iterator[None]:
    """transformers' device_map code sizes through :func:`module_sizes` inside the block (callers hold the placement
    lock: one patch at a time)."""
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.integrations import accelerate as hf_accelerate

    original = _compute()
    hf_accelerate.compute_module_sizes = module_sizes
    try:
        yield
    finally:
        hf_accelerate.compute_module_sizes = original
