"""Run library code on the meta device and measure it with torch's own tracker, per device of a device_map.

General pieces, none of which knows a model:

- :func:`tracker`: torch's ``MemTracker`` (``torch.distributed._tools.mem_tracker``) storage accounting, keeping
  the total of every device after every op (``timeline``), without MemTracker's per-module snapshots.
- :func:`placed`: while a dry run runs, each allocation is counted on the device the running module would execute
  on under accelerate's hooks (a ``device_map``), with the copies those hooks make where tensors cross devices.
- :func:`attention_as_on`: the meta device has no fused attention kernel, so ``F.scaled_dot_product_attention`` on
  meta tensors takes the math path and materialises every (query x key) score matrix, which SDPA on a CPU or GPU
  does not. During a dry run the call is routed to the kernel the target would use, through that kernel's own meta
  registration (torch/_meta_registrations.py), so the sizes are the kernel's.
- :func:`storage_bytes` / :func:`tensors_of`: the bytes an object (a cache) really keeps alive, each storage once,
  so a view of a larger tensor counts the whole storage it pins.

torch is imported when a dry run is made, not with this module (``%load_ext nbhw`` stays free of it): the classes
that subclass torch's modes are made on first use (:func:`tracker`, :func:`attention_as_on`).
"""

from __future__ import annotations

import contextlib
import copy
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from nbhw.core.cache import PlannerDict

if TYPE_CHECKING:
    import torch

# Whose SDPA kernels size the work. "cpu": torch's own CPU selector is asked; "cuda": flash / memory-efficient /
# math by their documented constraints (see _cuda_kernel); "math": no routing (what a bare meta run does).
TARGETS = ("cpu", "cuda", "math")
# device_map values that hold weights without running them: accelerate runs those modules on the main device.
OFFLOADED = ("cpu", "disk")


@cache
def _torch() -> SimpleNamespace:
    """The torch names a dry run uses, looked up once (torch is imported with the first dry run)."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch
    from torch.distributed._tools.mem_tracker import _MemRefType, _UpdateType  # lazy: as above

    grouped = tuple(
        f for f in (getattr(torch.nn.functional, "grouped_mm", None), getattr(torch, "_grouped_mm", None)) if f
    )
    return SimpleNamespace(
        torch=torch,
        Tensor=torch.Tensor,
        safe_softmax=torch.ops.aten._safe_softmax.default,
        sdpa=torch.nn.functional.scaled_dot_product_attention,
        grouped_mm=grouped,
        act=_MemRefType.ACT,
        add=_UpdateType.ADD,
        delete=_UpdateType.DEL,
        resized=_UpdateType.SIZE,
        scalars=(bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format),
        uncacheable={torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape, torch.Tag.inplace_view},
        overload=torch._ops.OpOverload,
    )


# ----------------------------------------------------------------------------------------------- the tracker


class Interrupted(BaseException):
    """The caller no longer wants this dry run (a newer change in the Load tab): it stops between two ops.

    A BaseException, so no ``except Exception`` on the way turns it into a finding: nothing is remembered of it.
    """


_interrupt = threading.local()
CHECK_EVERY = 256  # ops between two asks of the caller's stop(): about a millisecond of a dry run


@contextlib.contextmanager
def interruptible(stop: Callable[[], bool]) -> Iterator[None]:
    """Within the block (this thread), a dry run asks ``stop()`` every few hundred ops and raises Interrupted when
    it says so."""
    previous = getattr(_interrupt, "stop", None)
    _interrupt.stop = stop
    try:
        yield
    finally:
        _interrupt.stop = previous


class TooManyOps(RuntimeError):
    """The run dispatched more ops than its budget: a Python loop over tokens or chunks, most likely."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit:,} ops")
        self.limit = limit


class _Lean:
    """The methods of :func:`tracker`'s class, mixed in before ``MemTracker`` (made on first use).

    MemTracker proper also keeps module-wise peaks (global module hooks, and a walk over every tracked module after
    every op: ~10x the forward on an 80-layer model) and refuses a second forward of a module ("multiple iterative
    calls"), which generate() does once per token. This keeps MemTracker's storage book-keeping (``_track``, the
    weakref free callbacks, ``track_external``) and counts each storage on the device it was made for: ``now``, the
    device whose module is running (see :func:`placed`).
    """

    _track: Callable[[Any, Any], None]  # MemTracker's
    _WINFO: Any  # MemTracker's storage -> (_WeakRefInfo, weakref)
    track_external: Callable[..., None]  # MemTracker's

    def __init__(self, devices: Sequence[Hashable] = ("",), max_ops: int | None = None) -> None:
        super().__init__()
        self.devices = list(devices)
        self.totals = [0] * len(self.devices)
        self.largest = [0] * len(self.devices)  # per device, the largest block the run made (the allocator's margin)
        self._outside = False  # counting tensors made outside the run (weights, inputs): not the run's blocks
        self.timeline: list[tuple[int, ...]] = []
        self.now = 0  # index of the device new storages are counted on
        self.max_ops = max_ops
        self._where: dict[int, int] = {}  # id(_WeakRefInfo) -> device index

    def index(self, device: Hashable) -> int:
        """The index of a device in ``totals`` (a device not named at the start is added)."""
        if device not in self.devices:
            self.devices.append(device)
            self.totals.append(0)
            self.largest.append(0)
        return self.devices.index(device)

    @property
    def current(self) -> int:
        """Bytes alive now, all devices together."""
        return sum(self.totals)

    def track_on(self, device: Hashable, *objects: Any) -> None:
        """Count tensors or a module's parameters and buffers made outside the run (weights, inputs) on ``device``."""
        before, self.now, self._outside = self.now, self.index(device), True
        try:
            self.track_external(*objects)
        finally:
            self.now, self._outside = before, False

    def device_of(self, tensor: Any) -> Hashable | None:
        """The device a tracked tensor's storage is counted on (None when it is not tracked)."""
        winfo, _ = self._WINFO.get(tensor.untyped_storage(), (None, None))
        return None if winfo is None else self.devices[self._where.get(id(winfo), self.now)]

    def _update_snap(
        self, u_type: Any, winfo: Any, old_mem_consumed: int | None = None, old_reftype: Any = None
    ) -> None:
        # MemTracker keeps a per-category breakdown per torch device (all "meta" here) and builds a fresh dict on
        # every update; only the total of each planned device is used.
        t = _torch()
        if u_type is t.add:
            index = self._where.setdefault(id(winfo), self.now)
            self.totals[index] += winfo.mem_consumed
            if not self._outside and winfo.mem_consumed > self.largest[index]:
                self.largest[index] = winfo.mem_consumed
        elif u_type is t.delete:
            self.totals[self._where.pop(id(winfo), self.now)] -= winfo.mem_consumed
        elif u_type is t.resized and old_mem_consumed is not None:
            self.totals[self._where.get(id(winfo), self.now)] += winfo.mem_consumed - old_mem_consumed

    def __enter__(self) -> Any:
        # TorchDispatchMode's own enter: MemTracker's would install its module and optimizer hooks.
        _torch().torch.utils._python_dispatch.TorchDispatchMode.__enter__(self)
        return self

    def __exit__(self, *args: Any) -> None:
        _torch().torch.utils._python_dispatch.TorchDispatchMode.__exit__(self, *args)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        t = _torch()
        out = _meta_kernel(func, args, kwargs or {})
        self.record(out)
        if func is t.safe_softmax and args[0].device.type == "meta":
            # A meta kernel allocates only its output. torch's _safe_softmax (the math path's softmax) also builds a
            # boolean copy of the scores and its row-wise all() (torch.profiler: aten::isneginf, aten::all under
            # aten::_safe_softmax): the dry run replays those two ops on meta, tracked, and frees them.
            masked = t.torch.ops.aten.isneginf.default(args[0])
            self.record(masked)
            rows = t.torch.ops.aten.all.dim(masked, args[1], True)
            self.record(rows)
            del masked, rows
        return out

    def record(self, out: Any) -> None:
        """Count an op's outputs, then note every device's total (one timeline point per op)."""
        t = _torch()
        if isinstance(out, t.Tensor):
            self._track(t.act, out)
        elif isinstance(out, tuple | list):
            for item in out:
                if isinstance(item, t.Tensor):
                    self._track(t.act, item)
        self.timeline.append(tuple(self.totals))
        if len(self.timeline) % CHECK_EVERY == 0:
            if self.max_ops is not None and len(self.timeline) > self.max_ops:
                raise TooManyOps(self.max_ops)
            stop = getattr(_interrupt, "stop", None)
            if stop is not None and stop():
                raise Interrupted


@cache
def _tracker_class() -> type:
    from torch.distributed._tools.mem_tracker import (
        MemTracker,  # lazy: import nbhw and %load_ext nbhw stay free of torch
    )

    return type("Tracker", (_Lean, MemTracker), {"__module__": __name__})


def tracker(devices: Sequence[Hashable] = ("",), max_ops: int | None = None) -> Any:
    """A new tracker (a TorchDispatchMode): ``with it:`` every op's outputs are counted on ``devices[it.now]``."""
    return _tracker_class()(devices, max_ops)


# ----------------------------------------------------------------------------------------------- placement


def execution_device(device_map: Mapping[str, Hashable]) -> Hashable:
    """Where accelerate runs modules kept on cpu / disk: the first device that is neither (dispatch_model's rule)."""
    running = {d for d in device_map.values() if d not in OFFLOADED}
    return next(iter(running)) if running else "cpu"  # set order, as accelerate takes it


class _Placed:
    """Module hooks that move the tracker's device as accelerate's AlignDevicesHook moves the work."""

    def __init__(self, track: Any, device_map: dict[str, Hashable]) -> None:
        self.track = track
        self.main = execution_device(device_map)
        self.device_map = device_map
        self.onloaded: dict[int, list[Any]] = {}

    def runs_on(self, entry: str) -> Hashable:
        device = self.device_map[entry]
        return self.main if device in OFFLOADED else device

    def before(self, entry: str) -> Callable[..., Any]:
        def hook(module: Any, args: Any, kwargs: Any) -> Any:
            device = self.runs_on(entry)
            self.track.now = self.track.index(device)
            if self.device_map[entry] in OFFLOADED and device not in OFFLOADED:
                # Offloaded weights are copied to the execution device for the module's forward, then dropped.
                t = _torch().torch
                self.onloaded[id(module)] = [t.empty_like(p) for p in module.parameters()]
            return self.moved(args, device), self.moved(kwargs, device)

        return hook

    def after(self, module: Any, args: Any, output: Any) -> None:
        self.onloaded.pop(id(module), None)
        # The tracker's device stays this entry's: the parent's own ops that follow (a norm, a mask) run there.

    def moved(self, value: Any, device: Hashable) -> Any:
        """``value`` with each tensor counted elsewhere copied to ``device`` (accelerate's send_to_device)."""
        t = _torch()
        if isinstance(value, t.Tensor):
            where = self.track.device_of(value)
            return value if where is None or where == device else value.clone()
        if type(value) in (tuple, list):  # plain ones: a named tuple or a list subclass is left as it is
            items = [self.moved(v, device) for v in value]
            if all(a is b for a, b in zip(items, value, strict=True)):
                return value
            return type(value)(items)
        if isinstance(value, dict):
            found = {k: self.moved(v, device) for k, v in value.items()}
            if all(found[k] is v for k, v in value.items()):
                return value
            out = copy.copy(value)  # a ModelOutput stays one (encoder outputs are read by index)
            for k, v in found.items():
                out[k] = v
            return out
        return value  # a cache object is skipped, as transformers' _skip_keys_device_placement makes it


@contextlib.contextmanager
def placed(model: Any, device_map: dict[str, Hashable], track: Any) -> Iterator[Hashable]:
    """While the block runs, ``track`` counts each allocation on the device its module would run on; yields the
    device the inputs go to (the first weight's, as generate() moves inputs to ``model.device``). A device_map of
    one device needs no hooks."""
    hooks = _Placed(track, device_map)
    handles = []
    modules = dict(model.named_modules()) if len(set(device_map.values())) > 1 else {}
    for entry in device_map:
        module = modules.get(entry)
        if module is None:
            continue  # an entry naming a single tensor: counted with its weights, runs with its parent
        handles.append(module.register_forward_pre_hook(hooks.before(entry), with_kwargs=True))
        handles.append(module.register_forward_hook(hooks.after))
    try:
        yield hooks.runs_on(next(iter(device_map)))
    finally:
        for handle in handles:
            handle.remove()


def device_of_module(name: str, device_map: dict[str, Hashable]) -> Hashable:
    """Where a module's tensors go: the device_map entry with the longest prefix of its name, as accelerate reads it."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        key = ".".join(parts[:end])
        if key in device_map:
            return device_map[key]
    return device_map.get("", next(iter(device_map.values())))


def track_weights(track: Any, model: Any, device_map: dict[str, Hashable]) -> None:
    """Count every parameter and buffer on the device the device_map gives it (a tied weight once, where first)."""
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        track.track_on(device_of_module(name, device_map), tensor)


# ----------------------------------------------------------------------------------------------- held bytes


def _storage_key(tensor: torch.Tensor) -> int:
    return int(tensor.untyped_storage()._cdata)


# Storages that stand in for memory a dry run can't hold on the meta device (a copy in host memory): storage key ->
# (the device counted, the bytes they stand for). Registered by :func:`stand_in`, dropped when the tensor is freed.
_ELSEWHERE: dict[int, tuple[Hashable, int]] = {}


def stand_in(track: Any, tensor: torch.Tensor, device: Hashable, nbytes: int) -> None:
    """Count ``tensor`` (a stand-in of a few bytes, made outside the tracker) as ``nbytes`` on ``device`` while it
    lives: in the tracker's totals, in :func:`storage_bytes` and in :func:`bytes_by_device`."""
    key, index = _storage_key(tensor), track.index(device)
    _ELSEWHERE[key] = (device, nbytes)
    track.totals[index] += nbytes

    def freed() -> None:
        _ELSEWHERE.pop(key, None)
        track.totals[index] -= nbytes

    weakref.finalize(tensor, freed)


def stood_in(tensor: torch.Tensor) -> tuple[Hashable, int] | None:
    """The device and bytes a stand-in counts for (None: an ordinary tensor)."""
    return _ELSEWHERE.get(_storage_key(tensor)) if _ELSEWHERE else None


def _nbytes(tensor: torch.Tensor) -> int:
    found = stood_in(tensor)
    return tensor.untyped_storage().nbytes() if found is None else found[1]


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    return sum({_storage_key(t): _nbytes(t) for t in tensors}.values())


def tensors_of(obj: Any) -> list[torch.Tensor]:
    """Every tensor reachable from ``obj`` through attributes, lists, tuples and dicts (not into modules)."""
    return list(_tensors(obj, set(), _torch()))


def _tensors(obj: Any, seen: set[int], t: SimpleNamespace) -> Iterator[torch.Tensor]:
    if id(obj) in seen or obj is None or isinstance(obj, (*t.scalars, type)):
        return
    seen.add(id(obj))
    if isinstance(obj, t.Tensor) and type(obj) is not t.Tensor and hasattr(obj, "__tensor_flatten__"):
        # A wrapper subclass (optimum-quanto's quantized tensors) keeps its bytes in the inner tensors it names.
        names, _ = obj.__tensor_flatten__()
        for name in names:
            yield from _tensors(getattr(obj, name), seen, t)
    elif isinstance(obj, t.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value, seen, t)
    elif isinstance(obj, list | tuple | set):
        for value in obj:
            yield from _tensors(value, seen, t)
    elif hasattr(obj, "__dict__") and not isinstance(obj, t.torch.nn.Module):
        for value in vars(obj).values():
            yield from _tensors(value, seen, t)


def bytes_by_device(track: Any, obj: Any) -> dict[Hashable, int]:
    """The storages ``obj`` holds, by the device the tracker counted each on."""
    found: dict[Hashable, dict[int, int]] = {}
    for tensor in tensors_of(obj):
        elsewhere = stood_in(tensor)
        device = track.device_of(tensor) if elsewhere is None else elsewhere[0]
        found.setdefault(device, {})[_storage_key(tensor)] = _nbytes(tensor)
    return {device: sum(sizes.values()) for device, sizes in found.items()}


# ----------------------------------------------------------------------------------------------- meta-kernel memo


class _NotCacheable(Exception):
    pass


# Memoised meta kernels: an op's fresh outputs are fixed by its inputs' shapes, strides and dtypes. Most elementwise
# ops have Python meta kernels (torch._refs, ~0.2 ms each) and an 80-layer model repeats the same few hundred
# (op, shapes) pairs 80 times. Like FakeTensor's dispatch cache, only ops that return new storage are memoised (no
# views, no in-place or out= ops, no data-dependent shapes), and a hit returns new meta tensors of the recorded
# shape, stride and dtype, so every output still has its own storage for the tracker. Process-wide on purpose.
_MEMO: PlannerDict[Any, tuple[tuple[Any, ...], bool] | None] = PlannerDict()
_DECIDED: PlannerDict[Any, bool] = PlannerDict()
MEMO_ENTRIES = 100_000


def _meta_kernel(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    t = _torch()
    if not _cacheable(func, t):
        return func(*args, **kwargs)
    try:
        key = (func, _key(args, t), _key(kwargs, t) if kwargs else None)
    except _NotCacheable:
        return func(*args, **kwargs)
    if key in _MEMO:
        entry = _MEMO[key]
        if entry is None:
            return func(*args, **kwargs)
        specs, single = entry
        made = tuple(t.torch.empty_strided(size, stride, dtype=dtype, device="meta") for size, stride, dtype in specs)
        return made[0] if single else made
    out = func(*args, **kwargs)
    if len(_MEMO) > MEMO_ENTRIES:
        _MEMO.clear()
    _MEMO[key] = _entry(out, args, kwargs, t)
    return out


def _cacheable(func: Any, t: SimpleNamespace) -> bool:
    found = _DECIDED.get(func)
    if found is None:
        schema = getattr(func, "_schema", None)
        found = not (
            schema is None
            or not isinstance(func, t.overload)
            or func.is_view
            or schema.is_mutable
            or any(r.alias_info is not None for r in schema.returns)
            or set(getattr(func, "tags", ())) & t.uncacheable
        )
        _DECIDED[func] = found
    return found


def _key(value: Any, t: SimpleNamespace) -> Any:
    """A hashable description of an op argument: tensors by metadata only (meta tensors have no values)."""
    if isinstance(value, t.Tensor):
        if value.device.type != "meta":
            raise _NotCacheable
        return (value.shape, value.stride(), value.dtype, value.storage_offset())
    if isinstance(value, list | tuple):
        return tuple([_key(v, t) for v in value])
    if value is None:
        return None
    if isinstance(value, t.scalars):
        return (type(value), value)
    if isinstance(value, dict):
        return tuple([(k, _key(v, t)) for k, v in sorted(value.items())])
    raise _NotCacheable


def _entry(out: Any, args: Any, kwargs: Any, t: SimpleNamespace) -> tuple[tuple[Any, ...], bool] | None:
    """What a memo hit must rebuild, or None when the outputs are not plain fresh meta tensors."""
    single = isinstance(out, t.Tensor)
    outs = (out,) if single else out
    if not isinstance(outs, tuple) or not outs or not all(isinstance(x, t.Tensor) for x in outs):
        return None
    inputs = {_storage_key(x) for x in tensors_of((args, kwargs))}
    specs = []
    for x in outs:
        if x.device.type != "meta" or _storage_key(x) in inputs or x.storage_offset() != 0:
            return None
        rebuilt = t.torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        if rebuilt.untyped_storage().nbytes() != x.untyped_storage().nbytes():
            return None
        specs.append((tuple(x.shape), x.stride(), x.dtype))
    if len({_storage_key(x) for x in outs}) != len(outs):
        return None
    return tuple(specs), single


# ----------------------------------------------------------------------------------------------- attention


@dataclass(frozen=True)
class _Sdpa:
    """One scaled_dot_product_attention call, by F.scaled_dot_product_attention's own parameter names."""

    q: Any
    k: Any
    v: Any
    attn_mask: Any = None
    dropout_p: float = 0.0
    is_causal: bool = False
    scale: Any = None
    enable_gqa: bool = False

    @property
    def mask_kind(self) -> str:
        if self.attn_mask is None:
            return "none"
        return "bool" if self.attn_mask.dtype == _torch().torch.bool else "float"

    def shape_key(self) -> tuple[Any, ...]:
        """What torch's selector looks at, without the lengths (stand-ins are 2 tokens long). Dropout counts: in
        training (GPT-2's attn_pdrop) CPU flash refuses it and the math path saves its dropout mask."""
        q, k, v = self.q, self.k, self.v
        return (q.dtype, q.shape[-1], v.shape[-1], q.shape[-3], k.shape[-3], self.mask_kind, bool(self.is_causal),
                bool(self.enable_gqa), float(self.dropout_p))  # fmt: skip


@lru_cache(maxsize=256)
def _cpu_choice(key: tuple[Any, ...]) -> int:
    """torch's CPU SDPA kernel choice (0 math, 1 flash) for inputs like these, asked with 2-token stand-ins."""
    torch = _torch().torch
    dtype, head_dim, value_dim, heads, kv_heads, mask, causal, gqa, dropout = key
    with torch.utils._python_dispatch._disable_current_modes():  # the stand-ins are not part of the run measured
        q = torch.empty(1, heads, 2, head_dim, dtype=dtype)
        k = torch.empty(1, kv_heads, 2, head_dim, dtype=dtype)
        v = torch.empty(1, kv_heads, 2, value_dim, dtype=dtype)
        m = None if mask == "none" else torch.empty(1, 1, 2, 2, dtype=torch.bool if mask == "bool" else dtype)
        return int(torch._fused_sdp_choice(q, k, v, m, dropout, causal, scale=None, enable_gqa=gqa))


def _cuda_kernel(call: _Sdpa) -> str:
    """The kernel torch's CUDA selector picks, by its documented constraints (it needs CUDA tensors to be asked).

    Flash: float16/bfloat16, one head dim <= 256 for q, k and v, no explicit mask; takes GQA as is.
    Memory-efficient: any mask, float32 too, different value dim, but equal head counts. Otherwise math. Only the
    memory shape matters: both fused kernels keep the output and a float32 log-sum-exp per query.
    """
    torch = _torch().torch
    q, k, v = call.q, call.k, call.v
    same_dims = q.shape[-1] == k.shape[-1] == v.shape[-1]
    if q.dtype in (torch.float16, torch.bfloat16) and same_dims and q.shape[-1] <= 256 and call.attn_mask is None:
        return "cuda_flash"
    if not (call.enable_gqa and k.shape[-3] != q.shape[-3]):
        return "cuda_efficient"
    return "math"


def _fused(kernel: str, call: _Sdpa) -> Any:
    aten = _torch().torch.ops.aten
    mask = call.attn_mask
    if mask is not None and mask.dtype == _torch().torch.bool:
        # SDPA turns a boolean mask into an additive one of the query's dtype before any fused kernel runs.
        mask = _torch().torch.empty_like(mask, dtype=call.q.dtype)
    q, k, v, p, causal = call.q, call.k, call.v, call.dropout_p, call.is_causal
    if kernel == "cpu_flash":  # takes GQA (fewer K/V heads) as is
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, p, causal, attn_mask=mask, scale=call.scale)[0]
    if kernel == "cuda_flash":
        return aten._scaled_dot_product_flash_attention(q, k, v, p, causal, False, scale=call.scale)[0]
    return aten._scaled_dot_product_efficient_attention(q, k, v, mask, False, p, causal, scale=call.scale)[0]


@cache
def _grouped_mm_on_meta() -> Any:
    """grouped_mm on meta for a dtype its meta registration refuses: the output of transformers' own fallback op
    (its fake kernel), under the autograd rule of torch's own grouped_mm (``GroupedMmBackward0``), which keeps the
    input only when the expert weights take a gradient and the weights only when the input does. The fallback's
    own rule keeps both and makes a gradient for frozen experts in backward: LoRA on the attention of an MoE model
    read 11-13 % over the real CPU step with it."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    class GroupedMmOnMeta(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, input: Any, weight: Any, offs: Any) -> Any:
            wants_input, wants_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            ctx.save_for_backward(input if wants_weight else None, weight if wants_input else None)
            ctx.shapes = (input.shape, weight.shape)
            return torch.ops.transformers.grouped_mm_fallback(input, weight, offs=offs)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            (input_shape, weight_shape), kept = ctx.shapes, ctx.saved_tensors  # kept: held until here
            grads = [
                torch.empty(shape, dtype=grad.dtype, device=grad.device) if wanted else None
                for shape, wanted in zip((input_shape, weight_shape), ctx.needs_input_grad[:2], strict=True)
            ]
            del kept
            return grads[0], grads[1], None

    return GroupedMmOnMeta


class _Routing:
    """The methods of :func:`attention_as_on`'s mode (a TorchFunctionMode, made on first use)."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target
        self.routed: dict[str, int] = {}

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Any = (), kwargs: Any = None) -> Any:
        t = _torch()
        kwargs = kwargs or {}
        if func is t.sdpa and _on_meta(args, t):
            call = _Sdpa(*args, **kwargs)
            kernel = self._kernel(call)
            self._count(kernel)
            if kernel != "math":
                return _fused(kernel, call)
        elif (
            func in t.grouped_mm
            and _on_meta(args, t)
            and args[0].dtype != t.torch.bfloat16
            and kwargs.get("offs") is not None
        ):
            # grouped_mm's meta registration applies CUDA's bfloat16-only check; the CPU kernel (torch >= 2.9) takes
            # any float dtype. The output is (rows, out_features) either way, which is exactly the fake / meta
            # implementation of transformers' own fallback op.
            self._count("grouped_mm_as_fallback")
            return _grouped_mm_on_meta().apply(args[0], args[1], kwargs["offs"])
        return func(*args, **kwargs)

    def _count(self, what: str) -> None:
        self.routed[what] = self.routed.get(what, 0) + 1

    def _kernel(self, call: _Sdpa) -> str:
        if self.target == "cpu":
            return "cpu_flash" if _cpu_choice(call.shape_key()) == 1 else "math"
        if self.target == "cuda":
            return _cuda_kernel(call)
        return "math"


def _on_meta(args: Any, t: SimpleNamespace) -> bool:
    return bool(args) and isinstance(args[0], t.Tensor) and args[0].device.type == "meta"


@cache
def _routing_class() -> type:
    from torch.overrides import TorchFunctionMode  # lazy: import nbhw and %load_ext nbhw stay free of torch

    return type("AttentionAsOn", (_Routing, TorchFunctionMode), {"__module__": __name__})


@contextlib.contextmanager
def attention_as_on(target: str) -> Iterator[Any]:
    """Within the block, meta-device SDPA sizes its work as on ``target`` ("cpu", "cuda", or "math"); yields the
    mode, whose ``routed`` counts the kernels it sized each call with."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, not {target!r}")
    with _routing_class()(target) as mode:
        yield mode
