"""A dry run with a few decoder layers, widened to the model's depth: the run planner's speed-up for deep models.

Each stretch of consecutive decoder layers that do the same work on the same device (same modules and parameters,
same ``layer_types`` entry, same device_map device) is recorded with five layers: the first, three middle ones and
the last. In the prefill and again in the decode step, the ops from one middle layer's start to the next one's form
a period; the two recorded periods must differ by a constant per device (what one more layer holds: its cache),
byte for byte at every op, or the run is made at full depth. The full-depth timeline is the recorded one with the
missing layers' periods inserted after the middle ones, each one step higher, and everything after them shifted;
the missing layers' weights are held from the start. The cache figures add the missing layers' cache layers, each
the size of a recorded middle one (checked equal). The periods come from the model's own layer list, so layers
that alternate (sliding / full, Gemma-3's 5:1, hybrids) make short stretches that are simply all recorded.

The few-layer model is built from a copy of the config with the kept layers' count and ``layer_types``, and used
only when its layers match the kept layers of the full model one for one (classes, parameters, dtypes).
"""

from __future__ import annotations

import copy
import operator
import threading
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from nbhw.core.hf import dryrun, meta_build
from nbhw.core.hf.depth import decoder_stack, layer_signature

RECORDED = 5  # layers recorded per stretch: first, three middle, last
_FIRST_MIDDLE = 1  # the middle layers' offsets in a recorded stretch: periods 1 -> 2 and 2 -> 3 are compared


@dataclass(frozen=True)
class Stretch:
    """Consecutive decoder layers that do the same work on one device."""

    first: int  # in the shallow model's layer list
    layers: int  # in the full model
    device: Hashable  # the device_map value its weights are on

    @property
    def kept(self) -> int:
        return min(self.layers, RECORDED)

    @property
    def copies(self) -> int:
        """Layers the widening adds: the full stretch less the recorded ones."""
        return self.layers - self.kept


@dataclass
class Shallow:
    """The few-layer model standing in for ``full`` on one device_map, and how to widen its figures."""

    model: Any
    device_map: dict[str, Hashable]
    stretches: list[Stretch]
    added_weights: dict[Hashable, int]  # the weights of the layers not recorded, by device
    kept_work: tuple[tuple[int, Any], ...]  # per recorded layer: its work (the first full layer like it) and type

    @property
    def layers(self) -> int:
        return sum(s.kept for s in self.stretches)


class NotRepeating(ValueError):
    """The recorded layers' periods do not repeat exactly: the run is made at full depth."""


# ----------------------------------------------------------------------------------------------- choosing

_MODELS: weakref.WeakKeyDictionary[Any, dict[tuple[int, ...], Any]] = weakref.WeakKeyDictionary()
_MODELS_LOCK = threading.Lock()


def _layer_types(model: Any) -> list[Any] | None:
    types = getattr(model.config.get_text_config(decoder=True), "layer_types", None)
    return list(types) if types else None


_SIGNATURES: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def _signatures(model: Any, layers: list[Any]) -> list[Any]:
    """Each decoder layer's signature (remembered per model: the model is read-only)."""
    with _MODELS_LOCK:
        found = _SIGNATURES.get(model)
    if found is None:
        found = [layer_signature(layer) for layer in layers]
        with _MODELS_LOCK:
            _SIGNATURES[model] = found
    return found


def _stretches(model: Any, prefix: str, layers: list[Any], device_map: dict[str, Hashable]) -> list[list[int]]:
    """The full model's layer indices, grouped into stretches of the same work on the same device."""
    types = _layer_types(model)
    if types is not None and len(types) != len(layers):
        return [[i] for i in range(len(layers))]
    groups: list[list[int]] = []
    last: Any = None
    for i, signature in enumerate(_signatures(model, layers)):
        kind = (signature, types[i] if types else None, dryrun.device_of_module(f"{prefix}.{i}", device_map))
        if groups and kind == last:
            groups[-1].append(i)
        else:
            groups.append([i])
        last = kind
    return groups


def shallow(
    model: Any, device_map: dict[str, Hashable], *, plain: bool, cast: Callable[[Any, Any], Any]
) -> Shallow | None:
    """The few-layer stand-in for ``model`` on ``device_map``; None when the full depth must run (nothing repeats
    long enough, an encoder-decoder or multimodal run (``plain`` False), a device_map inside a layer, or a few-layer
    build that does not match). ``cast(model, dtype)`` applies the dtype plan from_pretrained applies."""
    if not plain or getattr(model.config, "is_encoder_decoder", False):
        return None
    prefix, layers = decoder_stack(model)
    text = model.config.get_text_config(decoder=True)
    if not prefix or len(layers) != getattr(text, "num_hidden_layers", None):
        return None
    inside = [k for k in device_map if k.startswith(prefix + ".") and not k[len(prefix) + 1 :].isdigit()]
    groups = _stretches(model, prefix, layers, device_map)
    if inside or all(len(g) <= RECORDED + 1 for g in groups):
        return None
    kept = tuple(i for g in groups for i in g[:RECORDED])
    small = _small_model(model, kept, layers, cast)
    if small is None:
        return None
    stretches, first = [], 0
    for g in groups:
        stretches.append(Stretch(first, len(g), dryrun.device_of_module(f"{prefix}.{g[0]}", device_map)))
        first += min(len(g), RECORDED)
    small_map = _small_map(device_map, prefix, kept)
    added: dict[Hashable, int] = {}
    for g, stretch in zip(groups, stretches, strict=True):
        skipped = [t for i in g[RECORDED:] for t in (*layers[i].parameters(), *layers[i].buffers())]
        added[stretch.device] = added.get(stretch.device, 0) + dryrun.storage_bytes(skipped)
    signatures, types = _signatures(model, layers), _layer_types(model)
    work = tuple((signatures.index(signatures[i]), types[i] if types else None) for i in kept)
    return Shallow(small, small_map, stretches, added, work)


def _small_model(model: Any, kept: tuple[int, ...], layers: list[Any], cast: Callable[[Any, Any], Any]) -> Any | None:
    """A meta model with only the ``kept`` layers (remembered per full model), or None when its layers differ."""
    with _MODELS_LOCK:
        known = _MODELS.setdefault(model, {})
        if kept in known:
            return known[kept]
    small = _build(model, kept, cast)
    if small is not None:
        _, got = decoder_stack(small)
        if len(got) != len(kept) or any(
            layer_signature(a) != _signatures(model, layers)[i] for a, i in zip(got, kept, strict=False)
        ):
            small = None
    with _MODELS_LOCK:
        known[kept] = small
    return small


def _build(model: Any, kept: tuple[int, ...], cast: Callable[[Any, Any], Any]) -> Any | None:
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    types = _layer_types(model)
    try:  # a config may refuse the edit (a layer_types derived from other fields): then the full depth runs
        config = copy.deepcopy(model.config)
        text = config.get_text_config(decoder=True)
        text.num_hidden_layers = len(kept)
        if types is not None:
            text.layer_types = [types[i] for i in kept]
        with meta_build.quiet(), meta_build.forced_offline(), torch.device("meta"):
            small = type(model)._from_config(config, dtype=model.dtype)
            cast(small, model.dtype)
    except Exception:
        return None
    return small.eval()


def _small_map(device_map: dict[str, Hashable], prefix: str, kept: tuple[int, ...]) -> dict[str, Hashable]:
    """The full device_map with its layer entries replaced by the kept layers' (in the first one's place)."""
    out: dict[str, Hashable] = {}
    layers_placed = False
    for key, device in device_map.items():
        if not key.startswith(prefix + "."):
            out[key] = device
        elif not layers_placed:
            for j, i in enumerate(kept):
                out[f"{prefix}.{j}"] = dryrun.device_of_module(f"{prefix}.{i}", device_map)
            layers_placed = True
    return out


# ----------------------------------------------------------------------------------------------- widening


@dataclass
class CacheLayer:
    """One cache layer's figures at one moment."""

    held: int
    state: int
    kind: str
    on: dict[Hashable, int]


def cache_layers(cache: Any, track: Any, state_of: Any) -> list[CacheLayer] | None:
    """Each layer of a decoder cache, as the cache figures count it (None: not a per-layer cache)."""
    layers = getattr(cache, "layers", None)
    if cache is None or hasattr(cache, "self_attention_cache") or not isinstance(layers, list):
        return None
    out = []
    for layer in layers:
        tensors = dryrun.tensors_of(layer)
        held = dryrun.storage_bytes(tensors)
        out.append(CacheLayer(held, dryrun.storage_bytes(state_of(layer)), type(layer).__name__,
                              dryrun.bytes_by_device(track, layer)))  # fmt: skip
    return out


def _middle(layers: list[CacheLayer], stretch: Stretch) -> CacheLayer:
    """The cache layer each added layer holds: a recorded middle one (all three must agree)."""
    middle = layers[stretch.first + _FIRST_MIDDLE : stretch.first + _FIRST_MIDDLE + 3]
    if len({(c.held, c.state, c.kind, tuple(sorted(c.on.items(), key=str))) for c in middle}) != 1:
        raise NotRepeating("the middle layers' caches differ")
    return middle[0]


def widen_cache(found: dict[str, Any], shallow: Shallow, before: list[CacheLayer], after: list[CacheLayer]) -> None:
    """The full model's cache figures in ``found`` (run.py's _DryRun.generate keys), from the recorded layers'."""
    held, state, cross = found["parts"]
    classes, cache_on, decode_on = dict(found["classes"]), dict(found["cache_on"]), dict(found["decode_on"])
    decode_held = found["decode_held"]
    for stretch in shallow.stretches:
        if not stretch.copies:
            continue
        one, later = _middle(before, stretch), _middle(after, stretch)
        n = stretch.copies
        held, state, decode_held = held + n * one.held, state + n * one.state, decode_held + n * later.held
        if one.held > 16:  # as run._layer_classes counts them: layers that hold more than their window scalar
            classes[one.kind] = classes.get(one.kind, 0) + n
        for device, size in one.on.items():
            cache_on[device] = cache_on.get(device, 0) + n * size
        for device, size in later.on.items():
            decode_on[device] = decode_on.get(device, 0) + n * size
    found.update(parts=(held, state, cross), classes=classes, cache_on=cache_on, decode_on=decode_on,
                 decode_held=decode_held)  # fmt: skip


def added_bytes(created: list[CacheLayer], shallow: Shallow, devices: list[Hashable]) -> tuple[int, ...]:
    """Per device, what the missing layers' cache layers hold as soon as the cache is made."""
    out = dict.fromkeys(devices, 0)
    for stretch in shallow.stretches:
        if stretch.copies:
            for device, size in _middle(created, stretch).on.items():
                out[device] = out.get(device, 0) + stretch.copies * size
    return tuple(out[d] for d in devices)


def widen_timeline(
    table: Any,
    starts: list[int],
    split: int,
    shallow: Shallow,
    extra: tuple[int, ...],
    *,
    made: tuple[int, tuple[int, ...]],
) -> tuple[Any, int]:
    """The full-depth timeline (and the decode step's first index in it) from the recorded one.

    ``table``: the recorded timeline, an int64 tensor with a row per op and a column per device (the result is one
    too); ``starts``: the op index each recorded layer started at, prefill then decode; ``extra``: the missing layers'
    weights per device (held from the start); ``made``: the op index right after the cache was made and what the
    missing layers' cache layers hold from then on, per device (their allocations are not replayed one by one: the
    full run's timeline has those few points more, at the same figures).
    """
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    k = shallow.layers
    if len(starts) != 2 * k or not (starts[k - 1] < split <= starts[k]):
        raise NotRepeating("the decoder layers did not run once each in the prefill and the decode step")
    inserts = [(made[0], made[0], torch.tensor(made[1], dtype=torch.int64), 1)]
    for phase in (starts[:k], starts[k:]):
        for stretch in shallow.stretches:
            if stretch.copies:
                inserts.append(_period(table, phase, stretch))
    pieces, shift, cursor, moved = [], torch.tensor(extra, dtype=torch.int64), 0, 0
    for at, start, step, copies in sorted(inserts, key=operator.itemgetter(0, 1)):
        pieces.append(table[cursor:at] + shift)
        lifts = torch.arange(1, copies + 1, dtype=torch.int64).view(-1, 1, 1) * step  # copy q: q steps higher
        pieces.append((table[start:at].unsqueeze(0) + shift + lifts).reshape(-1, table.shape[1]))
        shift = shift + copies * step
        if at <= split:
            moved += copies * (at - start)
        cursor = at
    pieces.append(table[cursor:] + shift)
    return torch.cat(pieces), split + moved


def widen_counts(counts: dict[str, int], at_starts: list[dict[str, int]], shallow: Shallow) -> dict[str, int]:
    """Per-call counts (the attention kernels sized) at full depth: each added layer adds a middle one's calls."""
    k, out = shallow.layers, dict(counts)
    for phase in (at_starts[:k], at_starts[k:]):
        for stretch in shallow.stretches:
            if not stretch.copies:
                continue
            j = stretch.first + _FIRST_MIDDLE
            for key, value in phase[j + 1].items():
                out[key] = out.get(key, 0) + stretch.copies * (value - phase[j].get(key, 0))
    return out


def _period(table: Any, phase: list[int], stretch: Stretch) -> tuple[int, int, Any, int]:
    """(insert at, period start, step per device, copies) for one stretch in one phase; checked to repeat."""
    j = stretch.first + _FIRST_MIDDLE
    a, b, c = phase[j], phase[j + 1], phase[j + 2]
    if b - a != c - b or c > len(table):
        raise NotRepeating("the middle decoder layers do not repeat exactly")
    step = table[b] - table[a]
    if not bool((table[b:c] - table[a:b] == step).all()):
        raise NotRepeating("the middle decoder layers do not repeat exactly")
    return c, b, step, stretch.copies
