"""Meta tensors that carry their values: the few small tensors of a dry run whose values library code reads.

A meta tensor has a shape and no values, so library code that reads one (``bool(mask.sum() == mask.numel())``,
``.item()``) stops a dry run. Inside :func:`known_values`, a meta tensor given its values (:meth:`give`) keeps a CPU
copy of them; every op whose meta inputs all have values computes its outputs' values on the CPU as well (a 2-D
attention mask, its boolean form, its cumulative sum, their reductions), and reading a meta tensor that has values
answers from them. Library code then takes the branch the real values take (transformers' masking_utils: skip the
mask when nothing is padded, build it when something is), instead of the dry run deciding for it.

Values are kept only for tensors no larger than twice the largest one given (the 2-D inputs, grown by the decode
step), never for the large tensors built from them (a 4-D mask is built from index ranges that have no values).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import cache
from typing import Any

CARRIED = "_nbhw_values"  # the attribute of a meta tensor that holds its values (dies with the tensor)


def value(tensor: Any) -> Any | None:
    """The values a meta tensor carries (a CPU tensor), or None."""
    return getattr(tensor, CARRIED, None)


class _Known:
    """The methods of :func:`known_values`'s mode (a TorchDispatchMode, made on first use)."""

    def __init__(self) -> None:
        super().__init__()
        from torch.utils.weak import WeakTensorKeyDictionary  # lazy: import nbhw stays free of torch

        self.carrying: Any = WeakTensorKeyDictionary()  # the tensors that carry values (by identity)
        self.most = 0  # elements: the largest tensor whose values are kept

    def give(self, tensor: Any, values: Any) -> None:
        """Let ``tensor`` (meta) carry ``values`` (a CPU tensor of its shape and dtype)."""
        if tuple(values.shape) != tuple(tensor.shape) or values.dtype != tensor.dtype:
            raise ValueError(f"values of shape {tuple(values.shape)} {values.dtype} for a {tensor.dtype} tensor "
                             f"of shape {tuple(tensor.shape)}")  # fmt: skip
        with unseen():
            self._carry(tensor, values.clone())
        self.most = max(self.most, 2 * tensor.numel())

    def _carry(self, tensor: Any, values: Any | None) -> None:
        setattr(tensor, CARRIED, values)
        if values is None:
            self.carrying.pop(tensor, None)
        else:
            self.carrying[tensor] = True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        import torch  # lazy: import nbhw stays free of torch

        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            found = value(args[0])
            if found is not None:
                return found.item()
        out = func(*args, **kwargs)
        if self.carrying and _any_carried(args, kwargs):
            self._follow(func, args, kwargs, out)
        return out

    def _follow(self, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        """Give ``out`` values when every meta input has them; else forget the values of what ``func`` wrote."""
        import torch  # lazy: import nbhw stays free of torch
        from torch.utils._pytree import tree_flatten, tree_map

        inputs = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor) and x.is_meta]
        outs = tree_flatten(out)[0]
        made = [o for o in outs if isinstance(o, torch.Tensor) and o.is_meta]
        if any(value(x) is None for x in inputs) or not made or any(o.numel() > self.most for o in made):
            self._forget(func, args, kwargs, made)
            return

        def on_cpu(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.is_meta:
                return value(x)
            return torch.device("cpu") if isinstance(x, torch.device) and x.type == "meta" else x

        try:
            with unseen():
                computed = tree_flatten(func(*tree_map(on_cpu, args), **tree_map(on_cpu, kwargs)))[0]
        except Exception:  # an op the CPU can't run on these values: the outputs carry none
            self._forget(func, args, kwargs, made)
            return
        for o, c in zip(outs, computed, strict=False):
            if isinstance(o, torch.Tensor) and o.is_meta and isinstance(c, torch.Tensor):
                self._carry(o, c)

    def _forget(self, func: Any, args: Any, kwargs: dict[str, Any], made: list[Any]) -> None:
        """Values no longer true: of the outputs, and of every tensor sharing storage with an input ``func`` wrote."""
        for o in made:
            if value(o) is not None:
                self._carry(o, None)
        storages = {_storage(w) for w in _written(func, args, kwargs)}
        for tensor in [t for t in list(self.carrying.keys()) if storages and _storage(t) in storages]:
            self._carry(tensor, None)


def _any_carried(args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether an op's argument carries values (tensors are top-level or in a list, as aten ops take them)."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, list | tuple):
            if any(value(x) is not None for x in a):
                return True
        elif value(a) is not None:
            return True
    return False


def _storage(tensor: Any) -> int:
    return int(tensor.untyped_storage()._cdata)


def _written(func: Any, args: Any, kwargs: dict[str, Any]) -> list[Any]:
    """The tensors an op writes in place (``Tensor(a!)`` in its schema)."""
    import torch  # lazy: import nbhw stays free of torch

    schema = getattr(func, "_schema", None)
    declared = list(schema.arguments) if schema is not None else []
    by_name = {a.name: a for a in declared}
    pairs = [*zip(declared, args, strict=False), *((by_name[k], v) for k, v in kwargs.items() if k in by_name)]
    return [v for a, v in pairs if isinstance(v, torch.Tensor) and a.alias_info is not None and a.alias_info.is_write]


@contextlib.contextmanager
def unseen() -> Iterator[None]:
    """Ops that are not the run's (values made or computed on the CPU): no mode of the run sees them."""
    from torch.utils._python_dispatch import _disable_current_modes  # lazy: import nbhw stays free of torch

    with _disable_current_modes():
        yield


@cache
def _known_class() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode  # lazy: import nbhw stays free of torch

    return type("KnownValues", (_Known, TorchDispatchMode), {"__module__": __name__})


@contextlib.contextmanager
def known_values() -> Iterator[Any]:
    """Within the block, meta tensors given values carry them through the ops that use them (see the module)."""
    with _known_class()() as mode:
        yield mode
