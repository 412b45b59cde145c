"""What an object keeps alive: the tensor storages reachable from it, directly and through autograd graphs.

The walker behind ``nbhw.holders()``; torch is never imported here (the front end hands in the module the user
imported). How it counts:

- The unit is a storage (the memory block a tensor views), keyed by (device, data pointer), counted with its full
  ``nbytes``: a small view keeps its whole storage alive, so that is what freeing it would return.
- A tensor's ``grad_fn`` graph is walked as a graph (its saved tensors, AccumulateGrad's leaf, a custom Function's
  ctx attributes), once for all the roots that share it. Saved tensors are read with ``SavedTensor.data``, which
  never runs unpack hooks (those could copy to the device or recompute a checkpointed forward).
- Modules, classes, code, a function's globals and a frame's ``f_back``/``f_globals`` are not followed: they hold
  the whole program, not the data a variable keeps alive.
- :meth:`Walker.find_all` finds every live Python tensor without the holders (one pass over the gc heap), so that
  what no holder explains is counted, never hidden.
"""

from __future__ import annotations

import gc
import time
import types
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import compress
from operator import not_
from typing import Any

from nbhw.core.render import size

MAX_VISITS = 3_000_000  # a walk that reaches this many objects stops and says so (never a silent partial answer)

# Objects whose references are not followed: they hold the whole program (a module's globals, a class's
# subclasses and MRO, a function's globals) rather than data that a variable keeps alive.
OPAQUE: frozenset[type] = frozenset(
    {
        types.ModuleType,
        type,
        types.CodeType,
        types.BuiltinFunctionType,
        types.WrapperDescriptorType,
        types.MethodDescriptorType,
        types.GetSetDescriptorType,
        types.MemberDescriptorType,
        property,
        staticmethod,
        classmethod,
    }
)

# Builtin containers: an empty one holds nothing (nn.Module keeps about a dozen empty hook dicts per module).
_CONTAINERS: frozenset[type] = frozenset({dict, list, set, tuple, frozenset, OrderedDict, deque, defaultdict})

Key = tuple[str, int]  # (device, data pointer) of a storage


class WalkStopped(Exception):
    """A walk reached its object or time limit; the message says which."""


def may_hold(value: object) -> bool:
    """Whether a value can keep a tensor alive: untracked objects (str, int, a dict of ints) cannot."""
    return gc.is_tracked(value) and not isinstance(value, (type, types.ModuleType)) and type(value) not in OPAQUE


class Walker:
    """Finds the storages reachable from roots, directly and through autograd graphs; one per ``holders()``."""

    def __init__(self, torch: Any, ignore: set[int], deadline: float | None = None) -> None:
        self.torch = torch
        self.deadline = deadline
        self.tensor_types = frozenset(_subclasses(torch.Tensor))
        self.saved_tensor = torch._C._autograd.SavedTensor
        self.ignore = ignore
        self.sizes: dict[Key, int] = {}
        self.examples: dict[Key, Any] = {}  # a tensor of each storage, described only for what is shown
        self.visited = 0
        self._keys_of: dict[int, list[Key]] = {}  # a tensor reached from several roots is read once
        self._tensors: dict[int, tuple[list[Key], object | None, object | None]] = {}
        self._held: list[object] = []
        self._plain = {torch.Tensor, torch.nn.Parameter}
        self._device_names: dict[Any, str] = {}
        self._saved_names: dict[type, tuple[str, ...]] = {}
        # Types not walked by gc.get_referents: tensors, opaque objects, functions, frames, autograd nodes.
        self._opaque: set[type] = set(OPAQUE)
        self._special: set[type] = {*self.tensor_types, *OPAQUE, types.FunctionType, types.FrameType}
        self._classified: set[type] = set(self._special)
        wrapper = getattr(torch.utils._python_dispatch, "is_traceable_wrapper_subclass", None)
        self._is_wrapper: Callable[[Any], bool] = wrapper or (lambda t: False)
        self._functorch = getattr(torch._C, "_functorch", None)

    # -- storages

    def storage_keys(self, tensor: Any) -> list[Key]:
        """The storages a tensor's memory lives in (a wrapper subclass: its inner tensors'; meta: none)."""
        known = self._keys_of.get(id(tensor))
        if known is None:
            known = self._keys_of[id(tensor)] = self._read_keys(tensor)
            self._held.append(tensor)  # keeps its id from being reused while the walk runs
        return known

    def _read_keys(self, tensor: Any) -> list[Key]:
        if type(tensor) not in self._plain and self._is_wrapper(tensor):
            attrs, _ = tensor.__tensor_flatten__()
            # The inner tensors only: a subclass may name other attributes (a DTensor made under fake mode: its mesh).
            inner = [getattr(tensor, a, None) for a in attrs]
            return [k for t in inner if isinstance(t, self.torch.Tensor) for k in self.storage_keys(t)]
        try:
            # The first call makes the storage's Python object (about 8 µs); torch keeps it, later calls are cheap.
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            if self._functorch is not None and self._functorch.is_batchedtensor(tensor):
                # A tensor of a vmap level (one kept past its vmap call, in a closure or a traceback): the memory is
                # the tensor it wraps, which may have no Python object of its own.
                return self.storage_keys(self._functorch.get_unwrapped(tensor))
            return [k for part in _sparse_parts(tensor) for k in self.storage_keys(part)]
        nbytes = storage.nbytes()
        device = storage.device  # the storage's, not the tensor's: a FakeTensor says cuda and lives on meta
        name = self._device_names.get(device)
        if name is None:  # once per device: reading device.type for every tensor costs more than the lookup
            name = self._device_names[device] = "" if device.type == "meta" else str(device)
        if nbytes == 0 or not name:
            return []
        key = (name, storage.data_ptr())
        if nbytes > self.sizes.get(key, 0):
            self.sizes[key] = nbytes
            self.examples[key] = tensor
        return [key]

    def example(self, key: Key) -> str:
        """A storage described for people: 'float64[777] 6.1 KiB'."""
        tensor = self.examples[key]
        return f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)} {size(self.sizes[key])}"

    def find_all(self) -> set[Key]:
        """Every storage of a live Python tensor, found without the holders: one pass over the gc heap.

        (A list comprehension over gc.get_objects(): its cost grows with the program's objects, not its tensors;
        gc.get_referrers(*tensor types) costs as much and grows with the number of Tensor subclasses defined.)
        """
        types_ = self.tensor_types
        found = [o for o in gc.get_objects() if type(o) in types_]
        known, read = self._keys_of, self.storage_keys
        keys = {k for t in found for k in (known.get(id(t)) or read(t))}
        del found
        return keys

    # -- one root

    def reach(self, values: Iterable[object]) -> tuple[set[Key], list[object]]:
        """(storages reached directly, the grad_fn nodes of the tensors reached) from these values."""
        direct: set[Key] = set()
        seen: dict[int, object] = {}  # holds what it saw, so an id is never reused during the walk
        nodes: list[object] = []
        self._walk(list(values), direct, nodes, seen)
        return direct, nodes

    def _walk(self, frontier: list[object], keys: set[Key], nodes: list[object], seen: dict[int, object]) -> None:
        """Breadth first, a whole frontier at a time; every per-object pass runs in C (map, zip, compress, sets):
        gc.get_referents(*objects) gives the next frontier, gc.is_tracked drops what cannot hold a tensor."""
        tensor_types, special, opaque = self.tensor_types, self._special, self._opaque
        while frontier:
            batch = dict(zip(map(id, frontier), frontier, strict=True))
            fresh_ids = batch.keys() - seen.keys() - self.ignore
            if not fresh_ids:
                return
            fresh = list(map(batch.__getitem__, fresh_ids))
            seen.update(zip(fresh_ids, fresh, strict=True))
            self.visited += len(fresh)
            if self.visited > MAX_VISITS:
                raise WalkStopped(f"more than {MAX_VISITS:,} objects")
            if self.deadline is not None and time.perf_counter() > self.deadline:
                raise WalkStopped("out of time")
            kinds = list(map(type, fresh))
            for kind in set(kinds) - self._classified:
                self._classify(kind)
            is_special = list(map(special.__contains__, kinds))
            plain = list(compress(fresh, map(not_, is_special)))
            odd = [o for o in compress(fresh, is_special) if type(o) not in opaque]
            tensors = [o for o in odd if type(o) in tensor_types]
            # One C call for the whole frontier; a tensor's referents are its __dict__ and hooks (and its grad_fn,
            # which the classification sends to the graph walk).
            tracked = filter(gc.is_tracked, gc.get_referents(*plain, *tensors))
            # An empty builtin container holds nothing: nn.Module keeps about a dozen empty hook dicts per module.
            frontier = [o for o in tracked if type(o) not in _CONTAINERS or o]
            cache, read = self._tensors, self._read_tensor
            for tensor in tensors:  # inline: this loop runs once per tensor per root
                entry = cache.get(id(tensor))
                if entry is None:
                    entry = cache[id(tensor)] = read(tensor)
                    self._held.append(tensor)  # keeps its id from being reused while the walk runs
                keys.update(entry[0])
                if entry[1] is not None:
                    frontier.append(entry[1])
                if entry[2] is not None:
                    nodes.append(entry[2])
            for obj in odd:
                if type(obj) in tensor_types:
                    continue
                if isinstance(obj, types.FunctionType):
                    frontier.extend(_function_parts(obj))  # closures and defaults, never its module's globals
                elif isinstance(obj, types.FrameType):
                    frontier.extend(_frame_locals(obj))
                else:
                    nodes.append(obj)  # a grad_fn node: walked as a graph, not as an object

    def _classify(self, kind: type) -> None:
        self._classified.add(kind)
        if issubclass(kind, (type, types.ModuleType)):
            self._opaque.add(kind)  # a class with a metaclass (ABCMeta, torch's _TensorMeta), a lazy module
            self._special.add(kind)
        elif hasattr(kind, "next_functions") and hasattr(kind, "register_hook"):
            self._special.add(kind)  # an autograd Node (C++ nodes have no Python base class to test)

    def _read_tensor(self, tensor: Any) -> tuple[list[Key], object | None, object | None]:
        """(its storages, its .grad, its grad_fn), read once per walk."""
        grad_fn = tensor.grad_fn
        grad = None
        # A leaf is a tensor without grad_fn; .grad of any other tensor is None (and warns) unless it retains it.
        if grad_fn is None or tensor.retains_grad:
            grad = tensor._grad
        keys = self._keys_of.get(id(tensor))
        if keys is None:
            keys = self._keys_of[id(tensor)] = self._read_keys(tensor)
        return keys, grad, grad_fn

    # -- autograd graphs

    def graphs(self, entries: Sequence[list[object]]) -> dict[Key, int]:
        """Storage -> bitmask of the roots whose autograd graphs keep it (bit i: ``entries[i]``).

        One pass over the union of the graphs, however many roots share them (the frames of a failed training
        forward all hang off one graph): nodes are visited once, then each root's bit flows from its entry nodes
        to everything upstream in topological order.
        """
        children, node_keys, indegree, nodes = self._graph_nodes(entries)
        mask: dict[int, int] = dict.fromkeys(nodes, 0)
        for bit, group in enumerate(entries):
            for node in group:
                mask[id(node)] |= 1 << bit
        _propagate(mask, children, indegree)
        held: dict[Key, int] = {}
        for i, keys in node_keys.items():
            for key in keys:
                held[key] = held.get(key, 0) | mask[i]
        return held

    def _graph_nodes(
        self, entries: Sequence[list[object]]
    ) -> tuple[dict[int, list[object]], dict[int, set[Key]], dict[int, int], dict[int, object]]:
        """Every node of the graphs once: its children, the storages it keeps, how many nodes point to it."""
        children: dict[int, list[object]] = {}
        node_keys: dict[int, set[Key]] = {}
        indegree: dict[int, int] = {}
        nodes: dict[int, object] = {}
        stack = [n for group in entries for n in group]
        while stack:
            node = stack.pop()
            if id(node) in nodes:
                continue
            nodes[id(node)] = node
            self.visited += 1
            keys: set[Key] = set()
            found: list[object] = []
            self._walk(self._kept_by(node), keys, found, {})  # fresh seen: the same object may hang off two nodes
            nexts = [nxt for nxt, _ in getattr(node, "next_functions", ()) if nxt is not None] + found
            children[id(node)], node_keys[id(node)] = nexts, keys
            for nxt in nexts:
                indegree[id(nxt)] = indegree.get(id(nxt), 0) + 1
            stack.extend(nexts)
        return children, node_keys, indegree, nodes

    def _kept_by(self, node: object) -> list[object]:
        objects = self._saved(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad keeps its leaf alive
        if variable is not None:
            objects.append(variable)
        if hasattr(node, "__dict__"):
            objects.extend(vars(node).values())  # a custom autograd.Function's ctx attributes
        return objects

    def _saved(self, node: object) -> list[object]:
        names = self._saved_names.get(type(node))
        if names is None:
            # Every C++ node class exposes its saved tensors as _raw_saved_<name>, a Python Function node as
            # _raw_saved_tensors (nbhw.core.hf.private_names).
            names = tuple(n for n in dir(node) if n.startswith("_raw_saved_"))
            self._saved_names[type(node)] = names
        out: list[object] = []
        for name in names:
            try:
                raw = getattr(node, name)
            except RuntimeError:
                continue  # released by backward()
            for saved in raw if isinstance(raw, (tuple, list)) else (raw,):
                if isinstance(saved, self.saved_tensor):
                    data = saved.data  # the saved tensor, or what a pack hook returned: never unpacks
                    if data is not None:
                        out.append(data)
        return out


def _propagate(mask: dict[int, int], children: dict[int, list[object]], indegree: dict[int, int]) -> None:
    """Each node's mask flows to the nodes it points to, in Kahn's order (a node is final once all its parents are)."""
    ready = [i for i in mask if indegree.get(i, 0) == 0]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for nxt in children[i]:
            j = id(nxt)
            mask[j] |= mask[i]
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    if done < len(mask):  # a cycle (autograd graphs have none; a ctx could make one): relax until stable
        work = [i for i in mask if mask[i]]
        while work:
            i = work.pop()
            for nxt in children[i]:
                j = id(nxt)
                if mask[j] | mask[i] != mask[j]:
                    mask[j] |= mask[i]
                    work.append(j)


def _subclasses(cls: type) -> set[type]:
    found, stack = {cls}, [cls]
    while stack:
        sub: type
        for sub in stack.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                stack.append(sub)
    return found


def _function_parts(fn: types.FunctionType) -> list[object]:
    parts: list[object] = [c.cell_contents for c in fn.__closure__ or () if _cell_full(c)]
    parts += list(fn.__defaults__ or ())
    parts += list((fn.__kwdefaults__ or {}).values())
    parts += list(vars(fn).values())
    return parts


def _cell_full(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _frame_locals(frame: types.FrameType) -> Iterator[object]:
    # Never f_back or f_globals: a frame keeps its locals; its module's globals are the program, not its data.
    if frame.f_locals is not frame.f_globals:
        yield from frame.f_locals.values()


def _sparse_parts(tensor: Any) -> list[Any]:
    layout = str(tensor.layout)
    if layout == "torch.sparse_coo":
        return [tensor._indices(), tensor._values()]
    if layout in ("torch.sparse_csr", "torch.sparse_bsr"):
        return [tensor.crow_indices(), tensor.col_indices(), tensor.values()]
    if layout in ("torch.sparse_csc", "torch.sparse_bsc"):
        return [tensor.ccol_indices(), tensor.row_indices(), tensor.values()]
    return []
