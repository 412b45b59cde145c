"""The Load tab without widgets: what its controls offer on this machine, and what a filled-in form previews.

The controls are the declared arguments of a plan (:data:`nbhw.core.plan.arguments.PLAN_ARGUMENTS`) that name a
``control``. :func:`choices` reads what each dropdown offers from what nbhw detects here (usable devices, free
memory, bitsandbytes) and from the attention advisor (which ``attn_implementation`` works, the advised dtype);
:func:`preview` turns a :class:`Form` into the plan's code, dry-run problems, estimate and placement, or into a
one-line message when an entry is a mistake. Nothing here raises for a user's entry and nothing imports a UI library.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from huggingface_hub import constants, scan_cache_dir

from nbhw.core.advice import precision, quantization
from nbhw.core.advice.attention import AttentionAdvice, advise
from nbhw.core.advice.attention_rules import catalog_target, device_types, parse_device
from nbhw.core.advice.quantization_methods import BITSANDBYTES_WORDS
from nbhw.core.advice.status import Status
from nbhw.core.argument import Argument
from nbhw.core.cache import Recent
from nbhw.core.dtypes import OFFERED
from nbhw.core.errors import UserError
from nbhw.core.hardware import backends
from nbhw.core.hardware.data import BackendStatus
from nbhw.core.hardware.detect import Hardware, detect
from nbhw.core.hardware.targets import Target, catalog, target_of
from nbhw.core.hardware.who_picks import from_pretrained_default
from nbhw.core.hf import meta_build
from nbhw.core.hf.module_sizes import module_sizes
from nbhw.core.hf.tiny_model import tiny_model_path
from nbhw.core.plan import run_parts, run_search
from nbhw.core.plan.arguments import (
    NO_DEVICE_MAP,
    PADDING_WORDS,
    PLAN_ARGUMENTS,
    cache_implementations,
    strategy_names,
)
from nbhw.core.plan.load_plan import LoadPlan, plan
from nbhw.core.plan.placement import DeviceShare, Placement, device_name, layer_names, live_memory

# The declared arguments the Load tab shows a control for, by name.
CONTROLS: dict[str, Argument] = {a.name: a for a in PLAN_ARGUMENTS if a.control is not None}
# Words a form carries to its plan without a control: "Make it fit" sets them (a memory share's ``max_memory`` leaves
# the run each device's whole ``budget``), and a hand-made change to what they follow ends them.
CARRIED: dict[str, Argument] = {a.name: a for a in PLAN_ARGUMENTS if a.name == "budget"}
FOLLOWS = {"budget": "max_memory"}
FORM_WORDS: dict[str, Argument] = {**CONTROLS, **CARRIED}
SIZES = frozenset(n for n, a in CONTROLS.items() if a.control == "sizes") | set(CARRIED)  # DEV=SIZE pairs
UNSET_DTYPE = None  # a form without a dtype means "the advised dtype"
THIS_MACHINE = "this machine"
TARGET_COUNTS = (1, 2, 4, 8)  # the counts the target dropdown offers per entry; %hw load --target takes any 1..64


@dataclass(frozen=True)
class Option:
    """One entry of a control: the value the plan gets, the label shown, and whether it will work here."""

    value: str | None
    label: str
    ok: bool = True
    reason: str = ""


@dataclass(frozen=True)
class MemoryField:
    """One device whose budget the max_memory controls set: its max_memory key, its name, its free bytes now."""

    key: str
    device: str
    free: int | None


@dataclass(frozen=True)
class Choices:
    """What the controls offer for one model on this machine, and the advice behind the defaults.

    ``options`` holds the entries of each dropdown and ``notes`` the line beside each control, by argument name.
    """

    model: str
    target: str
    advised_dtype: str
    options: Mapping[str, tuple[Option, ...]]
    notes: Mapping[str, str]
    memory: tuple[MemoryField, ...]
    problem: str | None = None

    def option(self, name: str, value: str | None) -> Option | None:
        """The entry of one dropdown for a value, if the dropdown offers it."""
        return next((o for o in self.options.get(name, ()) if o.value == value), None)


class Form:
    """What the Load tab's controls hold, in the words of ``%hw load``: a word per declared argument that is set.

    ``Form(model, dtype="float16", device_map="sequential")``; an argument not given holds its declared default
    (``dtype``: the advised dtype). ``device_map`` is a word (a strategy, a device, an int, a dict literal, or
    "none"); ``max_memory`` pairs a max_memory key ("0", "cpu") with a size as typed ("" = not set).
    """

    __slots__ = ("_words", "model", "offline")

    def __init__(self, model: str, *, offline: bool = False, **words: Any) -> None:
        unknown = [name for name in words if name not in FORM_WORDS]
        if unknown:
            raise TypeError(f"the Load tab has no control {unknown[0]!r}; it has {', '.join(FORM_WORDS)}")
        self.model = model
        self.offline = offline
        words = {n: FORM_WORDS[n].word(v) if isinstance(v, bool) else v for n, v in words.items()}  # a dropdown's word
        self._words = tuple((n, v) for n, v in words.items() if v is not None and v != self.default(n))

    @staticmethod
    def default(name: str) -> Any:
        """What a control holds when nothing was chosen: the declared default as a word (dtype: advised)."""
        declared = FORM_WORDS[name]
        if name == "dtype":
            return UNSET_DTYPE
        if name in SIZES:
            return ()
        return declared.word(declared.default)

    def __getattr__(self, name: str) -> Any:
        if name in FORM_WORDS:
            return dict(self._words).get(name, self.default(name))
        raise AttributeError(name)

    @property
    def words(self) -> dict[str, Any]:
        """The controls that hold something other than their default."""
        return dict(self._words)

    def replace(self, **words: Any) -> Form:
        """The same form with some controls changed (``dtype=...`` settles an unset dtype on the advised one); a
        carried word goes when what it follows changes (a max_memory typed by hand ends the fit's budget)."""
        kept = {n: v for n, v in self.words.items() if n not in CARRIED or FOLLOWS[n] not in words}
        return Form(self.model, offline=self.offline, **{**kept, **words})

    def with_dtype(self, dtype: str) -> Form:
        """The same form with a dtype (used to settle an unset dtype on the advised one)."""
        return self.replace(dtype=dtype)

    def _key(self) -> tuple[Any, ...]:
        return (self.model, self.offline, self._words)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Form) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        words = "".join(f", {n}={v!r}" for n, v in self._words)
        return f"Form({self.model!r}{words}, offline={self.offline})"

    def memory_budget(self, name: str = "max_memory") -> dict[str, int | str] | None:
        """The max_memory (or budget) the form gives, sizes as typed (digits alone are bytes); None when none is
        set."""
        pairs: tuple[tuple[str, str], ...] = getattr(self, name)
        sizes = {key.strip(): size.strip() for key, size in pairs if size.strip()}
        budget: dict[str, int | str] = {k: int(v) if v.isdigit() else v for k, v in sizes.items()}
        return budget or None

    def plan_values(self) -> dict[str, Any]:
        """The keyword arguments of nbhw.plan() this form gives (words are parsed by their declarations)."""
        values: dict[str, Any] = {}
        for name in FORM_WORDS:
            word = getattr(self, name)
            if name in SIZES:
                values[name] = self.memory_budget(name)
            elif name == "dtype":
                values[name] = word or "auto"
            elif word is not None:
                values[name] = word
        return values


@dataclass(frozen=True)
class Unit:
    """One block of the placement picture: a decoder layer, or a module outside the layers that holds weights."""

    name: str
    device: str
    bytes: int
    layer: bool


class Preview:
    """What a form gives: the cell's code and the plan's findings, or the message saying which entry is wrong.

    The code is made at once; the findings are computed on first use, quickest first, so the Load tab shows each as
    it comes: ``problems`` (the dry run of from_pretrained's checks), ``weight_verdict`` and ``units`` (the weights'
    placement), then ``verdict`` and ``devices`` (the run at batch x context, one dry run of generate()).
    """

    def __init__(self, form: Form, code: str = "", error: str | None = None, plan: LoadPlan | None = None) -> None:
        self.form = form
        self.code = code
        self.error = error
        self.plan = plan

    @property
    def ok(self) -> bool:
        """Whether the form made a plan (problems may remain: they are the dry run's findings)."""
        return self.error is None

    @cached_property
    def problems(self) -> list[str]:
        """What transformers would refuse, one line each."""
        return self.plan.check() if self.plan is not None else []

    @cached_property
    def weight_verdict(self) -> str:
        """Where the weights go (no dry run of the run yet)."""
        placement = self._placement(run=False)
        return placement.verdict if placement is not None else ""

    @cached_property
    def units(self) -> list[Unit]:
        """The weights' placement as blocks in model order."""
        if self._placement(run=False) is None:
            return []
        with meta_build.quiet():
            return units(self.plan) if self.plan is not None else []

    @cached_property
    def verdict(self) -> str:
        """The verdict that counts the run (fits, fits up to N tokens, offloads, does not fit)."""
        placement = self._placement(run=True)
        return placement.verdict if placement is not None else ""

    @cached_property
    def devices(self) -> list[DeviceShare]:
        """Each device's weights, cache, activations and reserve against its budget."""
        placement = self._placement(run=True)
        return list(placement.devices) if placement is not None else []

    def _placement(self, *, run: bool) -> Placement | None:
        plan = self.plan
        if plan is None or not plan.config.available:
            return None
        return plan.placement if run else plan.weight_placement


# ---------------------------------------------------------------- the model


def cached_models() -> list[str]:
    """Hub model ids in the local HF cache with a config.json, most recently used first (nothing is fetched)."""

    try:
        cache = scan_cache_dir(constants.HF_HUB_CACHE)
    except Exception:  # no cache folder yet, or one huggingface_hub can't read: nothing cached to offer
        return []
    repos = [
        r
        for r in cache.repos
        if r.repo_type == "model" and any((rev.snapshot_path / "config.json").is_file() for rev in r.revisions)
    ]
    return [r.repo_id for r in sorted(repos, key=lambda r: r.last_accessed, reverse=True)]


def default_model() -> str:
    """The Load tab's first model: the most recently used cached one, else nbhw's tiny local model (built now)."""
    cached = cached_models()
    return cached[0] if cached else str(tiny_model_path())


def memory_pairs(value: Any) -> tuple[tuple[str, str], ...]:
    """max_memory as the form holds it, from a dict or DEV=SIZE words (checked by the plan, not here)."""
    if value is None:
        return ()
    if isinstance(value, dict):
        return tuple((str(k), str(v)) for k, v in value.items())
    items = [value] if isinstance(value, str) else list(value)
    return tuple((item.partition("=")[0].strip(), item.partition("=")[2].strip()) for item in items)


def form_words(values: Mapping[str, Any]) -> dict[str, Any]:
    """Plan keyword values (as nbhw.plan() or nbhw.panel() take them) as the words the controls hold."""
    words: dict[str, Any] = {}
    for name, value in values.items():
        declared = FORM_WORDS[name]
        if name in SIZES:
            words[name] = memory_pairs(value)
        elif name == "dtype":
            words[name] = None if value is None else str(value).removeprefix("torch.")
        else:
            words[name] = declared.word(value) if not isinstance(value, str) else value
    return words


# ---------------------------------------------------------------- choices


def target_device(device_map: str) -> str | None:
    """The device the attention and dtype advice are for: the one device_map names, else the advisor's pick."""
    if device_map == NO_DEVICE_MAP:
        return from_pretrained_default().device
    m = re.fullmatch(r"([a-z]+)(?::\d+)?", device_map)
    if m is None or m.group(1) not in device_types():
        return None  # a strategy, an index or a dict: the best usable device
    return device_map


def _device_options(hardware: Hardware, advice: AttentionAdvice) -> tuple[list[Option], str]:
    options = [Option(name, name) for name in strategy_names()]
    for device in hardware.devices:
        if device.device not in [o.value for o in options]:
            name = f" · {device.name}" if device.name and device.device != "cpu" else ""
            options.append(Option(device.device, f"{device.device}{name}"))
    default = from_pretrained_default().device
    options.append(Option(NO_DEVICE_MAP, f"none (from_pretrained loads on {default})"))
    return options, f"the dtype and attention advice below are for {advice.device}"


def _memory_fields(hardware: Hardware) -> list[MemoryField]:
    live = live_memory(hardware.backends)
    return [MemoryField(str(key), device_name(key, live.accelerator), free) for key, free in live.max_memory.items()]


def _quantization_options(hardware: Hardware, advice: AttentionAdvice) -> tuple[list[Option], str]:
    """The methods nbhw.quantization() finds transformers quantizes on load with, marked by its verdict."""
    found = quantization.advise(target=advice.target, dtype=advice.precision.dtype)
    short = {v: k for k, v in BITSANDBYTES_WORDS.items()}
    options = [Option(None, "none")]
    for row in found.rows:
        if not row.loads.quantizes_here:
            continue
        g = row.shown
        # On a target a package is yours to install there; here it is missing.
        ok = g.status is Status.WORKS or (advice.target is not None and g.status is Status.PACKAGE)
        reason = f"{g.status}: {g.why}" + (f"; fix: {g.fix}" if g.fix else "")
        word = short.get(row.method, row.method)
        options.append(Option(word, f"{g.status.mark} {word}" + _family(row), ok, reason))
    where = found.target or found.here
    return options, f"marks: transformers' own checks for {where} (%hw quantization lists every method and why)"


def _family(row: quantization.QuantRow) -> str:
    return "" if row.method not in BITSANDBYTES_WORDS.values() else " (bitsandbytes)"


def _attention_options(hardware: Hardware, advice: AttentionAdvice) -> tuple[list[Option], str]:
    options = [Option(None, f"default ({advice.default.resolves_to})", True, advice.default.reason)]
    for row in advice.rows:
        if row.kind == "paged":  # deprecated aliases of the rows above
            continue
        reason = f"{row.status}: {row.reason}" + (f"; fix: {row.fix}" if row.fix else "")
        options.append(Option(row.key, f"{row.status.mark} {row.key}", row.status.usable, reason))
    return options, ""


def dtype_options(advised: str) -> list[Option]:
    """The dtype dropdown: every dtype offered, the advised one marked."""
    return [Option(d, f"{d} (advised)" if d == advised else d) for d in OFFERED]


def _dtype_options(hardware: Hardware, advice: AttentionAdvice) -> tuple[list[Option], str]:
    advised = advice.precision.dtype
    found = target_of(advice.target)
    where = f"the {found.accelerator.name} ({advice.device})" if found is not None else advice.device
    return dtype_options(advised), f"advised for {where}: {advised} — {advice.precision.reason}"


def _target_label(target: Target) -> str:
    a = target.accelerator
    each = f"{a.memory_bytes / 1024**3:g} GiB" + (" each" if target.count > 1 else "")
    return f"{target.text} · {a.vendor} {a.device}, {each}"


def target_options() -> list[Option]:
    """This machine, then every catalog entry at the counts the dropdown offers (a Mac: one)."""
    options = [Option(None, THIS_MACHINE, True, "what nbhw detects here")]
    for a in catalog():
        for count in (1,) if a.unified_memory else TARGET_COUNTS:
            target = Target(a, count)
            options.append(Option(target.text, _target_label(target), True, target.not_here))
    return options


def _target_options(hardware: Hardware, advice: AttentionAdvice) -> tuple[list[Option], str]:
    found = target_of(advice.target)
    note = found.not_here if found is not None else "this machine: every figure is read here"
    return target_options(), note


def _cache_options(hardware: Hardware, advice: AttentionAdvice) -> tuple[list[Option], str]:
    options = [Option(None, "default (the model's own, usually dynamic)")]
    for impl in cache_implementations():
        options.append(Option(impl, impl))
    return options, "the cache generate() makes; the run counts it (an offloaded cache's host copies on the CPU)"


def _kernels_options(hardware: Hardware, advice: AttentionAdvice) -> tuple[list[Option], str]:
    default = advice.kernels.default
    said = "unknown" if default.value is None else ("on" if default.value else "off")
    options = [Option(None, f"default ({said} in this transformers)"), Option("True", "True"), Option("False", "False")]
    return options, f"use_kernels left out: {default.why}"


PADDING_LABELS = {
    "left": "left (default): a tokenizer's batch, padded to the longest prompt",
    "none": "none: every prompt the same length",
}


def _padding_options(hardware: Hardware, advice: AttentionAdvice) -> tuple[list[Option], str]:
    options = [Option(word, PADDING_LABELS[word]) for word in PADDING_WORDS]
    return options, "how a batch's prompts come to generate(); at batch 1 nothing is padded"


# What each dropdown offers here, and the note beside it, by argument name (a test checks every dropdown has one).
OPTIONS: dict[str, Callable[[Hardware, AttentionAdvice], tuple[list[Option], str]]] = {
    "target": _target_options,
    "dtype": _dtype_options,
    "device_map": _device_options,
    "attn_implementation": _attention_options,
    "quantization": _quantization_options,
    "cache_implementation": _cache_options,
    "use_kernels": _kernels_options,
    "padding": _padding_options,
}


def _advice(
    model: str, device: str | None, dtype: str | None, offline: bool, target: Target | None
) -> tuple[AttentionAdvice, str | None]:
    """The advisor's answer for the model; for the hardware alone when the model's config can't be read."""
    wanted = dtype if dtype in OFFERED else None
    where: dict[str, Any] = {"target": target} if target is not None else {"device": device}
    try:
        return advise(model, dtype=wanted, offline=offline, **where), None
    except UserError as exc:
        return advise(None, dtype=wanted, offline=True, **where), f"attention advice for any model: {exc}"


def _hardware(target: Target | None) -> Hardware:
    """What the controls offer devices and budgets from: this machine, or the rows detection would give on a target."""
    here = detect()
    return here if target is None else dataclasses.replace(here, backends=target.rows())


def choices(
    model: str, *, device_map: str = "auto", dtype: str | None = None, offline: bool = False, target: str | None = None
) -> Choices:
    """The options of every control for ``model`` here or on ``target``; advice for the device device_map names."""
    found = _target(target)
    hardware = _hardware(found)
    device = target_device(device_map) if found is None else None
    advice, problem = _advice(model, device, dtype, offline, found)
    options: dict[str, tuple[Option, ...]] = {}
    notes: dict[str, str] = {}
    for name, offer in OPTIONS.items():
        listed, notes[name] = offer(hardware, advice)
        options[name] = tuple(listed)
    if found is not None:
        notes["max_memory"] = f"the {found.accelerator.name}'s catalog memory is the budget (target or max_memory)"
    return Choices(
        model=model,
        target=advice.device,
        advised_dtype=advice.precision.dtype,
        options=options,
        notes=notes,
        memory=tuple(_memory_fields(hardware)) if found is None else (),
        problem=problem,
    )


def _target(target: str | None) -> Target | None:
    try:
        return target_of(target)
    except UserError:
        return None  # the plan reports the mistake in its one line; the controls offer this machine's choices


# ---------------------------------------------------------------- preview


def make_plan(form: Form) -> LoadPlan:
    """The plan a form asks for; a UserError naming the entry when one is a mistake."""
    if not form.model.strip():
        raise UserError("model: give a Hub id like 'org/name' or the folder of a local model")
    return plan(form.model.strip(), offline=form.offline, **form.plan_values())


def units(plan: LoadPlan) -> list[Unit]:
    """The placement as blocks in model order: each decoder layer, and each other module holding weights."""
    model, placement = plan.meta_model, plan.weight_placement
    if model is None or placement is None or not placement.device_map:
        return []
    sizes, _ = module_sizes(model, plan.quantizer, only_modules=False)
    layers = set(layer_names(model))
    found: list[Unit] = []
    inside: str | None = None
    for name, module in model.named_modules():
        if inside is not None and name.startswith(inside + "."):
            continue
        inside = None
        own = any(True for _ in module.parameters(recurse=False))
        if name in layers or (own and name):
            device = device_name(_device_of(name, placement.device_map), plan.placed.live.accelerator)
            found.append(Unit(name, device, int(sizes.get(name, 0)), name in layers))
            inside = name
    return found


def _device_of(module: str, device_map: dict[str, int | str]) -> int | str:
    """Where a module goes: the device_map entry with the longest prefix of its name, as accelerate expands it."""
    best, value = -1, next(iter(device_map.values()))
    for key, device in device_map.items():
        if (key in ("", module) or module.startswith(key + ".")) and len(key) > best:
            best, value = len(key), device
    return value


def preview(form: Form) -> Preview:
    """The code of a form, and its findings on first use; a Preview holding a one-line message when an entry is a
    mistake."""
    try:
        plan = make_plan(form)
        code = plan.code.rstrip("\n")
    except UserError as exc:
        return Preview(form, error=str(exc))
    return Preview(form, code=code, plan=plan)


def size_notes(plan: LoadPlan) -> dict[str, str]:
    """The notes beside the run's size controls: what each means for this model, and its default."""
    limit = plan.inputs.context_limit
    most = f"; this model takes at most {limit:,}" if limit and limit < run_search.NO_LIMIT else ""
    default = f" (default {plan.context:,})" if plan.args.context is None else ""
    notes = {
        "context": f"tokens per sequence, prompt + generated: 4096, 32k, 128k{default}{most}",
        "batch": "sequences generated together (default 1)",
    }
    model = plan.meta_model
    if not plan.config.available or not getattr(plan.config.config, "is_encoder_decoder", False):
        notes["encoder_length"] = "encoder-decoder models only (T5, Whisper): not used by this model"
    elif model is not None and run_parts.fixed_encoder_length(model) is not None:
        notes["encoder_length"] = f"fixed for this encoder: {run_parts.fixed_encoder_length(model):,} positions"
    else:
        notes["encoder_length"] = "tokens the encoder reads (default: the context)"
    return notes


_rows: Recent[list[BackendStatus]] = Recent(1)
ROWS_SECONDS = 2.0  # the backend rows read for the code of one change serve the next ones that quick


def quick_dtype(form: Form) -> str | None:
    """The advised dtype for the device the form's device_map names, from the precision advice alone (no attention
    rows: the code can show before the choices are known) and the backend rows (not the rest of detection: who
    picks what, the doctor's checks); None when the device can't be read. A catalog target's is its own (a T4:
    float16), from the catalog alone."""
    try:
        found = target_of(form.target)
        if found is not None:
            target = catalog_target(found)
        else:
            rows = _rows.get(int(time.monotonic() / ROWS_SECONDS), backends.probe_all)
            target = parse_device(target_device(form.device_map), rows)
    except UserError:
        return None
    return precision.advise(target.device, target.device_type, target.info, target.count).dtype
