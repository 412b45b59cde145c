"""The Load tab without widgets: what its controls offer on this machine, and what a filled-in form previews.

:func:`choices` reads the options from what nbhw detects here (usable devices, free memory, bitsandbytes) and from
the attention advisor (which ``attn_implementation`` works, the advised dtype); :func:`preview` turns a
:class:`Form` into the plan's code, dry-run problems, estimate and placement, or into a one-line message when an
entry is a mistake. Nothing here raises for a user's entry and nothing imports a UI library.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from nbhw.core.errors import UserError

if TYPE_CHECKING:
    from nbhw.core.advice.attention import AttentionAdvice
    from nbhw.core.hardware.detect import Hardware
    from nbhw.core.plan.load_plan import LoadPlan

NO_DEVICE_MAP = "none"
DTYPES = ("auto", "float32", "float16", "bfloat16")


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
    """What the controls offer for one model on this machine, and the advice behind the defaults."""

    model: str
    target: str
    device_maps: tuple[Option, ...]
    dtypes: tuple[Option, ...]
    advised_dtype: str
    dtype_reason: str
    attention: tuple[Option, ...]
    quantizations: tuple[Option, ...]
    quantization_note: str
    memory: tuple[MemoryField, ...]
    problem: str | None = None

    def attention_option(self, value: str | None) -> Option | None:
        """The attention entry for a value, if the advisor has a row for it."""
        return next((o for o in self.attention if o.value == value), None)


@dataclass(frozen=True)
class Form:
    """What the Load tab's controls hold, in the words of ``%hw load``.

    ``device_map`` is a word (a strategy, a device, an int, a dict literal, or "none"); ``dtype`` None means the
    advised dtype; ``max_memory`` pairs a max_memory key ("0", "cpu") with a size as typed ("" = not set).
    """

    model: str
    device_map: str = "auto"
    dtype: str | None = None
    attn_implementation: str | None = None
    use_kernels: bool = False
    quantization: str | None = None
    max_memory: tuple[tuple[str, str], ...] = ()
    offline: bool = False

    def with_dtype(self, dtype: str) -> Form:
        """The same form with a dtype (used to settle an unset dtype on the advised one)."""
        return replace(self, dtype=dtype)

    def memory_budget(self) -> dict[str, int | str] | None:
        """The max_memory the form gives, sizes as typed (digits alone are bytes); None when none is set."""
        sizes = {key.strip(): size.strip() for key, size in self.max_memory if size.strip()}
        budget: dict[str, int | str] = {k: int(v) if v.isdigit() else v for k, v in sizes.items()}
        return budget or None


@dataclass(frozen=True)
class Unit:
    """One block of the placement picture: a decoder layer, or a module outside the layers that holds weights."""

    name: str
    device: str
    bytes: int
    layer: bool


@dataclass
class Preview:
    """What a form gives: the cell's code and the plan's findings, or the message saying which entry is wrong."""

    form: Form
    code: str = ""
    error: str | None = None
    problems: list[str] = field(default_factory=list)
    verdict: str = ""
    units: list[Unit] = field(default_factory=list)
    plan: LoadPlan | None = None

    @property
    def ok(self) -> bool:
        """Whether the form made a plan (problems may remain: they are the dry run's findings)."""
        return self.error is None


# ---------------------------------------------------------------- the model


def cached_models() -> list[str]:
    """Hub model ids in the local HF cache with a config.json, most recently used first (nothing is fetched)."""
    from huggingface_hub import constants, scan_cache_dir

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
    if cached:
        return cached[0]
    from nbhw.core.hf.tiny_model import tiny_model_path

    return str(tiny_model_path())


# ---------------------------------------------------------------- words <-> values


def device_map_word(value: Any) -> str:
    """The word for a device_map value as from_pretrained takes it (None -> "none", dicts as literals)."""
    from nbhw.core.plan import codegen

    if value is None:
        return NO_DEVICE_MAP
    if isinstance(value, str):
        return value
    return codegen.py_literal(value)


def memory_pairs(value: Any) -> tuple[tuple[str, str], ...]:
    """max_memory as the form holds it, from a dict or DEV=SIZE words (checked by the plan, not here)."""
    if value is None:
        return ()
    if isinstance(value, dict):
        return tuple((str(k), str(v)) for k, v in value.items())
    items = [value] if isinstance(value, str) else list(value)
    return tuple((item.partition("=")[0].strip(), item.partition("=")[2].strip()) for item in items)


# ---------------------------------------------------------------- choices


def target_device(device_map: str, hardware: Hardware) -> str | None:
    """The device the attention and dtype advice are for: the one device_map names, else the advisor's pick."""
    if device_map == NO_DEVICE_MAP:
        from nbhw.core.hardware.who_picks import from_pretrained_default

        return from_pretrained_default().device
    from nbhw.core.advice.attention_rules import device_types

    m = re.fullmatch(r"([a-z]+)(?::\d+)?", device_map)
    if m is None or m.group(1) not in device_types():
        return None  # a strategy, an index or a dict: the best usable device
    return device_map


def _device_options(hardware: Hardware) -> list[Option]:
    from nbhw.core.plan.arguments import strategy_names

    options = [Option(name, name) for name in strategy_names()]
    for device in hardware.devices:
        if device.device not in [o.value for o in options]:
            name = f" · {device.name}" if device.name and device.device != "cpu" else ""
            options.append(Option(device.device, f"{device.device}{name}"))
    from nbhw.core.hardware.who_picks import from_pretrained_default

    default = from_pretrained_default().device
    options.append(Option(NO_DEVICE_MAP, f"none (from_pretrained loads on {default})"))
    return options


def _memory_fields(hardware: Hardware) -> list[MemoryField]:
    from nbhw.core.plan.placement import device_name, live_memory

    live = live_memory(hardware.backends)
    return [MemoryField(str(key), device_name(key, live.accelerator), free) for key, free in live.max_memory.items()]


def bitsandbytes_here() -> tuple[bool, str]:
    """Whether bitsandbytes quantization can run here, by transformers' own checks (no device is touched)."""
    from transformers.utils import import_utils

    if not import_utils.is_bitsandbytes_available():
        return False, (
            "4-bit / 8-bit need bitsandbytes>="
            f"{import_utils.BITSANDBYTES_MIN_VERSION}, which is not installed here (pip install -U bitsandbytes)"
        )
    from transformers.integrations import validate_bnb_backend_availability

    try:
        usable = bool(validate_bnb_backend_availability(raise_exception=False))
    except Exception as exc:  # bitsandbytes' own import can fail in many ways; the reason is what matters
        return False, f"bitsandbytes is installed but cannot run here: {type(exc).__name__}: {exc}"
    if not usable:
        return False, "bitsandbytes is installed but has no backend for the devices here"
    return True, "bitsandbytes can run here"


def _quantization_options() -> tuple[list[Option], str]:
    from nbhw.core.plan.arguments import QUANTIZATION

    options = [Option(None, "none")]
    usable, note = bitsandbytes_here()
    if usable:
        options += [Option(q, f"{q[0]}-bit (bitsandbytes)") for q in QUANTIZATION]
    return options, note


def _attention_options(advice: AttentionAdvice) -> list[Option]:
    options = [Option(None, f"default ({advice.default.resolves_to})", True, advice.default.reason)]
    for row in advice.rows:
        if row.kind == "paged":  # deprecated aliases of the rows above
            continue
        reason = f"{row.status}: {row.reason}" + (f"; fix: {row.fix}" if row.fix else "")
        options.append(Option(row.key, f"{row.status.mark} {row.key}", row.status.usable, reason))
    return options


def _advice(model: str, device: str | None, dtype: str | None, offline: bool) -> tuple[AttentionAdvice, str | None]:
    """The advisor's answer for the model; for the hardware alone when the model's config can't be read."""
    from nbhw.core.advice.attention import advise

    wanted = dtype if dtype in DTYPES else None
    try:
        return advise(model, device=device, dtype=wanted, offline=offline), None
    except UserError as exc:
        return advise(None, device=device, dtype=wanted, offline=True), f"attention advice for any model: {exc}"


def choices(model: str, *, device_map: str = "auto", dtype: str | None = None, offline: bool = False) -> Choices:
    """The options of every control for ``model`` on this machine; the advice is for the device device_map names."""
    from nbhw.core.hardware.detect import detect

    hardware = detect()
    advice, problem = _advice(model, target_device(device_map, hardware), dtype, offline)
    advised = advice.precision.dtype
    dtypes = [Option(d, f"{d} (advised)" if d == advised else d) for d in DTYPES]
    quantizations, note = _quantization_options()
    return Choices(
        model=model,
        target=advice.device,
        device_maps=tuple(_device_options(hardware)),
        dtypes=tuple(dtypes),
        advised_dtype=advised,
        dtype_reason=advice.precision.reason,
        attention=tuple(_attention_options(advice)),
        quantizations=tuple(quantizations),
        quantization_note=note,
        memory=tuple(_memory_fields(hardware)),
        problem=problem,
    )


# ---------------------------------------------------------------- preview


def make_plan(form: Form) -> LoadPlan:
    """The plan a form asks for; a UserError naming the entry when one is a mistake."""
    from nbhw.core.plan.arguments import device_map_from_text
    from nbhw.core.plan.load_plan import plan

    if not form.model.strip():
        raise UserError("model: give a Hub id like 'org/name' or the folder of a local model")
    return plan(
        form.model.strip(),
        device_map=device_map_from_text(form.device_map),
        dtype=form.dtype or "auto",
        attn_implementation=form.attn_implementation,
        use_kernels=form.use_kernels,
        quantization=form.quantization,
        max_memory=form.memory_budget(),
        offline=form.offline,
    )


def units(plan: LoadPlan) -> list[Unit]:
    """The placement as blocks in model order: each decoder layer, and each other module holding weights."""
    from transformers.integrations.accelerate import compute_module_sizes

    from nbhw.core.plan.placement import _layer_names, device_name

    model, placement = plan.meta_model, plan.placement
    if model is None or placement is None or not placement.device_map:
        return []
    sizes, _ = compute_module_sizes(model, plan.quantizer, only_modules=False)
    layers = set(_layer_names(model))
    found: list[Unit] = []
    inside: str | None = None
    for name, module in model.named_modules():
        if inside is not None and name.startswith(inside + "."):
            continue
        inside = None
        own = any(True for _ in module.parameters(recurse=False))
        if name in layers or (own and name):
            device = device_name(_device_of(name, placement.device_map), plan.live.accelerator)
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
    """The code and findings of a form; a Preview holding a one-line message when an entry is a mistake."""
    from nbhw.core.hf import meta_build

    try:
        plan = make_plan(form)
        code = plan.code.rstrip("\n")
        problems = plan.check()
        placement = plan.placement if plan.config.available else None
        with meta_build.quiet():
            blocks = units(plan) if placement is not None else []
    except UserError as exc:
        return Preview(form, error=str(exc))
    verdict = placement.verdict if placement is not None else ""
    return Preview(form, code=code, problems=problems, verdict=verdict, units=blocks, plan=plan)
