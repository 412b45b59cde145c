"""What an object keeps alive: the tensor storages reachable from it, directly and through autograd graphs.

The walker behind ``nbhw.holders()``; torch is never imported here (the front end hands in the module the user
imported). How it counts:

- The unit is a storage (the memory block a tensor views), keyed by its device and data pointer (in one int:
  :func:`key_of`, :func:`where`), counted with its full ``nbytes``: a small view keeps its whole storage alive, so
  that is what freeing it would return.
- A tensor's ``grad_fn`` graph is walked as a graph (its saved tensors, AccumulateGrad's leaf, a custom Function's
  ctx attributes), once for all the roots that share it. Saved tensors are read with ``SavedTensor.data``, which
  never runs unpack hooks (those could copy to the device or recompute a checkpointed forward).
- Modules, classes, code, a function's globals, a frame's ``f_back``/``f_globals`` and the logging tree are not
  followed: they hold the whole program, not the data a variable keeps alive.
- :meth:`Walker.find_all` finds every live Python tensor without the holders (one pass over the gc heap), so that
  what no holder explains is counted, never hidden.
"""

from __future__ import annotations
import __future__

import gc
import logging
import time
import types
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Collection, Iterator, Sequence
from functools import partial
from itertools import chain, compress, repeat
from operator import is_not, not_
from typing import Any

from nbhw.core.render import size

MAX_VISITS = 3_000_000  # a walk that reaches this many objects stops and says so (never a silent partial answer)

# Objects whose references are not followed: they hold the whole program (a module's globals, a class's
# subclasses and MRO, a function's globals, the logging tree: every logger of the process, their handlers and
# streams; a `from __future__` feature) rather than data that a variable keeps alive.
OPAQUE: frozenset[type] = frozenset(
    {
        types.ModuleType,
        logging.Logger,
        logging.RootLogger,
        logging.Manager,
        logging.PlaceHolder,
        type(__future__.annotations),
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

# A storage, as one int: its data pointer and its device's number (ints hash and compare in a step; with a (device,
# pointer) tuple per tensor, reading 10,000 tensors took 22 ms against 12 ms). Numbers are per process, in order.
Key = int
_DEVICE_BITS = 16
_DEVICE_MASK = (1 << _DEVICE_BITS) - 1
_DEVICES: list[str] = [""]  # number -> device name; 0: no memory of its own (meta)
_NUMBERS: dict[str, int] = {"": 0}


def key_of(device: str, data_ptr: int) -> Key:
    """The key of the storage at ``data_ptr`` on ``device`` ('cpu', 'cuda:0')."""
    return _pack(data_ptr, _number(device))


def _pack(data_ptr: int, number: int) -> Key:
    return data_ptr << _DEVICE_BITS | number  # Walker._read writes this inline: a call per tensor less


def _number(device: str) -> int:
    number = _NUMBERS.get(device)
    if number is None:
        if len(_DEVICES) >= 1 << _DEVICE_BITS:
            raise WalkStopped(f"more than {len(_DEVICES):,} devices")
        number = _NUMBERS[device] = len(_DEVICES)
        _DEVICES.append(device)
    return number


def device_of(key: Key) -> str:
    return _DEVICES[key & _DEVICE_MASK]


def on_device(keys: set[Key], device: str) -> set[Key]:
    """The keys of the storages on ``device``."""
    number = _NUMBERS.get(device)
    if number is None:
        return set()
    return {k for k in keys if k & _DEVICE_MASK == number}


def where(key: Key) -> tuple[str, int]:
    """(device, data pointer) of a storage key."""
    return device_of(key), key >> _DEVICE_BITS


class WalkStopped(Exception):
    """A walk reached its object or time limit; the message says which."""


class _Reached:
    """What a walk has reached so far: storages, the next objects to walk, grad_fn nodes (walked as graphs)."""

    __slots__ = ("frontier", "keys", "nodes")

    def __init__(self, keys: set[Key], frontier: list[object], nodes: list[object]) -> None:
        self.keys, self.frontier, self.nodes = keys, frontier, nodes


def _as_keys(known: Key | tuple[Key, ...]) -> tuple[Key, ...]:
    """A read tensor's storages as a tuple (one storage is kept as its key alone)."""
    return (known,) if isinstance(known, int) else known


def may_hold(value: object) -> bool:
    """Whether a value can keep a tensor alive: untracked objects (str, int, a dict of ints) cannot."""
    return gc.is_tracked(value) and not isinstance(value, (type, types.ModuleType)) and type(value) not in OPAQUE


class Walker:
    """Finds the storages reachable from roots, directly and through autograd graphs; one per ``holders()``.

    Each tensor is read once per walk, however many roots reach it, every attribute in one visit (the cost is
    memory, not the interpreter); everything else is done a frontier at a time in C (map, compress, set operations).
    """

    def __init__(self, torch: Any, ignore: set[int], deadline: float | None = None) -> None:
        self.torch = torch
        self.deadline = deadline
        self.tensor_types = frozenset(_subclasses(torch.Tensor))
        self._metaclasses = frozenset(map(type, self.tensor_types))  # what a tensor's class is an instance of
        self.saved_tensor = torch._C._autograd.SavedTensor
        self.sizes: dict[Key, int] = {}
        self.devices: set[str] = set()  # the devices of the storages read (and of empty ones: never fewer)
        self.visited = 0
        # Per tensor read (by id; ``_held`` keeps each id from being reused while the walk runs): its storages,
        # and where it has one, its .grad and its grad_fn.
        self._keys_of: dict[int, Key | tuple[Key, ...]] = {}  # one storage: its key; none or several: a tuple
        self._inner: dict[int, Key | tuple[Key, ...]] = {}  # the same, of a tensor read for its storages only
        self._grad_of: dict[int, object] = {}
        self._fn_of: dict[int, object] = {}
        self._held: list[object] = []
        # What a root's value keeps alive, once walked: another root reaching the same object (a frame's ``self``, a
        # bound method's object) takes it from here instead of walking it again.
        self._closures: dict[int, tuple[set[Key], list[object]]] = {}
        # Where each walk's seen ids start: the ignored objects and the roots walked before (reaching one of these
        # is the exception, looked at only when a frontier has an id seen before).
        self._not_new: set[int] = set(ignore)
        self._plain = {torch.Tensor, torch.nn.Parameter}
        self._storage_of = torch.Tensor.untyped_storage
        self._nbytes = torch.UntypedStorage.nbytes
        self._data_ptr = torch.UntypedStorage.data_ptr
        self._device_numbers: dict[Any, int] = {}  # torch.device -> its number in keys (0: meta)
        self._saved_names: dict[type, tuple[str, ...]] = {}
        # Types not walked by gc.get_referents: tensors, opaque objects, functions, frames, autograd nodes.
        self._opaque: set[type] = set(OPAQUE)
        self._special: set[type] = {*self.tensor_types, *OPAQUE, types.FunctionType, types.FrameType}
        self._classified: set[type] = set(self._special)
        wrapper = getattr(torch.utils._python_dispatch, "is_traceable_wrapper_subclass", None)
        self._is_wrapper: Callable[[Any], bool] = wrapper or (lambda t: False)
        self._functorch = getattr(torch._C, "_functorch", None)

    # -- storages

    def storage_keys(self, tensor: Any) -> tuple[Key, ...]:
        """The storages a tensor's memory lives in (a wrapper subclass: its inner tensors'; meta: none)."""
        known = self._keys_of.get(id(tensor))
        if known is None:
            known = self._inner.get(id(tensor))
        if known is None:
            known = self._inner[id(tensor)] = self._read_keys(tensor)
            self._held.append(tensor)
        return _as_keys(known)

    def _read(self, tensors: list[Any], ids: list[int], reached: _Reached) -> None:
        """Tensors not read yet in this walk (``ids``: theirs, in order): their storages, .grad and grad_fn, each
        tensor touched once, every attribute in one visit; what they keep goes straight into ``reached``.

        The walk is bound by memory, not by the interpreter: a tensor's Python object, its TensorImpl and its storage
        lie apart in memory, and mapping one getter over the list per attribute reached for them six times (measured
        on a model's 10,800 tensors: a third more time than this loop).
        """
        self._held.extend(tensors)
        known, inner, read, plain = self._keys_of, self._inner, self._read_keys, self._plain
        storage_of, nbytes_of, ptr_of = self._storage_of, self._nbytes, self._data_ptr
        numbers, sizes = self._device_numbers, self.sizes
        fn_of, grad_of, frontier, nodes = self._fn_of, self._grad_of, reached.frontier, reached.nodes
        got: list[Key] = []  # one storage per tensor, almost always: into the keys at the end, in one call
        many: list[tuple[Key, ...]] = []
        for tensor, tid in zip(tensors, ids, strict=True):
            found = inner.get(tid) if inner else None  # read before for its storages only (a wrapper's inner)
            if found is None:
                if type(tensor) in plain:  # a plain tensor (torch.Tensor, nn.Parameter), read here
                    try:
                        storage = storage_of(tensor)
                    except (RuntimeError, NotImplementedError):
                        storage = None  # sparse, a vmap level
                    number = None if storage is None else numbers.get(storage.device)
                    nbytes = nbytes_of(storage) if number else 0
                    if nbytes:
                        key: Key = ptr_of(storage) << _DEVICE_BITS | number  # _pack, inline
                        if nbytes > sizes.setdefault(key, nbytes):  # the largest seen (views of one storage)
                            sizes[key] = nbytes
                        found = key
                    elif number:
                        found = ()  # an empty storage
                    else:  # unknown device, meta, or no storage of its own
                        found = read(tensor)
                else:
                    found = read(tensor)
                known[tid] = found
            if isinstance(found, int):
                got.append(found)
            elif found:
                many.append(found)
            fn = tensor.grad_fn
            if fn is None:
                grad = tensor._grad  # a leaf: its .grad
            else:
                fn_of[tid] = fn
                nodes.append(fn)
                grad = tensor._grad if tensor.retains_grad else None  # any other warns when asked for it
            if grad is not None:
                grad_of[tid] = grad
                frontier.append(grad)
        reached.keys.update(got)
        if many:
            reached.keys.update(chain.from_iterable(many))

    def _read_keys(self, tensor: Any) -> Key | tuple[Key, ...]:
        """One tensor's storages: its own (a plain tensor), a wrapper subclass's inner tensors', a sparse tensor's
        parts', the tensor a vmap level wraps; none for an empty storage or a meta one."""
        plain = type(tensor) in self._plain
        if not plain and self._is_wrapper(tensor):
            attrs, _ = tensor.__tensor_flatten__()
            # The inner tensors only: a subclass may name other attributes (a DTensor made under fake mode: its mesh).
            inner = [getattr(tensor, a, None) for a in attrs]
            return tuple(k for t in inner if isinstance(t, self.torch.Tensor) for k in self.storage_keys(t))
        try:
            # The first call makes the storage's Python object (about 8 µs); torch keeps it, later calls are cheap.
            storage = self._storage_of(tensor) if plain else tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            if self._functorch is not None and self._functorch.is_batchedtensor(tensor):
                # A tensor of a vmap level (one kept past its vmap call, in a closure or a traceback): the memory is
                # the tensor it wraps, which may have no Python object of its own.
                return self.storage_keys(self._functorch.get_unwrapped(tensor))
            return tuple(k for part in _sparse_parts(tensor) for k in self.storage_keys(part))
        nbytes = self._nbytes(storage)
        device = storage.device  # the storage's, not the tensor's: a FakeTensor says cuda and lives on meta
        number = self._device_numbers.get(device)
        if number is None:
            name = "" if device.type == "meta" else str(device)
            number = self._device_numbers[device] = _number(name)
            if number:
                self.devices.add(name)
        if nbytes == 0 or not number:
            return ()
        key = _pack(self._data_ptr(storage), number)
        if nbytes > self.sizes.setdefault(key, nbytes):  # the largest seen for its address (views of one storage)
            self.sizes[key] = nbytes
        return key

    def examples(self, keys: Collection[Key]) -> dict[Key, str]:
        """Storages described for people: 'float64[777] 6.1 KiB' (a tensor that views each, found in one pass)."""
        wanted, found = set(keys), {}
        known, inner = self._keys_of, self._inner
        tensor: Any
        for tensor in self._held:
            got = known.get(id(tensor), inner.get(id(tensor)))  # None: not a tensor
            for key in () if got is None else _as_keys(got):
                if key in wanted and key not in found:
                    dtype = str(tensor.dtype).removeprefix("torch.")
                    found[key] = f"{dtype}{list(tensor.shape)} {size(self.sizes[key])}"
        return found

    def find_all(self) -> set[Key]:
        """Every storage of a live Python tensor, found without the holders: one pass over the gc heap.

        Every tensor refers to its class (CPython: an instance of a class defined in Python visits its type), so
        gc.get_referrers(*tensor classes) is that pass, in C, with no list of the whole heap: measured 1.3x one
        gc.get_objects() with 14 tensor classes and 237,000 objects, where gc.get_objects() and a filter by type cost
        2.3x. Its cost grows with the program's objects and with the number of tensor classes, not with the tensors.
        """
        types_ = self.tensor_types
        found = [o for o in gc.get_referrers(*types_) if type(o) in types_]
        reached = _Reached(set(), [], [])
        # Read with their grad_fn and .grad: the walk that follows touches none of them again.
        self._tensors_reached(found, list(map(id, found)), reached)
        return reached.keys

    # -- one root

    def reach(self, values: Sequence[object]) -> tuple[set[Key], list[object]]:
        """(storages reached directly, the grad_fn nodes of the tensors reached) from these values."""
        direct: set[Key] = set()
        nodes: list[object] = []
        self._walk(list(values), direct, nodes, self._seen())
        if len(values) == 1:
            self._closures[id(values[0])] = (direct, nodes)
            self._not_new.add(id(values[0]))
        return direct, nodes

    def _seen(self) -> set[int]:
        """A walk's seen ids at its start (the walker holds the objects it walked: an id is never reused meanwhile)."""
        return self._not_new.copy()

    def _walk(self, frontier: list[object], keys: set[Key], nodes: list[object], seen: set[int]) -> None:
        """Breadth first, a whole frontier at a time; every per-object pass runs in C (map, zip, compress, sets):
        gc.get_referents(*objects) gives the next frontier, gc.is_tracked drops what cannot hold a tensor.

        Tensors take their own path (a list of 10,000 tensors is one frontier): read once, never classified again.
        """
        tensor_types = self.tensor_types
        while frontier:
            is_tensor = list(map(tensor_types.__contains__, map(type, frontier)))
            if any(is_tensor):
                ids, tensors = self._fresh(list(compress(frontier, is_tensor)), seen, keys, nodes)
                _, objects = self._fresh(list(compress(frontier, map(not_, is_tensor))), seen, keys, nodes)
            else:
                ids, tensors = [], []
                _, objects = self._fresh(frontier, seen, keys, nodes)
            self.visited += len(tensors) + len(objects)
            if self.visited > MAX_VISITS:
                raise WalkStopped(f"more than {MAX_VISITS:,} objects")
            if self.deadline is not None and time.perf_counter() > self.deadline:
                raise WalkStopped("out of time")
            frontier = self._objects_reached(objects, keys, nodes) if objects else []
            if tensors:
                frontier += self._tensor_referents(tensors)
                self._tensors_reached(tensors, ids, _Reached(keys, frontier, nodes))

    def _fresh(
        self, objects: list[object], seen: set[int], keys: set[Key], nodes: list[object]
    ) -> tuple[list[int], list[object]]:
        """(ids, objects) of the objects not seen yet in this walk, each once; a root's value walked before adds what
        it keeps instead."""
        if not objects:
            return [], objects
        ids = list(map(id, objects))
        if seen.isdisjoint(ids):  # the common case: two passes over the ids
            before = len(seen)
            seen.update(ids)
            if len(seen) - before == len(ids):
                return ids, objects
            once = dict(zip(ids, objects, strict=True))  # an object twice in the frontier (a config modules share)
        else:
            if self._closures:
                for i in self._closures.keys() & ids:  # walked before as a root: what it keeps is known
                    keys |= self._closures[i][0]
                    nodes += self._closures[i][1]
            is_new = list(map(not_, map(seen.__contains__, ids)))
            once = dict(zip(compress(ids, is_new), compress(objects, is_new), strict=True))
            seen.update(once)
        return list(once), list(once.values())

    def _referents(self, objects: list[object]) -> list[object]:
        """What the objects refer to that could hold a tensor (one C call for all of them).

        An empty builtin container holds nothing (nn.Module keeps about a dozen empty hook dicts per module); a class
        or a module is not followed (every tensor refers to its class).
        """
        return self._followed(gc.get_referents(*objects))

    def _followed(self, referents: list[object]) -> list[object]:
        # One pass, each object touched once: the walk is bound by memory, not by the interpreter (measured: five
        # C passes over a model's referents cost four times this comprehension).
        drop = self._opaque
        tracked = filter(gc.is_tracked, referents)
        return [o for o in tracked if type(o) not in drop and (type(o) not in _CONTAINERS or o)]

    def _tensor_referents(self, tensors: list[object]) -> list[object]:
        """What tensors refer to besides their class: a __dict__, hooks (most tensors have neither)."""
        found = gc.get_referents(*tensors)
        return [] if self._metaclasses.issuperset(map(type, found)) else self._followed(found)

    def _objects_reached(self, fresh: list[object], keys: set[Key], nodes: list[object]) -> list[object]:
        """The next frontier from objects other than tensors."""
        self._held.extend(fresh)  # a getter's fresh object (a frame's locals) keeps its id until the walk ends
        special, opaque = self._special, self._opaque
        kinds = list(map(type, fresh))
        for kind in set(kinds) - self._classified:
            self._classify(kind)
        is_special = list(map(special.__contains__, kinds))
        if not any(is_special):
            return self._referents(fresh)
        frontier = self._referents(list(compress(fresh, map(not_, is_special))))
        for obj in compress(fresh, is_special):
            if type(obj) in opaque:
                continue
            if isinstance(obj, types.FunctionType):
                frontier.extend(_function_parts(obj))  # closures and defaults, never its module's globals
            elif isinstance(obj, types.FrameType):
                frontier.extend(_frame_locals(obj))
            else:
                nodes.append(obj)  # a grad_fn node: walked as a graph, not as an object
        return frontier

    def _tensors_reached(self, tensors: list[Any], ids: list[int], reached: _Reached) -> None:
        """Their storages, grads and grad_fn nodes into ``reached`` (``ids``: the tensors', in order)."""
        linked = self._keys_of.keys()  # the tensors read, with their grad and grad_fn
        if linked.isdisjoint(ids):  # none read yet in this walk: the common case
            self._read(tensors, ids, reached)
            return
        is_read = list(map(linked.__contains__, ids))
        if not all(is_read):
            unread = list(map(not_, is_read))
            self._read(list(compress(tensors, unread)), list(compress(ids, unread)), reached)
            ids = list(compress(ids, is_read))
        found: list[Any] = list(map(self._keys_of.__getitem__, ids))  # a key, or a tuple of them
        one = list(map(isinstance, found, repeat(int)))
        reached.keys.update(compress(found, one))
        if not all(one):
            reached.keys.update(chain.from_iterable(compress(found, map(not_, one))))
        if self._grad_of:
            reached.frontier += filter(_is_something, map(self._grad_of.get, ids))
        if self._fn_of:
            reached.nodes += filter(_is_something, map(self._fn_of.get, ids))

    def _classify(self, kind: type) -> None:
        self._classified.add(kind)
        if issubclass(kind, (type, types.ModuleType)):
            self._opaque.add(kind)  # a class with a metaclass (ABCMeta, torch's _TensorMeta), a lazy module
            self._special.add(kind)
        elif hasattr(kind, "next_functions") and hasattr(kind, "register_hook"):
            self._special.add(kind)  # an autograd Node (C++ nodes have no Python base class to test)

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
        """Every node of the graphs once: its children, the storages it keeps, how many nodes point to it.

        A wave of nodes at a time: the tensors all of them saved are read in one batch.
        """
        children: dict[int, list[object]] = {}
        node_keys: dict[int, set[Key]] = {}
        indegree: dict[int, int] = {}
        nodes: dict[int, object] = {}
        wave = [n for group in entries for n in group]
        while wave:
            fresh = list({id(n): n for n in wave if id(n) not in nodes}.values())
            nodes.update(zip(map(id, fresh), fresh, strict=True))
            self.visited += len(fresh)
            kept = [self._kept_by(node) for node in fresh]
            simple = self._only_tensors(list(chain.from_iterable(kept)))
            wave = []
            for node, objects in zip(fresh, kept, strict=True):
                keys: set[Key] = set()
                found: list[object] = []
                if simple:
                    self._read_before(objects, keys, found)
                else:
                    self._walk(objects, keys, found, self._seen())  # the same object may hang off two nodes
                nexts = [nxt for nxt, _ in getattr(node, "next_functions", ()) if nxt is not None] + found
                children[id(node)], node_keys[id(node)] = nexts, keys
                for nxt in nexts:
                    indegree[id(nxt)] = indegree.get(id(nxt), 0) + 1
                wave += nexts
        return children, node_keys, indegree, nodes

    def _only_tensors(self, objects: list[object]) -> bool:
        """Whether these are plain tensors that keep nothing but their storages and grad_fn (no .grad, no __dict__,
        no hooks): then a node's storages are its tensors' own, read here in one batch for the whole wave."""
        plain = self._plain
        if not all(map(plain.__contains__, map(type, objects))):
            return False
        ids = list(map(id, objects))
        self._tensors_reached(objects, ids, _Reached(set(), [], []))
        return not self._tensor_referents(objects) and self._grad_of.keys().isdisjoint(ids)

    def _read_before(self, tensors: list[object], keys: set[Key], nodes: list[object]) -> None:
        """The storages and grad_fn nodes of a node's saved tensors, all read before with the wave's (a few per node:
        a loop costs less than a batch's passes)."""
        known, fn_of = self._keys_of, self._fn_of
        for tensor in tensors:
            found = known[id(tensor)]
            if isinstance(found, int):
                keys.add(found)
            else:
                keys.update(found)
            fn = fn_of.get(id(tensor))
            if fn is not None:
                nodes.append(fn)

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


_is_something = partial(is_not, None)  # in C: a filter that never asks an object for its truth (a tensor raises)


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
