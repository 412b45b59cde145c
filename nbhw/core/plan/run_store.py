"""Dry-run recordings kept in memory for the process, and on disk between kernels: a second kernel is warm.

A :class:`Recording` is what the tracker saw of generate()'s prefill and decode step on a few-layer model: the
costly part of a plan. In memory it is kept per model object, under the sizes of the run on the few-layer
device_map and the recorded layers' work: the few layers recorded on one device_map stand for every device_map
that only moves where a stretch of like layers ends. On disk the key adds everything else it depends on: the meta
model's build (its config with every value, the Auto class, the dtype and the attention implementation) and the
versions of nbhw (with a digest of its dry-run code), torch, transformers and kernels. A model nbhw did not build
itself (a test's own, a user's object) has no fingerprint and is never stored. A new release of any of those
libraries reads nothing written by the old one.

The folder is ``$NBHW_HOME/dry-runs`` (default ``~/.cache/nbhw/dry-runs``); ``NBHW_KEEP_DRY_RUNS=0`` keeps
nothing. Files are pickles nbhw wrote in your own cache folder: one that can't be read (torn, another version's)
is ignored and written again. The folder keeps the newest :data:`MOST_FILES`.
"""

from __future__ import annotations

import array
import functools
import hashlib
import itertools
import os
import pickle
import re
import weakref
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from nbhw.core.plan.run_depth import CacheLayer


@dataclass(frozen=True)
class Recording:
    """What the tracker saw of one dry run's prefill and decode step, before it is widened to the model's depth."""

    found: dict[str, Any]  # generate()'s figures (see run._DryRun.generate)
    points: array.array[int]  # per op, every device's total, flat (see run_figures.flat)
    devices: tuple[Hashable, ...]
    largest: tuple[int, ...]
    weights: tuple[int, ...]
    starts: tuple[int, ...]
    routed_at: tuple[dict[str, int], ...]
    created: tuple[int, list[CacheLayer] | None]
    kernels: dict[str, int]


# Per full model (weakly), the recordings of its shallow runs, shared by every device_map they stand for.
_RECORDINGS: weakref.WeakKeyDictionary[Any, OrderedDict[Hashable, Recording]] = weakref.WeakKeyDictionary()
IN_MEMORY = 64  # recordings per model


def recorded(model: Any, key: Hashable) -> Recording | None:
    """The recording of this model and key: kept in this process, else on disk by an earlier kernel, else None."""
    kept = _RECORDINGS.get(model)
    if kept is not None and key in kept:
        kept.move_to_end(key)
        return kept[key]
    found = load(model, key)
    if found is not None:
        _remember(model, key, found)
    return found


def keep(model: Any, key: Hashable, recording: Recording) -> None:
    """Keep a new recording for this process and, where the model is nbhw's own build, for the next kernel."""
    _remember(model, key, recording)
    save(model, key, recording)


def forget() -> None:
    """Forget the recordings kept in this process (those on disk stay)."""
    _RECORDINGS.clear()


def _remember(model: Any, key: Hashable, recording: Recording) -> None:
    kept = _RECORDINGS.setdefault(model, OrderedDict())
    kept[key] = recording
    while len(kept) > IN_MEMORY:
        kept.popitem(last=False)


MOST_FILES = 4096  # about 0.1 MB each: a 70B search with its nearest changes writes ~130
PRUNE_EVERY = 64  # writes between two counts of the folder
_FINGERPRINTS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_WRITES = itertools.count(1)


def folder() -> Path | None:
    """Where recordings are kept: ``$NBHW_HOME/dry-runs`` (default ``~/.cache/nbhw``, where the tiny model lives
    too); None when ``NBHW_KEEP_DRY_RUNS=0``."""
    if os.environ.get("NBHW_KEEP_DRY_RUNS", "").strip().lower() in ("0", "off", "no", "false"):
        return None
    home = os.environ.get("NBHW_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "nbhw")
    return Path(home) / "dry-runs"


@functools.cache
def versions() -> str:
    """The libraries whose code a recording ran (a new release of any of them is a different key; read once: what
    this process imported)."""
    found = []
    for name in ("nbhw", "torch", "transformers", "kernels"):
        try:
            found.append(f"{name}={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name}=absent")
    return ",".join(found) + f",code={_code()}"


def _code() -> str:
    """A digest of nbhw's own dry-run code (a change between two commits of one version reads nothing old)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted([*root.glob("hf/*.py"), *root.glob("plan/*.py")]):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def remember_build(model: Any, *parts: str | None) -> None:
    """Note what a meta model was built from (the build's own key), so that its recordings can be kept on disk:
    where its config was read from is left out (the same config in another folder builds the same model)."""
    _FINGERPRINTS[model] = _FROM.sub("", repr(parts))


_FROM = re.compile(r'\\?"_name_or_path\\?": \\?"[^"\\]*\\?",? ?')


def _path(model: Any, key: Hashable) -> Path | None:
    where, built = folder(), _FINGERPRINTS.get(model)
    if where is None or built is None:
        return None
    digest = hashlib.sha256(repr((versions(), built, key)).encode()).hexdigest()
    return where / f"{digest}.pickle"


def load(model: Any, key: Hashable) -> Recording | None:
    """The recording kept for this model and key, or None (none kept, not a model nbhw built, unreadable)."""
    path = _path(model, key)
    if path is None or not path.is_file():
        return None
    try:
        with path.open("rb") as f:
            found = pickle.load(f)
        return found if isinstance(found, Recording) else None
    except Exception:  # torn or from another version: it is written again
        return None


def save(model: Any, key: Hashable, recording: Recording) -> None:
    """Keep a recording for the next kernel (quietly nothing when the folder can't be written)."""
    path = _path(model, key)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        with partial.open("wb") as f:
            pickle.dump(recording, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(partial, path)
    except OSError:
        return
    if next(_WRITES) % PRUNE_EVERY == 0:
        prune(path.parent)


def prune(where: Path, most: int = MOST_FILES) -> None:
    """Keep the newest ``most`` recordings of the folder."""
    try:
        files = sorted(where.glob("*.pickle"), key=lambda p: p.stat().st_mtime)
        for old in files[: max(len(files) - most, 0)]:
            old.unlink(missing_ok=True)
    except OSError:
        return
