"""transformers' offloaded cache run on the meta device: stand-ins only where the accelerator meets the host.

``cache_implementation="offloaded"`` makes ``DynamicCache(offloading=True)`` (transformers 5.24, ``Cache.update``):
every update waits on ``torch.cuda.default_stream(device)`` and the cache's prefetch stream, prefetches the next
offloaded layer to the device (``layer.prefetch()``: ``keys.to(device, non_blocking=True)``), runs the layer's own
update, then copies the layer to the host (``layer.offload()``: ``keys.to("cpu", non_blocking=True)``). That code
runs for real in a dry run, so transformers decides which layer is where and when (the prefetch circles back to
the first layer; sliding layers are offloaded too by ``DynamicCache``, kept on the device by ``StaticCache``: each
class's own ``offload_only_non_sliding`` default, which generate() leaves alone). Only the boundary stands in:

- **streams**: the cache's prefetch stream and ``torch.cuda.default_stream`` order nothing (meta tensors have no
  work to wait for) for a CUDA target; for another target ``torch.cuda.default_stream`` is asked for real with the
  target's device, so the plan says what torch says there (on a CPU-only torch: "Torch not compiled with CUDA
  enabled", which a real ``generate()`` on the CPU raises too);
- **copies**: a meta tensor sent to the CPU becomes a CPU tensor of its shape and dtype backed by one element,
  counted as its full bytes on "cpu" while it lives (:func:`nbhw.core.hf.dryrun.stand_in`); such a tensor sent
  back becomes a new meta tensor on the device that runs (counted by the tracker as any op's output); an op that
  reads such a copy with tensors on the device that runs (a layer no prefetch brought back: T5's decoder reads its
  cache layers by position in a cache made one layer per encoder layer, and its cross-attention reads cached keys
  without an update) stops the dry run with :class:`Stranded`, as torch stops a real one (tensors on two devices).

The copy of ``update`` whose globals name the stand-in ``torch.cuda`` is bound to the cache object itself: no
module or class attribute changes. Not covered: a D2H ``non_blocking`` copy lands in pinned host memory, whose
caching allocator rounds each block up to a power of two and keeps freed blocks; the host figure is the tensors'.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import types
from collections.abc import Hashable, Iterator
from functools import cache
from typing import Any

from nbhw.core.hf import dryrun
from nbhw.core.hf.as_if import _Namespace

OFFLOADED = ("offloaded", "offloaded_static")  # the cache_implementation words whose caches offload to the host
# The word whose cache is the same but kept on the device (transformers builds both with the same class and
# arguments, offloading=True added).
ON_DEVICE = {"offloaded": "dynamic", "offloaded_static": "static"}
HOST: Hashable = "cpu"


class Refused(RuntimeError):
    """The target's torch refuses what the offloaded cache asks of it (no CUDA streams there)."""


class Stranded(Refused):
    """An op reads a cache layer the offloaded cache left in host memory, with tensors on the running device."""


def asks_offloading(generation: tuple[tuple[str, Any], ...]) -> bool:
    """Whether a dry run's generate() options ask for an offloaded cache."""
    return dict(generation).get("cache_implementation") in OFFLOADED


class _Stream:
    """A stream on the meta device: waits and contexts order nothing, as there is no work to order."""

    def wait_stream(self, other: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _torch_view(target: str) -> Any:
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    def default_stream(device: Any = None) -> Any:
        if target == "cuda":
            return _Stream()
        try:
            return torch.cuda.default_stream(torch.device(target))
        except Exception as exc:
            why = " ".join(str(exc).split())
            raise Refused(
                f"the offloaded cache fails on {target}: transformers' Cache.update waits on "
                f"torch.cuda.default_stream() in every update ({type(exc).__name__}: {why})"
            ) from exc

    cuda = _Namespace("torch.cuda", {"default_stream": default_stream}, fallback=torch.cuda)
    return _Namespace("torch", {"cuda": cuda}, fallback=torch)


def raised_in_cache_code(exc: BaseException) -> str | None:
    """The function of transformers' cache code an exception was raised in (its innermost frame there), or None."""
    found = None
    frame = exc.__traceback__
    while frame is not None:
        if frame.tb_frame.f_globals.get("__name__") == "transformers.cache_utils":
            code = frame.tb_frame.f_code
            found = getattr(code, "co_qualname", code.co_name)  # co_qualname: Python 3.11+
        frame = frame.tb_next
    return found


def made_on_device(gen: Any) -> Any:
    """The generation config to make an offloaded cache with: its on-device twin (see :func:`turn_on_offloading`)."""
    if getattr(gen, "cache_implementation", None) not in ON_DEVICE:
        return gen
    twin = copy.copy(gen)
    twin.cache_implementation = ON_DEVICE[gen.cache_implementation]
    return twin


def turn_on_offloading(found: Any, gen: Any) -> None:
    """Offloading on for a cache made by :func:`made_on_device`'s config, by transformers' own ``Cache.__init__``.

    transformers makes an offloaded cache's prefetch stream in ``Cache.__init__`` with ``torch.Stream()``, which on a
    machine with a GPU creates a CUDA context: planning must not. The cache is made as its on-device twin, then a
    copy of ``Cache.__init__`` whose ``torch.Stream`` is a stand-in runs again on each part with ``offloading=True``
    and the parts' own layers, as transformers would have called it.
    """
    if getattr(gen, "cache_implementation", None) not in ON_DEVICE:
        return
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch
    from transformers.cache_utils import Cache  # lazy: likewise for transformers

    init = Cache.__init__
    streams = {"Stream": _Stream}
    view = _Namespace("torch", {**streams, "cuda": _Namespace("torch.cuda", streams, fallback=torch.cuda)}, torch)
    copied = types.FunctionType(init.__code__, {**init.__globals__, "torch": view}, init.__name__, init.__defaults__,
                                init.__closure__)  # fmt: skip
    for part in _parts(found):
        replicate = part.layer_class_to_replicate
        copied(part, layers=None if replicate else part.layers, layer_class_to_replicate=replicate, offloading=True,
               **_own_defaults(type(part), init))  # fmt: skip


def _own_defaults(cls: type, init: Any) -> dict[str, Any]:
    """The defaults a cache class's own ``__init__`` passes on to ``Cache.__init__`` when generate() names none.

    generate() makes an offloaded cache with ``offloading=True`` only, so ``offload_only_non_sliding`` is the class's
    own default: False for ``DynamicCache`` (sliding layers are offloaded too), True for ``StaticCache``.
    """
    own = inspect.signature(cls).parameters
    passed = ("self", "layers", "layer_class_to_replicate", "offloading")
    return {
        name: own[name].default
        for name in inspect.signature(init).parameters
        if name not in passed and name in own and own[name].default is not inspect.Parameter.empty
    }


def _parts(found: Any) -> list[Any]:
    if hasattr(found, "self_attention_cache"):
        return [found.self_attention_cache, found.cross_attention_cache]
    return [found] if found is not None else []


def stand_in_streams(found: Any, target: str) -> None:
    """Bind to each offloading part of a cache a copy of transformers' ``update`` whose ``torch.cuda.default_stream``
    answers for ``target`` (its prefetch stream is already a stand-in: :func:`turn_on_offloading`)."""
    for part in _parts(found):
        if not getattr(part, "offloading", False):
            continue
        update = type(part).update
        globals_ = {**update.__globals__, "torch": _torch_view("cuda" if target == "cuda" else "cpu")}
        copied = types.FunctionType(update.__code__, globals_, update.__name__, update.__defaults__,
                                    update.__closure__)  # fmt: skip
        part.update = types.MethodType(copied, part)


def _device_asked(args: Any, kwargs: dict[str, Any]) -> Any:
    """The device a ``Tensor.to(...)`` call names (None: a dtype or another tensor only)."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    found = kwargs.get("device", args[0] if args else None)
    if isinstance(found, str | int):
        return torch.device(found)
    return found if isinstance(found, torch.device) else None


def _tensor_args(args: Any, kwargs: dict[str, Any]) -> Iterator[Any]:
    """The tensors a torch call is given, one level into lists and tuples (``torch.cat``'s sequence)."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    for arg in (*args, *kwargs.values()):
        if isinstance(arg, torch.Tensor):
            yield arg
        elif isinstance(arg, list | tuple):
            yield from (item for item in arg if isinstance(item, torch.Tensor))


def _check_not_stranded(func: Any, args: Any, kwargs: dict[str, Any]) -> None:
    """Refuse an op that reads a host copy together with tensors on the running device (torch refuses it there)."""
    tensors = list(_tensor_args(args, kwargs))
    if len(tensors) < 2 or not any(dryrun.stood_in(t) is not None for t in tensors):
        return
    if any(t.device.type == "meta" for t in tensors):
        from torch.overrides import resolve_name  # lazy: import nbhw and %load_ext nbhw stay free of torch

        name = resolve_name(func) or str(func)
        raise Stranded(
            f"{name} reads cached keys or values that transformers' "
            "offloaded cache left in host memory together with tensors on the device that runs (it brings back only "
            "the next cache layer by position, and this model reads a layer it did not bring back); torch refuses "
            "tensors on two devices in one op, so a real generate() fails there"
        )


class _HostCopies:
    """The methods of :func:`host_copies`'s mode (a TorchFunctionMode, made on first use)."""

    def __init__(self, track: Any) -> None:
        super().__init__()
        self.track = track
        self.copies = 0

    def __torch_function__(self, func: Any, types_: Any, args: Any = (), kwargs: Any = None) -> Any:
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

        kwargs = kwargs or {}
        if func is torch.Tensor.to and args and isinstance(args[0], torch.Tensor):
            tensor, device = args[0], _device_asked(args[1:], kwargs)
            if device is not None and device.type != "cpu" and dryrun.stood_in(tensor) is not None:
                return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")  # back on the running device
            if device is not None and device.type == "cpu" and tensor.device.type == "meta":
                return self.to_host(tensor)
        elif self.copies:
            _check_not_stranded(func, args, kwargs)
        return func(*args, **kwargs)

    def to_host(self, tensor: Any) -> Any:
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

        with torch.utils._python_dispatch._disable_current_modes():
            copy = torch.empty((1,) * tensor.dim(), dtype=tensor.dtype).expand(tensor.shape)
        dryrun.stand_in(self.track, copy, HOST, tensor.numel() * tensor.element_size())
        self.copies += 1
        return copy


@cache
def _host_copies_class() -> type:
    from torch.overrides import TorchFunctionMode  # lazy: import nbhw and %load_ext nbhw stay free of torch

    return type("HostCopies", (_HostCopies, TorchFunctionMode), {"__module__": __name__})


@contextlib.contextmanager
def host_copies(track: Any) -> Iterator[Any]:
    """Within the block, meta tensors copied to the CPU (and back) are counted on "cpu" by ``track``."""
    with _host_copies_class()(track) as mode:
        yield mode
