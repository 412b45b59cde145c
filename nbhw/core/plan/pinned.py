"""A pinned run: the small JSON ``nbhw.pin()`` writes, read back (``nbhw.plan(pinned=path)``) and checked.

The file is data only: it is parsed as JSON (no pickle, no eval, nothing imported or run from it), its size and
shape are checked before any value is used, and any problem is one line (``UserError``). A file from another
version of transformers reads fine and gets a note: its figures were measured under other code.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbhw._version import __version__
from nbhw.core.argument import to_dict
from nbhw.core.errors import UserError
from nbhw.core.render import size

if TYPE_CHECKING:
    from nbhw.core.plan.load_plan import LoadPlan

FORMAT = "nbhw-pin"
FORMAT_VERSION = 1
MOST_BYTES = 1 << 20  # a pin is a few KiB; a larger file is not one
MOST_ITEMS = 10_000  # entries in one list or object (a device_map of a very large model fits)
MOST_TEXT = 4096  # characters in one string
MOST_DEPTH = 6
MOST_NUMBER = 1 << 62
VERSIONED = ("torch", "transformers", "accelerate", "kernels", "flash-attn", "nbhw")
# Top-level keys: what each must be. "peaks" and "devices" are checked further below.
SHAPE: dict[str, tuple[type, ...]] = {
    "format": (str,),
    "format_version": (int,),
    "created": (str,),
    "versions": (dict,),
    "model": (str,),
    "model_class": (str,),
    "arguments": (dict, type(None)),
    "attention": (dict,),
    "use_kernels": (bool,),
    "kernels": (list,),
    "dtype": (str,),
    "float32_modules": (list,),
    "device_map": (dict, type(None)),
    "quantization": (str, type(None)),
    "devices": (dict,),
    "peaks": (list,),
}
REQUIRED = ("format", "format_version", "model", "versions", "devices")


@dataclass(frozen=True)
class PinnedPeak:
    """One measured peak of the pinned run: which cell, what it did, on which device, and how it was measured."""

    cell: int | None
    what: str  # "loading", "generate", "loading and generate"
    device: str
    bytes: int
    measured_by: str


@dataclass(frozen=True)
class Pin:
    """What ran: versions, the plan's arguments, attention and kernels really used, device map, bytes and peaks."""

    path: str
    data: dict[str, Any] = field(repr=False)

    @property
    def versions(self) -> dict[str, str | None]:
        return {k: v for k, v in self.data["versions"].items() if isinstance(v, str | type(None))}

    @property
    def model(self) -> str:
        return str(self.data["model"])

    @property
    def arguments(self) -> dict[str, Any] | None:
        found = self.data.get("arguments")
        return dict(found) if isinstance(found, dict) else None

    @property
    def devices(self) -> dict[str, int]:
        """Bytes of the pinned model's tensors per device."""
        return {k: v for k, v in self.data["devices"].items() if _is_count(v)}

    @property
    def attention(self) -> dict[str, str | None]:
        return {str(k): v for k, v in self.data.get("attention", {}).items()}

    @property
    def peaks(self) -> list[PinnedPeak]:
        return [
            PinnedPeak(p.get("cell"), str(p["what"]), str(p["device"]), int(p["bytes"]), str(p.get("measured_by", "")))
            for p in self.data.get("peaks", [])
        ]

    def version_notes(self, installed: dict[str, str | None]) -> list[str]:
        """A note for each library whose version differs from the pinned run's (transformers first)."""
        notes = []
        for name in VERSIONED:
            pinned, now = self.versions.get(name), installed.get(name)
            if name in self.versions and pinned != now:
                notes.append(
                    f"the pinned run used {name} {pinned or 'not installed'}, this one has {now or 'not installed'}: "
                    f"its figures were measured under other code"
                )
        return notes


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MOST_NUMBER


def _problem(path: str, why: str) -> UserError:
    return UserError(f"pinned file {path!r}: {why}; expected a JSON file written by nbhw.pin()")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key appears twice in one object")
    return dict(pairs)


def _check_value(value: Any, depth: int, where: str) -> None:
    """Sizes and types anywhere in the file: bounded depth, lengths and numbers; JSON's own types only."""
    if depth > MOST_DEPTH:
        raise ValueError(f"{where} is nested deeper than {MOST_DEPTH} levels")
    if isinstance(value, str):
        if len(value) > MOST_TEXT:
            raise ValueError(f"{where} is a string of {len(value):,} characters (at most {MOST_TEXT:,})")
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if abs(value) > MOST_NUMBER:
            raise ValueError(f"{where} is a number beyond {MOST_NUMBER:,}")
    elif isinstance(value, float):
        raise ValueError(f"{where} is a fraction; a pin holds whole numbers")
    elif isinstance(value, list | dict):
        if len(value) > MOST_ITEMS:
            raise ValueError(f"{where} has {len(value):,} entries (at most {MOST_ITEMS:,})")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            _check_value(key, depth + 1, where) if isinstance(key, str) else None
            _check_value(item, depth + 1, f"{where}.{key}" if isinstance(value, dict) else f"{where}[{key}]")
    else:
        raise ValueError(f"{where} is not a JSON value")


def _check_shape(data: Any) -> None:
    if not isinstance(data, dict):
        raise ValueError("the top level is not an object")
    if data.get("format") != FORMAT:
        raise ValueError(f"'format' is not {FORMAT!r}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ValueError(f"{', '.join(repr(k) for k in missing)} missing")
    unknown = sorted(set(data) - set(SHAPE))
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}")
    for key, types in SHAPE.items():
        value = data.get(key)
        if key in data and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
            raise ValueError(f"{key!r} is not {' or '.join(t.__name__ for t in types)}")
    if data["format_version"] > FORMAT_VERSION:
        raise ValueError(f"format_version {data['format_version']} is newer than this nbhw reads ({FORMAT_VERSION})")
    _check_value(data, 0, "the file")
    for device, nbytes in data["devices"].items():
        if not _is_count(nbytes):
            raise ValueError(f"devices[{device!r}] is not a byte count")
    for i, peak in enumerate(data.get("peaks", [])):
        _check_peak(peak, i)


def _check_peak(peak: Any, i: int) -> None:
    checks: dict[str, Callable[[Any], bool]] = {
        "what": lambda v: isinstance(v, str),
        "device": lambda v: isinstance(v, str),
        "bytes": _is_count,
    }
    if not isinstance(peak, dict):
        raise ValueError(f"peaks[{i}] is not an object")
    for key, ok in checks.items():
        if not ok(peak.get(key)):
            raise ValueError(f"peaks[{i}].{key} is missing or of the wrong type")
    cell = peak.get("cell")
    if cell is not None and not _is_count(cell):
        raise ValueError(f"peaks[{i}].cell is not a cell number")


def _read_bytes(path: str) -> bytes:
    """At most MOST_BYTES + 1 bytes of a regular file (a FIFO or a device is refused before it is opened)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise _problem(path, f"cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise _problem(path, "is not a regular file")
    if info.st_size > MOST_BYTES:
        raise _problem(path, f"is {info.st_size:,} bytes, more than a pin ever is ({MOST_BYTES:,})")
    try:
        with open(path, "rb") as f:
            return f.read(MOST_BYTES + 1)
    except OSError as exc:
        raise _problem(path, f"cannot be read ({exc.strerror or exc})") from None


def read_pin(path: str | os.PathLike[str]) -> Pin:
    """The pinned run in ``path``, checked; a broken or hostile file is a one-line UserError."""
    text_path = str(Path(path).expanduser())
    raw = _read_bytes(text_path)
    if len(raw) > MOST_BYTES:
        raise _problem(text_path, f"grew past {MOST_BYTES:,} bytes while it was read")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constants, object_pairs_hook=_unique)
    except UnicodeDecodeError:
        raise _problem(text_path, "is not UTF-8 text") from None
    except RecursionError:
        raise _problem(text_path, "is nested too deeply") from None
    except ValueError as exc:
        raise _problem(text_path, f"is not valid JSON ({str(exc).splitlines()[0][:120]})") from None
    try:
        _check_shape(data)
    except ValueError as exc:
        raise _problem(text_path, str(exc)) from None
    return Pin(text_path, data)


def check_pinned(value: Any) -> str | None:
    """The ``pinned`` argument: a path to a file nbhw.pin() wrote, read and checked now (a UserError if not)."""
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike):
        raise UserError(f"pinned {value!r} is not a path; valid: the path of a JSON file nbhw.pin() wrote")
    return read_pin(value).path


def write_pin(data: dict[str, Any], path: str | os.PathLike[str]) -> Pin:
    """Write a pin (checked first, as a reader will check it); the Pin as it will be read back."""
    text_path = str(Path(path).expanduser())
    try:
        _check_shape(data)
    except ValueError as exc:
        raise UserError(f"nbhw.pin: the run does not fit a pin file ({exc})") from None
    body = json.dumps(data, indent=2, sort_keys=False) + "\n"
    try:
        Path(text_path).write_text(body, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"nbhw.pin: cannot write {text_path!r} ({exc.strerror or exc})") from None
    return Pin(text_path, data)


# ---------------------------------------------------------------- a plan beside a pinned run

VERSION_NAMES = {"torch": "torch", "transformers": "transformers", "accelerate": "accelerate", "kernels": "kernels",
                 "flash-attn": "flash_attn"}  # fmt: skip


def installed_versions() -> dict[str, str | None]:
    """The versions a pin records, as installed now (None: not installed); read from the package metadata."""
    found: dict[str, str | None] = {}
    for name in VERSION_NAMES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    found["nbhw"] = __version__
    return found


def device_key(key: int | str, accelerator: str | None) -> str:
    """A placement's device key as torch names the device (0 -> 'cuda:0')."""
    return f"{accelerator or 'cuda'}:{key}" if isinstance(key, int) else str(key)


def planned_bytes(plan: LoadPlan) -> dict[str, int]:
    """The weights the plan puts on each device (its placement), by torch's device names."""
    placement = plan.weight_placement
    if placement is None:
        return {}
    accelerator = plan.placed.live.accelerator
    found: dict[str, int] = {}
    for share in placement.devices:
        key = device_key(share.key, accelerator)
        found[key] = found.get(key, 0) + share.bytes
    return found


def signed(nbytes: int) -> str:
    """'1.3 GiB more' / '12.0 KiB less' / 'the same'."""
    if nbytes == 0:
        return "the same"
    return f"{size(abs(nbytes))} {'more' if nbytes > 0 else 'less'}"


def argument_differences(pin: Pin, arguments: dict[str, Any]) -> list[str]:
    """The arguments this plan gives differently from the pinned run's (``arguments``: the plan's, as to_dict)."""
    pinned = pin.arguments
    if pinned is None:
        return []
    keys = [k for k in arguments if k != "pinned" and k in pinned and pinned[k] != arguments[k]]
    return [f"{k}: pinned {pinned[k]!r}, this plan {arguments[k]!r}" for k in keys]


def plan_beside_pin(plan: LoadPlan) -> list[str]:
    """The pinned run beside this plan, one line each: versions, arguments, model, bytes per device."""
    pin = plan.pinned
    if pin is None:
        return []
    lines: list[str] = pin.version_notes(installed_versions())
    if pin.model != plan.model:
        lines.append(f"model: pinned {pin.model!r}, this plan {plan.model!r}")
    lines += argument_differences(pin, to_dict(plan.args))
    planned = planned_bytes(plan)
    for device in sorted(set(planned) | set(pin.devices)):
        was, now = pin.devices.get(device), planned.get(device)
        if was is None or now is None:
            lines.append(f"{device}: pinned {_maybe(was)}, this plan {_maybe(now)}")
        elif was != now:
            lines.append(f"{device}: this plan puts {signed(now - was)} weights there than the pinned run held")
    for peak in pin.peaks:
        lines.append(f"pinned {peak.what} peak on {peak.device}: {_maybe(peak.bytes)} ({peak.measured_by})")
    return lines


def _maybe(nbytes: int | None) -> str:
    return "nothing" if nbytes is None else size(nbytes)
