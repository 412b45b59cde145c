"""Hardware you don't have: the accelerator catalog (``catalog.json``), ``target=`` words, and ``nbhw.targets()``.

Each catalog entry names one of nbhw's backend keys (:mod:`nbhw.core.hardware.backends`) and that backend's device
string, so a target plugs into the same advice as a detected device: :meth:`Target.rows` gives the backend rows
detection would give (a plan's budgets and device checks read them), :meth:`Target.devices` the
:class:`~nbhw.core.hardware.data.DeviceInfo` rows, :meth:`Target.device` what transformers' checks see
(:mod:`nbhw.core.hf.as_if`). Nothing here probes or touches a device.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any

from nbhw.core.argument import Argument
from nbhw.core.errors import UserError
from nbhw.core.hardware import backends
from nbhw.core.hardware.data import BackendStatus, DeviceInfo
from nbhw.core.hf.as_if import TargetDevice
from nbhw.core.render import GIB, STYLE, Shown, esc, html_table, text_table

MAX_COUNT = 64
DTYPES = ("fp16", "bf16", "tf32", "fp8", "fp4")
REQUIRED = (
    "key", "name", "aliases", "vendor", "family", "backend", "device", "memory_gib", "usable_memory_gib", "usable_from",
    "usable_source", "usable_basis", "ecc", "memory_bandwidth_gbps", "compute_capability", "arch", "dtypes", "source",
    "confirmed", "unconfirmed", "notes",
)  # fmt: skip
OPTIONAL = ("devices_per_card", "unified_memory")
# How an entry's usable memory was found: on that card, on a card with the same memory, or nowhere (the box number).
USABLE_FROM = ("measured", "same memory", "vendor", "working-set rule")
# ECC as the card ships: "on" (GDDR, 1/16 kept for ECC bits), "off" (GDDR that could), "none", "sideband" (HBM).
ECC = ("on", "off", "none", "sideband")
ECC_OFF = "ECC off"
FORMS = "'NAME', '2x NAME', '2 x NAME', '2×NAME', '2*NAME' (a whole count from 1 to 64), each with ' ECC off' after it"
# Words people put before a name that never tell two entries apart.
VENDOR_WORDS = ("nvidia", "geforce", "tesla", "amd", "instinct", "intel", "apple", "google", "cloud", "aws", "huawei")
NOT_HERE = "hardware that is not here"


# ---------------------------------------------------------------- the catalog


@dataclass(frozen=True)
class Accelerator:
    """One catalog entry: a device as torch numbers it (an MI250X module is two of them)."""

    key: str
    name: str
    aliases: tuple[str, ...]
    vendor: str
    family: str
    backend: str
    device: str
    memory_gib: float
    usable_memory_gib: float
    usable_from: str
    usable_source: str
    usable_basis: str
    ecc: str
    memory_bandwidth_gbps: float
    compute_capability: str | None
    arch: str
    dtypes: dict[str, bool]
    source: str
    confirmed: dict[str, str]
    unconfirmed: tuple[str, ...]
    notes: tuple[str, ...]
    devices_per_card: int = 1
    unified_memory: bool = False
    ecc_off: bool = False  # the target asked for ECC off (a GDDR card that ships with it on)

    @property
    def usable_gib(self) -> float:
        """What a program on one device can use, in GiB: the catalog's usable figure, plus the 1/16 ECC gives back."""
        return round(self.usable_memory_gib + (self.memory_gib * ecc_fraction() if self.ecc_off else 0.0), 2)

    @property
    def memory_bytes(self) -> int:
        """What one device can hold: torch's total there (after ECC and the driver), or Metal's working set."""
        return int(self.usable_gib * GIB)

    @property
    def box(self) -> str:
        """The vendor's number, as the box says it: '16 GiB', '128 GiB unified'."""
        return f"{self.memory_gib:g} GiB" + (" unified" if self.unified_memory else "")

    def without_ecc(self) -> Accelerator:
        """The same card with ECC turned off; a one-line UserError where that frees nothing."""
        if self.ecc == "on":
            return replace(self, ecc_off=True)
        on = ", ".join(a.name for a in catalog() if a.ecc == "on")
        why = {
            "sideband": "its HBM keeps ECC bits outside the memory, so ECC off frees nothing",
            "off": "its ECC is already off as it ships",
            "none": "its memory has no ECC to turn off",
        }[self.ecc]
        raise UserError(f"target '{self.name} {ECC_OFF}': {why}; {ECC_OFF} applies to {on}")

    @property
    def capability(self) -> tuple[int, int] | None:
        """(major, minor) as torch.cuda.get_device_capability reports it: NVIDIA's, or HIP's for a gfx arch."""
        if self.compute_capability:
            major, _, minor = self.compute_capability.partition(".")
            return int(major), int(minor or 0)
        if self.backend == "rocm" and self.arch.startswith("gfx"):
            digits = self.arch[3:]
            return int(digits[:-2]), int(digits[-2], 16)
        return None

    @property
    def device_type(self) -> str:
        """The device type transformers reports for it ('rocm' for AMD, whose torch device is cuda)."""
        return "rocm" if self.backend == "rocm" else self.device


@lru_cache(maxsize=1)
def _raw() -> dict[str, Any]:
    text = resources.files("nbhw.core.hardware").joinpath("catalog.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def catalog_problems(data: dict[str, Any] | None = None) -> list[str]:
    """Every way the catalog breaks its schema or contradicts itself; [] for a good catalog."""
    data = _raw() if data is None else data
    devices = {b.key: b.device for b in backends.BUILTIN}
    problems: list[str] = []
    keys: set[str] = set()
    for i, entry in enumerate(data.get("accelerators", [])):
        where = f"entry {i} ({entry.get('key', '?')})"
        missing = [f for f in REQUIRED if f not in entry]
        extra = [f for f in entry if f not in REQUIRED and f not in OPTIONAL]
        if missing or extra:
            problems.append(f"{where}: missing {missing}, unknown {extra}")
            continue
        if entry["key"] in keys:
            problems.append(f"{where}: duplicate key")
        keys.add(entry["key"])
        problems += [f"{where}: {p}" for p in _entry_problems(entry, devices, data)]
    return problems + _name_clashes(data)


def _entry_problems(e: dict[str, Any], devices: dict[str, str], data: dict[str, Any]) -> list[str]:
    out = []
    if e["backend"] not in devices:
        out.append(f"backend {e['backend']!r} is not an nbhw backend key ({', '.join(devices)})")
    elif devices[e["backend"]] != e["device"]:
        out.append(f"device {e['device']!r} is not backend {e['backend']}'s device string {devices[e['backend']]!r}")
    if set(e["dtypes"]) != set(DTYPES) or not all(isinstance(v, bool) for v in e["dtypes"].values()):
        return [*out, f"dtypes must be exactly {DTYPES} as booleans"]
    if not (e["memory_gib"] > 0 and e["memory_bandwidth_gbps"] > 0):
        out.append("memory and bandwidth must be positive")
    if not str(e["source"]).startswith("https://"):
        out.append("source must be an https URL")
    out += _usable_problems(e)
    for fig, url in e["confirmed"].items():
        if not str(url).startswith("https://"):
            out.append(f"confirmed[{fig}] is not an https URL")
        if fig in e["unconfirmed"]:
            out.append(f"{fig} is both confirmed and unconfirmed")
    out += _vendor_rules(e)
    if e.get("unified_memory"):
        out += _unified_rule(e, data)
    return out


def _usable_problems(e: dict[str, Any]) -> list[str]:
    usable, box, kind = e["usable_memory_gib"], e["memory_gib"], e["usable_from"]
    out = []
    if kind not in USABLE_FROM or e["ecc"] not in ECC:
        return [f"usable_from must be one of {USABLE_FROM} and ecc one of {ECC}"]
    if not str(e["usable_source"]).startswith("https://") or not str(e["usable_basis"]).strip():
        out.append("usable memory needs an https usable_source and a usable_basis saying what it shows")
    if not 0 < usable <= box:
        out.append(f"usable_memory_gib {usable} must be above 0 and at most memory_gib {box}")
    elif kind == "vendor" and usable != box:
        out.append(f"usable_from 'vendor' is the box number: usable_memory_gib {usable} must be {box}")
    elif kind in ("measured", "same memory") and usable == box:
        out.append("a measured usable_memory_gib is below the box number (the driver keeps some)")
    if e["ecc"] == "on" and usable > box * (1 - ecc_fraction()):
        out.append(f"ecc 'on' keeps 1/16 for ECC bits: usable_memory_gib {usable} is above {box * 15 / 16:g}")
    if bool(e.get("unified_memory")) != (kind == "working-set rule"):
        out.append("usable_from 'working-set rule' is for unified memory (Apple) entries, and only them")
    return out


def ecc_fraction() -> float:
    """The share of a GDDR card's memory that ECC bits take when ECC is on (1/16, the catalog's ecc_rule)."""
    return float(_raw().get("ecc_rule", {}).get("gddr_fraction", 0.0625))


def _nvidia_rules(e: dict[str, Any]) -> list[str]:
    d, cc, arch = e["dtypes"], e["compute_capability"], e["arch"]
    if not (isinstance(cc, str) and re.fullmatch(r"\d+\.\d", cc)):
        return [f"an NVIDIA entry needs compute_capability 'M.m', got {cc!r}"]
    major, minor = (int(x) for x in cc.split("."))
    # torch's rules: bf16 and tf32 from Ampere (8.0); fp8 tensor cores from Ada/Hopper (8.9); fp4 from Blackwell.
    rules = {"bf16": (major, minor) >= (8, 0), "tf32": (major, minor) >= (8, 0), "fp8": (major, minor) >= (8, 9),
             "fp4": major >= 10, "fp16": True}  # fmt: skip
    out = [f"{k} is {d[k]} but compute capability {cc} says {v}" for k, v in rules.items() if d[k] != v]
    if arch != f"sm_{major}{minor}":
        out.append(f"arch {arch!r} doesn't match compute capability {cc} (sm_{major}{minor})")
    return out


def _amd_rules(e: dict[str, Any]) -> list[str]:
    d, arch = e["dtypes"], e["arch"]
    out = []
    if e["compute_capability"] is not None or not re.fullmatch(r"gfx[0-9a-f]{3,4}", arch):
        out.append("an AMD entry names its gfx arch and no compute_capability")
    newer = arch.startswith(("gfx94", "gfx95"))
    # probes.py / torch: ROCm always has bf16; tf32 and fp8 only on gfx94x/gfx95x (MI300 and later).
    rules = {"bf16": True, "fp16": True, "tf32": newer, "fp8": newer}
    return out + [f"{k} is {d[k]} but arch {arch} says {v}" for k, v in rules.items() if d[k] != v]


def _vendor_rules(e: dict[str, Any]) -> list[str]:
    if e["backend"] == "cuda":
        return _nvidia_rules(e)
    if e["backend"] == "rocm":
        return _amd_rules(e)
    out = []
    if e["compute_capability"] is not None:
        out.append("compute_capability is for NVIDIA entries only; name the architecture in arch")
    if e["backend"] == "tpu" and not e["dtypes"]["bf16"]:
        out.append("TPUs compute in bf16")
    if e.get("unified_memory") and e.get("devices_per_card", 1) != 1:
        out.append("a unified-memory entry is one device")
    return out


def _unified_rule(e: dict[str, Any], data: dict[str, Any]) -> list[str]:
    rule = data.get("apple_usable_rule", {})
    frac = rule.get("fraction_above_36gb") if e["memory_gib"] > 36 else rule.get("fraction_up_to_36gb")
    want = round(e["memory_gib"] * float(frac or 0), 2)
    got = e.get("usable_memory_gib")
    if isinstance(got, int | float) and abs(got - want) < 0.1:
        return []
    return [f"usable_memory_gib {got} doesn't follow the rule ({want})"]


def _name_clashes(data: dict[str, Any]) -> list[str]:
    owner: dict[str, str] = {}
    out = []
    for e in data.get("accelerators", []):
        for name in {e.get("key", ""), e.get("name", ""), *e.get("aliases", [])}:
            norm = normalize(name)
            if norm in owner and owner[norm] != e.get("key"):
                out.append(f"name {name!r} belongs to both {owner[norm]} and {e.get('key')}")
            owner.setdefault(norm, e.get("key", ""))
    return out


@lru_cache(maxsize=1)
def catalog() -> tuple[Accelerator, ...]:
    """The shipped catalog, checked; a broken catalog is a bug in nbhw, so it raises."""
    problems = catalog_problems()
    if problems:
        raise RuntimeError("nbhw's accelerator catalog is inconsistent: " + "; ".join(problems[:5]))
    return tuple(
        Accelerator(**{
            **e, "aliases": tuple(e["aliases"]), "unconfirmed": tuple(e["unconfirmed"]), "notes": tuple(e["notes"])
        })
        for e in _raw()["accelerators"]
    )  # fmt: skip


def host_rule() -> str:
    """What nbhw assumes for a target's host memory, which the catalog doesn't hold."""
    return str(_raw().get("host_memory_rule", ""))


# ---------------------------------------------------------------- names and targets


def normalize(name: str) -> str:
    """'RTX 4090', 'rtx-4090', 'RTX4090', 'NVIDIA GeForce RTX 4090' all read 'rtx4090'; '80G' reads '80gb'."""
    text = name.casefold()
    for word in VENDOR_WORDS:
        text = re.sub(rf"\b{word}\b", " ", text)
    text = re.sub(r"[^0-9a-z]+", "", text)
    return re.sub(r"(\d)g$", r"\1gb", text)


@lru_cache(maxsize=1)
def _index() -> dict[str, Accelerator]:
    found: dict[str, Accelerator] = {}
    for acc in catalog():
        for name in (acc.key, acc.name, *acc.aliases):
            found.setdefault(normalize(name), acc)
    return found


@dataclass(frozen=True)
class Target:
    """``cards`` of one catalog entry: what a plan or a check is for when that hardware isn't here."""

    accelerator: Accelerator
    cards: int = 1

    @property
    def count(self) -> int:
        """Devices as torch numbers them (cards × devices per card)."""
        return self.cards * self.accelerator.devices_per_card

    def __repr__(self) -> str:
        # Its words name it exactly (parse_target(t.text) == t): a plan's arguments read back short, and cache keys
        # made from them stay distinct.
        return f"Target({self.text!r})"

    def __hash__(self) -> int:
        # by its words (the catalog entry it holds has dict fields): Targets that are equal hash alike
        return hash(self.text)

    @property
    def text(self) -> str:
        """The target as ``target=`` takes it back: 'T4', '2x H100 SXM', 'T4 ECC off'."""
        name = self.accelerator.name + (f" {ECC_OFF}" if self.accelerator.ecc_off else "")
        return name if self.cards == 1 else f"{self.cards}x {name}"

    @property
    def label(self) -> str:
        """What the views call it: the cards, and the devices torch would see when a card holds several."""
        a = self.accelerator
        devices = f" = {self.count} {a.device} devices" if a.devices_per_card > 1 else ""
        ecc = f" ({ECC_OFF})" if a.ecc_off else ""
        return f"{self.cards}x {a.name}{ecc}{devices}"

    @property
    def not_here(self) -> str:
        """The line every view shows first: what it plans for is not this machine."""
        return f"planning for {self.label}: {NOT_HERE} (nbhw's catalog; nothing was detected or run on it)"

    @property
    def device_type(self) -> str:
        """transformers' device type ('rocm' for AMD)."""
        return self.accelerator.device_type

    @property
    def host_memory(self) -> int:
        """The host memory nbhw assumes (not in the catalog): as much as the devices hold together."""
        return self.count * self.accelerator.memory_bytes

    def device_name(self, index: int) -> str:
        """torch's name for device ``index`` of the target: 'cuda:1', 'mps'."""
        device = self.accelerator.device
        return device if device == "mps" else f"{device}:{index}"

    def devices(self) -> list[DeviceInfo]:
        """The DeviceInfo rows detection would give for this hardware (nothing is probed)."""
        a = self.accelerator
        cc = a.compute_capability or (a.arch if a.backend == "rocm" else None)
        return [
            DeviceInfo(
                index=i, device=self.device_name(i), name=a.name, total_memory=a.memory_bytes,
                free_memory=a.memory_bytes, compute_capability=cc, bf16=a.dtypes["bf16"], fp16=a.dtypes["fp16"],
                tf32=a.dtypes["tf32"], details={"catalog": a.key, "source": a.source},
                notes=["from nbhw's catalog: not detected"],
            )
            for i in range(self.count)
        ]  # fmt: skip

    def rows(self) -> list[BackendStatus]:
        """The backend rows detection would give on the target: its backend with its devices, and the host's CPU.

        A plan reads its budget from these as it reads this machine's: per device the catalog's usable memory, what
        torch reports there (the run planner subtracts its framework reserve from that budget), the CPU the host
        memory nbhw assumes.
        """
        a = self.accelerator
        by_key = {b.key: b for b in backends.BUILTIN}
        cpu = DeviceInfo(0, "cpu", "host CPU (assumed)", self.host_memory, self.host_memory,
                         notes=[f"not in the catalog: {host_rule()}"])  # fmt: skip
        note = "from nbhw's catalog: not detected"
        return [
            BackendStatus("cpu", by_key["cpu"].hardware, "cpu", "torch", True, None, True, devices=[cpu]),
            BackendStatus(a.backend, by_key[a.backend].hardware, a.device, by_key[a.backend].package, True, None,
                          True, devices=self.devices(), notes=[note], torch_accelerator=True),
        ]  # fmt: skip

    def device(self) -> TargetDevice:
        """The device transformers' checks see when they are read for this target."""
        a = self.accelerator
        return TargetDevice(a.device_type, self.count, a.capability, a.name, a.memory_bytes)


_COUNT = re.compile(r"^\s*(?P<count>[+-]?\d*\.?\d+)\s*(?P<sep>[x×*]|\s)\s*(?P<name>\S.*)$", re.IGNORECASE)


_ECC_OFF = re.compile(r"[\s,(-]*\becc[\s_-]*off\)?\s*$", re.IGNORECASE)


def parse_target(text: str) -> Target:
    """'H100', '2x H100-80GB', '4 x A100 40GB', '2×RTX4090', '8*MI300X', 'T4 ECC off' as a Target; a one-line
    UserError otherwise."""
    raw = (text or "").strip() if isinstance(text, str) else ""
    if not raw:
        raise UserError(f"empty target {text!r}; valid forms: {FORMS}")
    cards = _cards(_ECC_OFF.sub("", raw), raw)
    if _ECC_OFF.search(raw):
        return Target(cards.accelerator.without_ecc(), cards.cards)
    return cards


def _cards(raw: str, asked: str) -> Target:
    if not raw:
        raise UserError(f"target {asked!r} names no card; valid forms: {FORMS}")
    m = _COUNT.match(raw)
    # A whole text that is a catalog name ("7900 XTX") is never a count and a name.
    if (
        m is None
        or normalize(raw) in _index()
        or (m.group("sep").isspace() and not _plain_count(m.group("count"), m.group("name")))
    ):
        return _checked(Target(lookup(raw), 1), raw)
    cards = _count(m.group("count"), raw)
    return _checked(Target(lookup(m.group("name")), cards), raw)


def _checked(target: Target, raw: str) -> Target:
    if target.accelerator.unified_memory and target.cards > 1:
        raise UserError(f"target {raw!r}: a Mac has one mps device; valid: {target.accelerator.name!r} alone")
    return target


def _plain_count(value: str, name: str) -> bool:
    # "2 H100" is a count, and so is "65 H100" (to be refused); "3090 Ti" is a (wrong) name.
    return value.isdigit() and (1 <= int(value) <= MAX_COUNT or normalize(name) in _index())


def _count(value: str, raw: str) -> int:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if number != int(number) or not 1 <= number <= MAX_COUNT:
        raise UserError(f"target {raw!r}: the count must be a whole number from 1 to {MAX_COUNT}; valid forms: {FORMS}")
    return int(number)


def lookup(name: str) -> Accelerator:
    """The one catalog entry a name means, matched loosely; a one-line UserError listing close matches otherwise."""
    norm = normalize(name)
    index = _index()
    if norm in index:
        return index[norm]
    # A family plus a memory size ("A100-80G") or a family ("A100") that several entries share.
    prefixed = sorted({a.name for n, a in index.items() if n.startswith(norm) and norm}, key=str.casefold)
    with_memory = [a for a in catalog() if re.fullmatch(rf"{re.escape(norm)}\d+gb", normalize(a.name))]
    if len(with_memory) == 1:
        return with_memory[0]
    if len(prefixed) > 1:
        raise UserError(f"target {name!r} matches several: {', '.join(prefixed)}; name one")
    close = difflib.get_close_matches(norm, list(index), n=6, cutoff=0.6)
    names = list(dict.fromkeys(index[c].name for c in close))
    hint = f"close matches: {', '.join(names)}" if names else "no close match"
    raise UserError(f"unknown target {name!r}; {hint}; nbhw.targets() lists all {len(catalog())}")


def check_target(value: Any) -> Target | None:
    """``target=`` as the Target it names (words such as '2x H100 SXM', or a Target), or None for this machine; a
    UserError otherwise. Parsed once, here: every surface after it gets the Target."""
    if value is None or isinstance(value, Target):
        return value
    if not isinstance(value, str):
        raise UserError(f"target {value!r} is not a name; valid forms: {FORMS}")
    return _parsed(value)


def target_of(value: Target | str | None) -> Target | None:
    """The Target of a checked ``target=`` value (None: this machine); words (a form's text) are parsed."""
    return value if value is None or isinstance(value, Target) else _parsed(value)


@lru_cache(maxsize=256)
def _parsed(text: str) -> Target:
    return parse_target(text)


def target_word(value: Target | str | None) -> str | None:
    """``target=`` as the words that name it again ('2x H100 SXM'): what a form shows and JSON holds."""
    return value.text if isinstance(value, Target) else value


# The target argument of the plan, the attention advisor and the quantization advice, declared once.
TARGET: dict[str, Any] = {
    "metavar": "NAME",
    "check": check_target,
    "word": target_word,
    "help": "plan for hardware that is not here, from nbhw's catalog: 'T4', '2x H100-80GB', '4 x A100 40GB', "
    "'T4 ECC off' (nbhw.targets() lists them)",
}


def check_target_args(target: Target | None, max_memory: object) -> None:
    """--target plans for a catalog entry's memory, --max-memory for memory you type: not both."""
    if target is not None and max_memory:
        raise UserError(
            "--target and --max-memory both set the memory to plan for; give one: --target 'NAME' (the catalog's "
            "memory) or --max-memory DEV=SIZE ... (your own budget, on this machine)"
        )


# ---------------------------------------------------------------- nbhw.targets()

HEADERS = (
    "name", "vendor", "backend", "device", "capability / arch", "usable memory", "box", "ECC", "bandwidth", "dtypes",
)  # fmt: skip
ECC_WORDS = {"on": "on (1/16)", "off": "off", "none": "none", "sideband": "HBM, no cost"}


@dataclass
class Targets(Shown):
    """``nbhw.targets()``: the catalog, one row per accelerator; ``target=`` takes any name or alias shown."""

    rows: list[Accelerator] = field(default_factory=list)

    def _cells(self) -> list[list[str]]:
        return [
            [a.name, a.vendor, a.backend, a.device, a.compute_capability or a.arch, _memory(a), a.box,
             ECC_WORDS[a.ecc], f"{a.memory_bandwidth_gbps:g} GB/s", ",".join(k for k in DTYPES if a.dtypes[k])]
            for a in self.rows
        ]  # fmt: skip

    def text(self) -> str:
        """The catalog as aligned text."""
        lead = f"nbhw targets: {len(self.rows)} accelerators nbhw can plan for without having them"
        return f"{lead}\n\n{text_table(HEADERS, self._cells())}\n{USABLE_NOTE}\n"

    def html(self) -> str:
        """The catalog as an HTML table."""
        lead = f"nbhw targets: {len(self.rows)} accelerators nbhw can plan for without having them"
        table = html_table(HEADERS, self._cells())
        return f'{STYLE}<div class="nbhw"><h3>{esc(lead)}</h3>{table}<p>{esc(USABLE_NOTE)}</p></div>'

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data: every field of every entry, sources included."""
        return {"accelerators": [dict(vars(a)) for a in self.rows]}


def _memory(a: Accelerator) -> str:
    """The usable figure and how it was found: '14.75 GiB', '64 GiB (vendor's)', '96 GiB (working set)'."""
    per = " per device" if a.devices_per_card > 1 else ""
    how = {"vendor": " (vendor's)", "working-set rule": " (working set)", "same memory": " (same memory)"}
    return f"{a.usable_gib:g} GiB{per}{how.get(a.usable_from, '')}"


USABLE_NOTE = (
    "usable memory: what torch reports on the card (after ECC and the driver), which plans budget; box: the vendor's "
    f"number; ECC on keeps 1/16 for ECC bits ('T4 {ECC_OFF}' gives it back); HBM keeps them outside the memory"
)

VENDOR = Argument("vendor", "only this vendor's accelerators (NVIDIA, AMD, Intel, Apple, Google, AWS, Huawei)")
TARGETS_ARGUMENTS = (VENDOR,)  # the words of %hw targets


def targets(vendor: str | None = None) -> Targets:
    """Every accelerator nbhw can plan for without having it (``target=`` names one), or one vendor's."""
    rows = [a for a in catalog() if vendor is None or a.vendor.casefold() == vendor.casefold()]
    if not rows:
        vendors = sorted({a.vendor for a in catalog()})
        raise UserError(f"no target from vendor {vendor!r}; valid: {', '.join(vendors)}")
    return Targets(rows)
