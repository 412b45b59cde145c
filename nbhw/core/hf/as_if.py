"""transformers' own checks, run as if on a device that isn't here: how nbhw advises for a target.

transformers decides what works on a device inside functions that ask torch (``torch.cuda.is_available()``,
``torch.cuda.get_device_capability()``, ``torch.xpu.is_available()``, ``torch.backends.mps.is_available()``) and its
own helpers (``is_torch_xpu_available``, ``get_current_accelerator``, ``get_available_devices``, ...). To read those
decisions for hardware that is not here, :class:`AsIf` runs a *copy* of such a function whose globals name stand-ins
answering for a :class:`TargetDevice` instead of those modules and helpers.

Nothing process-wide changes, by design: no module attribute is patched, no ``lru_cache`` of transformers is touched,
no logging or warnings filter is changed. The real modules, and other threads (a notebook's memory sampler, a cell
loading a real model), keep seeing this machine, so a copy needs no lock and can't leak. This is the one place nbhw
answers for a device at run time rather than in tests, and it does so only for copies of library functions.

What a stand-in can't answer, it refuses rather than guesses: a device attribute it doesn't model raises
:class:`NotModelled` and never reaches the real driver (no CUDA context is ever created). Code outside the copied
functions (a package's own module, methods of other objects) runs for real; callers say so where it matters.
"""

from __future__ import annotations

import builtins
import re
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

# transformers' device checks, by the name its modules import them under, and the device kinds each answers True for.
DEVICE_CHECKS: dict[str, tuple[str, ...]] = {
    "is_torch_cuda_available": ("cuda", "rocm"),
    "is_cuda_platform": ("cuda",),
    "is_rocm_platform": ("rocm",),
    "is_torch_xpu_available": ("xpu",),
    "is_torch_mps_available": ("mps",),
    "is_torch_npu_available": ("npu",),
    "is_torch_hpu_available": ("hpu",),
    "is_torch_mlu_available": ("mlu",),
    "is_torch_musa_available": ("musa",),
    "is_torch_neuroncore_available": ("neuron",),
    "is_torch_neuron_available": ("neuron",),
    "is_torch_tpu_available": ("tpu",),
    "is_torch_xla_available": (),
}
HELPERS = ("get_current_accelerator", "get_available_devices", "get_device_type")
# transformers.utils.get_available_devices adds exactly these kinds (no tpu, no neuron).
AVAILABLE_DEVICE_KINDS = ("cuda", "mps", "xpu", "npu", "hpu", "mlu", "musa")
PLUGIN_MODULES = ("npu", "hpu", "mlu", "musa")
PACKAGE_CHECK = re.compile(r"^is_(?!torch_)\w+_available$")


class NotModelled(RuntimeError):
    """A check read a device function the stand-in doesn't model; it was stopped before reaching a real device."""


@dataclass(frozen=True)
class TargetDevice:
    """The device a check should see: transformers' device type (``rocm`` for AMD), count and capability."""

    kind: str
    count: int = 1
    capability: tuple[int, int] | None = None
    name: str = "a device that is not here"
    total_memory: int = 0

    @property
    def torch_type(self) -> str:
        """The torch device type: AMD GPUs are ``cuda`` to torch."""
        return "cuda" if self.kind == "rocm" else self.kind

    @property
    def has_cuda(self) -> bool:
        """Whether torch.cuda answers for it (NVIDIA, and AMD through HIP)."""
        return self.kind in {"cuda", "rocm"}


@dataclass
class Seen:
    """What a run read: the device calls, the package checks (and their answer here), the log lines, quirks, and the
    package checks whose kept answer (False) is no longer true (the package was installed since they were asked)."""

    calls: list[str] = field(default_factory=list)
    packages: list[tuple[str, bool]] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    logs: list[tuple[str, str]] = field(default_factory=list)
    quirks: list[str] = field(default_factory=list)

    def call(self, name: str) -> None:
        if name not in self.calls:
            self.calls.append(name)


class _Namespace:
    """A module stand-in: listed members answer, the rest come from ``fallback`` or raise NotModelled."""

    def __init__(self, path: str, members: dict[str, Any], fallback: Any = None, missing: Iterable[str] = ()) -> None:
        self._path, self._members, self._fallback, self._missing = path, members, fallback, set(missing)

    def __getattr__(self, name: str) -> Any:
        if name in self._members:
            return self._members[name]
        if name in self._missing:
            raise AttributeError(f"module '{self._path}' has no attribute '{name}'")  # as the real torch would
        if self._fallback is not None:
            return getattr(self._fallback, name)
        raise NotModelled(f"{self._path}.{name}")


def stand_in(path: str, members: dict[str, Any], fallback: Any) -> Any:
    """A module as a copy should see it: ``members`` answer, everything else is the real module's."""
    return _Namespace(path, members, fallback)


class _Log:
    """transformers' logger, recorded instead of printed (warnings that change a verdict become notes)."""

    def __init__(self, seen: Seen) -> None:
        self._seen = seen

    def __getattr__(self, level: str) -> Callable[..., None]:
        def record(msg: object, *args: object, **kwargs: object) -> None:
            text = str(msg) % args if args else str(msg)
            self._seen.logs.append((level.removesuffix("_once"), " ".join(text.split())))

        return record


def _found(answer: Any) -> bool:
    """A package check's answer as a bool (a (found, version) tuple: its first item)."""
    return bool(answer[0] if isinstance(answer, tuple) else answer)


class AsIf:
    """Runs copies of library functions as if on ``device`` (None: this machine, calls recorded, nothing replaced).

    ``assume_installed`` names package checks (``is_X_available``) to answer True, so a check can be read past a
    package this machine lacks; the answer the real check gives here is still recorded in ``seen.packages``.
    ``answers`` gives other names of the copies' globals a value of their own (a package's version check).
    """

    def __init__(
        self,
        device: TargetDevice | None,
        assume_installed: Iterable[str] = (),
        answers: dict[str, Any] | None = None,
    ) -> None:
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

        self.device = device
        self.assume = frozenset(assume_installed)
        self.answers = dict(answers or {})
        self.seen = Seen()
        self._real_torch = torch
        self._torch = self._torch_view(torch, device) if device is not None else torch
        self._bound: dict[int, Callable[..., Any]] = {}
        self._builtins = dict(vars(builtins))
        self._builtins["__import__"] = self._import

    # ------------------------------------------------------------ running

    def call(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``func(*args, **kwargs)`` with its globals (and those of transformers functions it calls) answering."""
        return self.bind(func)(*args, **kwargs)

    def bind(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """A copy of ``func`` that sees the stand-ins; the original and its module are untouched."""
        target = getattr(func, "__func__", func)
        if not isinstance(target, types.FunctionType):
            return func
        key = id(target)
        if key not in self._bound:
            copy = types.FunctionType(
                target.__code__, self._globals(target), target.__name__, target.__defaults__, target.__closure__
            )
            copy.__kwdefaults__ = target.__kwdefaults__
            copy.__dict__.update(target.__dict__)
            self._bound[key] = copy
        return self._bound[key]

    def device_check(self, name: str) -> Callable[..., Any]:
        """transformers' device check ``name`` (e.g. is_torch_cuda_available) as the target answers it."""
        import transformers.utils.import_utils as iu  # lazy: import nbhw and %load_ext nbhw stay free of transformers

        return self._device_check(name, getattr(iu, name, lambda *a, **k: False))

    # ------------------------------------------------------------ globals of a copy

    def _globals(self, func: types.FunctionType) -> dict[str, Any]:
        real = func.__globals__
        copied: dict[str, Any] = dict(real)
        copied["__builtins__"] = self._builtins
        for name in func.__code__.co_names:
            if name in real:
                copied[name] = self._replacement(name, real[name])
        return copied

    def _replacement(self, name: str, value: Any) -> Any:
        if name in self.answers:
            return self.answers[name]
        if value is self._real_torch:
            return self._torch
        if name == "logger":
            return _Log(self.seen)
        if name == "warnings":
            return _Namespace("warnings", {"warn": lambda msg, *a, **k: self.seen.logs.append(("warn", str(msg)))})
        if name in DEVICE_CHECKS:
            return self._device_check(name, value)
        if name in HELPERS:
            return self._recorded(name, self._helper(name) if self.device is not None else value)
        if PACKAGE_CHECK.match(name) and callable(value):
            return self._package_check(name, value)
        if isinstance(value, types.FunctionType) and value.__module__.startswith("transformers"):
            return self._lazy(value)
        if isinstance(value, types.ModuleType) and value.__name__.startswith("transformers"):
            return _ModuleView(value, self)
        return value

    def _lazy(self, func: types.FunctionType) -> Callable[..., Any]:
        # Bound on first call, so a module-level helper the check calls answers for the target too.
        def run(*args: Any, **kwargs: Any) -> Any:
            return self.bind(func)(*args, **kwargs)

        run.__name__ = func.__name__
        return run

    def _import(self, name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        module = builtins.__import__(name, globals, locals, fromlist, level)
        if name == "torch" and not fromlist:
            return self._torch
        if getattr(module, "__name__", "").startswith("transformers") and fromlist:
            return _ModuleView(module, self)
        return module

    # ------------------------------------------------------------ the stand-ins

    def _recorded(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            self.seen.call(name)
            return fn(*args, **kwargs)

        return run

    def _device_check(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        if self.device is None:
            return self._recorded(name, real)
        answer = self.device.kind in DEVICE_CHECKS[name]
        return self._recorded(name, lambda *a, **k: answer)

    def _helper(self, name: str) -> Callable[..., Any]:
        device = self.device
        assert device is not None
        if name == "get_current_accelerator":
            return self._current_accelerator
        if name == "get_available_devices":
            kind = device.torch_type
            return lambda: frozenset({"cpu", kind} if kind in AVAILABLE_DEVICE_KINDS else {"cpu"})
        return lambda *a, **k: device.kind

    def _package_check(self, name: str, real: Callable[..., Any]) -> Callable[..., bool]:
        def run(*args: Any, **kwargs: Any) -> bool:
            value = real(*args, **kwargs)
            if isinstance(value, tuple):
                # transformers 5.24's is_sinq_available returns _is_package_available's (found, version) tuple,
                # which is always truthy: its own check never fires and the load fails later on `import sinq`.
                quirk = f"transformers' {name}() returns {value!r} (always true): read as {_found(value)}"
                if quirk not in self.seen.quirks:
                    self.seen.quirks.append(quirk)
            here = _found(value)
            self.seen.packages.append((name, here))
            if not here and name not in self.assume and name not in self.seen.kept and self._now(real, args, kwargs):
                self.seen.kept.append(name)
            return True if name in self.assume else here

        return run

    def _now(self, check: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """A kept package check (transformers' ``lru_cache``) asked again: its own body, run as a copy that sees the
        stand-ins, so a package installed since the first answer is found and no device is touched."""
        body = getattr(check, "__wrapped__", None)
        if body is None or not hasattr(check, "cache_info"):
            return False
        seen = self.seen
        before = [(part, len(part)) for part in (seen.calls, seen.packages, seen.logs, seen.quirks, seen.kept)]
        try:
            value = self.call(body, *args, **kwargs)
        except Exception:
            return False
        finally:
            for part, n in before:  # what the second ask read is not what the check read
                del part[n:]
        return _found(value)

    def _current_accelerator(self) -> Any:
        assert self.device is not None
        return None if self.device.kind == "cpu" else self._real_torch.device(self.device.torch_type)

    def _torch_view(self, torch: Any, d: TargetDevice) -> _Namespace:
        rec = self._recorded

        def capability(device: Any = None) -> tuple[int, int]:
            if not d.has_cuda or d.capability is None:
                raise NotModelled("torch.cuda.get_device_capability (the target has no CUDA capability)")
            return d.capability

        major, minor = d.capability or (0, 0)
        props = types.SimpleNamespace(
            name=d.name, total_memory=d.total_memory, major=major, minor=minor, multi_processor_count=0
        )
        cuda = _Namespace("torch.cuda", {
            "is_available": rec("torch.cuda.is_available", lambda: d.has_cuda),
            "device_count": rec("torch.cuda.device_count", lambda: d.count if d.has_cuda else 0),
            "get_device_capability": rec("torch.cuda.get_device_capability", capability),
            "current_device": rec("torch.cuda.current_device", lambda: 0),
            "get_device_name": rec("torch.cuda.get_device_name", lambda device=None: d.name),
            "get_device_properties": rec("torch.cuda.get_device_properties", lambda device=None: props),
            "is_bf16_supported": rec("torch.cuda.is_bf16_supported", lambda *a, **k: (major, minor) >= (8, 0)),
            "empty_cache": rec("torch.cuda.empty_cache", lambda: None),
            "mem_get_info": rec("torch.cuda.mem_get_info", lambda device=None: (d.total_memory, d.total_memory)),
        })  # fmt: skip
        xpu = _Namespace("torch.xpu", {
            "is_available": rec("torch.xpu.is_available", lambda: d.kind == "xpu"),
            "device_count": rec("torch.xpu.device_count", lambda: d.count if d.kind == "xpu" else 0),
            "current_device": rec("torch.xpu.current_device", lambda: 0),
            "empty_cache": rec("torch.xpu.empty_cache", lambda: None),
        })  # fmt: skip
        mps = _Namespace("torch.backends.mps", {
            "is_available": rec("torch.backends.mps.is_available", lambda: d.kind == "mps"),
            "is_built": rec("torch.backends.mps.is_built", lambda: d.kind == "mps"),
        })  # fmt: skip
        version = _Namespace("torch.version", {
            "hip": "6.4" if d.kind == "rocm" else None, "cuda": "12.8" if d.kind == "cuda" else None,
        }, fallback=torch.version)  # fmt: skip
        accelerator = _Namespace("torch.accelerator", {
            "current_accelerator": rec("torch.accelerator.current_accelerator", self._current_accelerator),
            "is_available": rec("torch.accelerator.is_available", lambda: d.kind != "cpu"),
            "device_count": rec("torch.accelerator.device_count", lambda: d.count if d.kind != "cpu" else 0),
        })  # fmt: skip
        members: dict[str, Any] = {
            "cuda": cuda, "xpu": xpu, "version": version, "accelerator": accelerator,
            "backends": _Namespace("torch.backends", {"mps": mps}, fallback=torch.backends),
        }  # fmt: skip
        if d.kind in PLUGIN_MODULES:
            members[d.kind] = _Namespace(f"torch.{d.kind}", {
                "is_available": rec(f"torch.{d.kind}.is_available", lambda: True),
                "device_count": rec(f"torch.{d.kind}.device_count", lambda: d.count),
                "current_device": rec(f"torch.{d.kind}.current_device", lambda: 0),
            })  # fmt: skip
        missing = [k for k in PLUGIN_MODULES if k != d.kind]
        return _Namespace("torch", members, fallback=torch, missing=missing)


class _ModuleView:
    """A transformers module seen from a copy: its functions are bound to the same stand-ins."""

    def __init__(self, module: types.ModuleType, runner: AsIf) -> None:
        self._module, self._runner = module, runner

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        return self._runner._replacement(name, value)
