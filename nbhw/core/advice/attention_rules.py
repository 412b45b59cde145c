"""Reading transformers' attention rules for one target device and model, then checking each key with a meta build.

Every rule comes from the installed transformers: the keys from its attention registry, the flash-attention rules
from its compatibility matrix, the Hub fallbacks from its kernel tables. Where a build here can answer (the row
doesn't depend on a device this process can't see, and nothing would be downloaded), :func:`check` builds the model
on the meta device with that ``attn_implementation`` (:func:`nbhw.core.hf.meta_build.build`, the validation
``from_pretrained`` runs) and reports what transformers did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from nbhw.core.advice.status import Status
from nbhw.core.errors import UserError
from nbhw.core.hardware import backends
from nbhw.core.hardware.data import BackendStatus, DeviceInfo
from nbhw.core.hardware.targets import Target as CatalogTarget
from nbhw.core.hf import flash4, kernel_tables, meta_build, model_config, tiny_model
from nbhw.core.hf.as_if import AsIf, TargetDevice

NO_SUPPORT = "this model class does not support it"
GENERATIONS = {8: "Ampere", 9: "Hopper", 10: "Blackwell"}
# flash-attn 2 itself runs only on Ampere or newer; transformers' matrix doesn't check it, so the load succeeds.
FA2_MIN_MAJOR = 8
# flash-attn 3 (Ampere to Hopper) and 4 (Hopper, Blackwell) are CUDA kernels; on ROCm, torch.cuda reports HIP's gfx
# arch as a capability (gfx942 -> 9.4), so transformers' capability check passes there. From flash-attention's
# README and Dao-AILab/flash-attention#1089 (FA3 for ROCm: open; AMD's FAv3 kernels live in aiter instead).
CUDA_ONLY_FLASH = (3, 4)
FLASH_KEY = re.compile(r"^flash_attention_(\d+)$")

# ---------------------------------------------------------------- the target device


@dataclass
class Target:
    """The device the advice is for, and whether transformers in this process sees that kind of device."""

    device: str
    device_type: str
    backend: str
    present: bool
    info: DeviceInfo | None
    count: int
    live: bool
    seen: str
    catalog: CatalogTarget | None = None  # a target from nbhw's catalog: hardware that is not here

    @property
    def capability(self) -> tuple[int, int] | None:
        """(major, minor) as torch.cuda.get_device_capability reports it (NVIDIA, or ROCm's gfx arch)."""
        cc = self.info.compute_capability if self.info else None
        if not cc:
            return None
        if cc.startswith("gfx") and len(cc) >= 5:
            try:
                return int(cc[3:-2]), int(cc[-2], 16)
            except ValueError:
                return None
        major, _, minor = cc.partition(".")
        return (int(major), int(minor or 0)) if major.isdigit() else None


def device_types() -> list[str]:
    """The device strings nbhw accepts: every backend's device, and 'rocm' for an AMD GPU (whose device is cuda)."""
    found = []
    for b in backends.registry():
        if b.device not in found:
            found.append(b.device)
    return [*found, "rocm"]


def _transformers_device() -> str:
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.utils.import_utils import get_device_type

    return str(get_device_type())


def _default_device(rows: list[BackendStatus]) -> str:
    for row in (r for r in rows if r.usable):
        if row.key != "cpu" and row.devices:
            return "rocm:0" if row.key == "rocm" else row.devices[0].device
    return "cpu"


def parse_device(text: str | None, rows: list[BackendStatus]) -> Target:
    """A device string ('cuda:1', 'cpu', 'mps', 'rocm') as a Target on the machine whose backend rows are ``rows``
    (``detect().backends``; None: the best usable device); a UserError naming valid ones otherwise."""
    text = (text or _default_device(rows)).strip()
    valid = device_types()
    m = re.fullmatch(r"([a-z]+)(?::(\d+))?", text)
    if m is None or m.group(1) not in valid:
        names = ", ".join(f"{t}, {t}:N" if t not in {"cpu", "mps", "rocm"} else t for t in valid)
        raise UserError(f"unknown device {text!r}; valid: {names}")
    kind, index = m.group(1), int(m.group(2) or 0)
    rocm_usable = any(r.key == "rocm" and r.usable for r in rows)
    backend = "rocm" if kind == "rocm" or (kind == "cuda" and rocm_usable) else kind
    row = next((r for r in rows if r.key == backend), None)
    devices = row.devices if row is not None and row.usable else []
    device = f"cuda:{index}" if kind == "rocm" else (kind if kind in {"cpu", "mps"} else f"{kind}:{index}")
    device_type = "rocm" if backend == "rocm" else kind
    seen = _transformers_device()
    return Target(
        device=device,
        device_type=device_type,
        backend=backend,
        present=index < len(devices),
        info=devices[index] if index < len(devices) else None,
        count=len(devices),
        # A build answers for the target only if transformers sees that kind of device and the device is here.
        live=seen == device_type and index < len(devices),
        seen=seen,
    )


def catalog_target(target: CatalogTarget) -> Target:
    """A catalog target as the advisor's Target: the fields detection fills, from the catalog, never present."""
    info = target.devices()[0]
    return Target(
        device=info.device, device_type=target.device_type, backend=target.accelerator.backend, present=False,
        info=info, count=target.count, live=False, seen=_transformers_device(), catalog=target,
    )  # fmt: skip


def described(t: Target) -> TargetDevice | None:
    """The device transformers' checks should see for ``t`` (None: this CPU-only machine, checked for real).

    A device detection found is described from what detection read (NVML's compute capability), so a check
    never initialises CUDA here either.
    """
    if t.catalog is not None:
        return t.catalog.device()
    if t.device_type == "cpu":
        return None
    info = t.info
    name = info.name if info and info.name else t.device
    total = info.total_memory if info and info.total_memory else 0
    return TargetDevice(t.device_type, max(t.count, 1), t.capability, name, total)


# ---------------------------------------------------------------- the model


@dataclass
class ModelFacts:
    """The model class the advice is for and its own support flags."""

    model: str | None
    source: str | None
    class_name: str
    auto_class: str
    supports_sdpa: bool
    supports_flash: bool
    supports_flex: bool
    compatible_flash: list[str] | None
    config: Any = field(repr=False)

    @property
    def reference(self) -> bool:
        """True when no model was given and the reference class stands in for 'any model that supports all'."""
        return self.model is None


def model_facts(model: str | None, offline: bool) -> ModelFacts:
    """The config (offline unless allowed) and the class flags; the tiny Qwen3's config when no model is given."""

    if model is None:
        config, source = tiny_model.tiny_config(), None
    else:
        found = model_config.load(model, offline=offline)
        if not found.available:
            raise UserError(f"{model}: {found.problem}")
        config, source = found.config, found.source
    auto = meta_build.auto_class_name(config)
    try:
        cls = meta_build.model_class(config, auto)
    except KeyError:
        raise UserError(f"{model}: transformers has no {auto} for model type {config.model_type!r}") from None
    compatible = getattr(cls, "_compatible_flash_implementations", None)
    return ModelFacts(
        model=model,
        source=source,
        class_name=cls.__name__,
        auto_class=auto,
        supports_sdpa=bool(cls._supports_sdpa),
        supports_flash=bool(cls._supports_flash_attn),
        supports_flex=bool(cls._supports_flex_attn),
        compatible_flash=list(compatible) if compatible else None,
        config=config,
    )


# ---------------------------------------------------------------- reading transformers' rules


@dataclass
class Verdict:
    """What transformers' rules say about one key on the target, before any build."""

    status: Status
    reason: str
    fix: str | None = None
    device_dependent: bool = False
    downloads: str | None = None
    runtime: bool = False
    resolves_to: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Env:
    """Everything the rules read, gathered once."""

    target: Target
    model: ModelFacts
    dtype: str
    kernels_ok: bool
    kernels_why: str
    kernels_range: tuple[str, str]
    fallback: dict[str, str]
    kernel_devices: dict[str, tuple[str, ...]]


def _matrix() -> dict[int, dict[str, Any]]:
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.modeling_flash_attention_utils import FLASH_ATTENTION_COMPATIBILITY_MATRIX

    return dict(FLASH_ATTENTION_COMPATIBILITY_MATRIX)


def flash_package(version: int) -> str:
    """The pip name of FlashAttention N's package, as transformers' matrix checks it ('flash-attn-3', ...)."""
    check = _matrix()[version]["pkg_availability_check"]
    names = [c for c in check.__code__.co_consts if isinstance(c, str) and c.startswith("flash-attn")]
    return names[0] if names else "flash-attn"


def _device_name(check: Any) -> str:
    m = re.search(r"is_torch_(\w+?)_available", getattr(check, "__name__", ""))
    return m.group(1) if m else "?"


def kernels_install(env: Env) -> str:
    low, high = env.kernels_range
    return f"pip install 'kernels>={low},<{high}'"


def _generation(major: int) -> str:
    name = GENERATIONS.get(major)
    return f"{name} (compute capability {major}.0)" if name else f"compute capability {major}.0"


def _hub_repo(key: str) -> str:
    return key.partition(":")[0].partition("@")[0]


def _dtype_note(env: Env, verdict: Verdict) -> None:
    if env.dtype not in {"float16", "bfloat16"}:
        verdict.notes.append(
            f"dtype {env.dtype}: transformers only warns at load, but flash kernels run in float16/bfloat16 only"
        )
        verdict.fix = verdict.fix or "load with dtype=torch.bfloat16 (or float16), or run under torch.autocast"


def _flash_rule(key: str, version: int, env: Env) -> Verdict:
    """flash_attention_N on the target; for a catalog target, with its package installed there."""
    t = env.target
    here = meta_build.flash_package_installed(version)
    verdict = _flash_verdict(key, version, env, here or t.catalog is not None)
    if t.catalog is not None and not here and verdict.status is Status.WORKS:
        package = flash_package(version)
        verdict.fix = f"pip install {requirement(version, t)} on the {t.catalog.accelerator.name}"
        verdict.notes.append(f"{package} is not installed here: this is transformers' rule with it installed there")
    return verdict


def _flash_verdict(key: str, version: int, env: Env, installed: bool) -> Verdict:
    """flash_attention_N, in the order _check_and_adjust_attn_implementation and _flash_attn_import_error use."""
    t, m = env.target, env.model
    entry = _matrix()[version]
    family = "cuda" if t.device_type in {"cuda", "rocm"} else t.device_type
    names = [name for _, name in entry["supported_devices"]]
    custom = [_device_name(check) for check, _ in entry.get("custom_supported_devices", ())]
    package = flash_package(version)
    general = installed and family in names and family not in custom
    repo = env.fallback.get(key)
    where = ", ".join(names)
    if not m.supports_flash:
        return Verdict(Status.WONT, f"{m.class_name} does not support flash attention", f"{NO_SUPPORT}; use sdpa")
    if not general and env.kernels_ok and family != "npu" and repo:
        return _fallback_rule(key, repo, env, installed)
    if family in custom:
        if family == "xpu":
            why = f"on XPU, {key} comes from {repo} through the kernels package; {env.kernels_why}"
            return Verdict(Status.WONT, why, kernels_install(env), device_dependent=True)
        why = f"transformers' own FlashAttention{version} for {t.device_type}"
        verdict = Verdict(Status.WORKS, why, device_dependent=True)
        _dtype_note(env, verdict)
        return verdict
    if not installed:
        fix = f"pip install {package}"
        if repo and t.device_type in env.kernel_devices.get(repo, (t.device_type,)):
            fix += f", or {kernels_install(env)} to load {repo} from the Hub instead"
        if family not in names:
            fix += f"; FlashAttention{version} needs a {where} device, so on {t.device_type} use sdpa"
        # transformers checks the package before the device, so the answer is the same on every device.
        return Verdict(Status.WONT, f"the {package} package is not installed", fix)
    if family not in names:
        why = f"FlashAttention{version} runs on {where} only, not {t.device_type}"
        return Verdict(Status.WONT, why, "use sdpa on this device", device_dependent=True)
    return _capability_rule(key, version, entry.get("cuda_min_major_version"), env)


def _capability_rule(key: str, version: int, min_major: int | None, env: Env) -> Verdict:
    t = env.target
    if t.device_type not in {"cuda", "rocm"}:
        verdict = Verdict(
            Status.WORKS, f"FlashAttention{version} package installed; {t.device_type} is supported", None, True
        )
        _dtype_note(env, verdict)
        return verdict
    need = min_major
    runtime = False
    if need is None and version == 2 and t.device_type == "cuda":
        need, runtime = FA2_MIN_MAJOR, True
    cc = t.capability
    # For a target the package is assumed installed there, and its NVIDIA-only kernels would not be; on a ROCm
    # machine whose package is installed, transformers' answer stands (the README: Dao-AILab/flash-attention#1089).
    if t.device_type == "rocm" and version in CUDA_ONLY_FLASH and t.catalog is not None:
        shown = t.info.compute_capability if t.info else "gfx"
        why = (
            f"FlashAttention{version} is built for NVIDIA GPUs only (flash-attention's README); transformers' check "
            f"passes on ROCm, where {shown} reads as compute capability {cc[0] if cc else '?'}.x"
        )
        return Verdict(Status.WONT, why, "use flash_attention_2 or sdpa on ROCm", device_dependent=True)
    if need is not None and cc is None:
        why = f"needs {_generation(need)} or newer; {t.device} is not here to check"
        return Verdict(Status.DEPENDS, why, f"use it on a {GENERATIONS.get(need, 'newer')} or newer GPU", True)
    if need is not None and cc is not None and cc[0] < need:
        shown = t.info.compute_capability if t.info else f"{cc[0]}.{cc[1]}"
        why = f"FlashAttention{version} needs {_generation(need)} or newer; {t.device} has {shown}"
        if runtime:
            why = f"transformers loads it, but flash-attn 2 needs {_generation(need)} or newer; {t.device} has {shown}"
        fix = f"use sdpa on this GPU, or a {GENERATIONS.get(need, 'newer')} or newer GPU"
        return Verdict(Status.WONT, why, fix, device_dependent=True, runtime=runtime)
    shown = t.info.compute_capability if t.info else "?"
    if version == 4 and cc is not None:
        refused = _flash4_refuses(cc, shown or "?", t)
        if refused is not None:
            return refused
    verdict = Verdict(
        Status.WORKS, f"{flash_package(version)} installed; {t.device} ({shown}) is supported", None, True
    )
    if version == 4 and cc is not None and (first := flash4.since(cc[0])) is not None:
        verdict.notes.append(
            f"flash-attn-4 runs on compute capability {cc[0]}.x from {first} on (Dao-AILab/flash-attention#2329); "
            f"earlier releases refuse it at the first forward"
        )
    _dtype_note(env, verdict)
    return verdict


def requirement(version: int, t: Target) -> str:
    """What to pip install for FlashAttention ``version`` on the target: the package, at the first release that
    runs on the target's GPU where that is not the first release (flash-attn-4 on consumer Blackwell)."""
    package = flash_package(version)
    first = flash4.since(t.capability[0]) if version == 4 and t.capability is not None else None
    return f"'{package}>={first}'" if first else package


def _flash4_refuses(cc: tuple[int, int], shown: str, t: Target) -> Verdict | None:
    """The flash-attn-4 installed here, on a GPU here that its forward pass refuses (read from its source)."""
    found = flash4.installed() if t.catalog is None else None
    if found is None or cc[0] in found.majors:
        return None
    runs = ", ".join(f"{m}.x" for m in found.majors)
    why = (
        f"transformers loads it, but flash-attn-4 {found.version} runs on compute capability {runs} only (its "
        f"interface.py refuses {t.device} ({shown}) at the first forward)"
    )
    first = flash4.since(cc[0])
    fix = f"pip install -U 'flash-attn-4>={first}'" if first else "use flash_attention_2 or sdpa on this GPU"
    return Verdict(Status.WONT, why, fix, device_dependent=True, runtime=True)


def _fallback_rule(key: str, repo: str, env: Env, installed: bool) -> Verdict:
    t = env.target
    reason = (
        f"the {flash_package(int(key[-1]))} package is not installed"
        if not installed
        else f"{flash_package(int(key[-1]))} can't run on {t.device_type}"
    )
    devices = env.kernel_devices.get(repo)
    if devices and t.device_type not in devices:
        why = f"{reason}; transformers would fetch {repo}, which has builds for {', '.join(devices)} only"
        return Verdict(Status.WONT, why, "use sdpa on this device", device_dependent=True, downloads=repo)
    why = f"{reason}: transformers downloads {repo} from the Hub at load (kernels is installed)"
    verdict = Verdict(Status.HUB, why, None, device_dependent=True, downloads=repo, resolves_to=repo)
    _dtype_note(env, verdict)
    return verdict


def _hub_rule(key: str, env: Env) -> Verdict:
    """An "org/repo[@rev][:func]" value: transformers loads it with the kernels package at load time."""
    t, m = env.target, env.model
    repo = _hub_repo(key)
    if not m.supports_flash and "flash" in key:
        return Verdict(Status.WONT, f"{m.class_name} does not support flash attention, so not {repo}", f"{NO_SUPPORT}")
    if not env.kernels_ok:
        return Verdict(Status.WONT, env.kernels_why, kernels_install(env))
    devices = env.kernel_devices.get(repo)
    if devices and t.device_type not in devices:
        why = f"{repo} has builds for {', '.join(devices)} only, not {t.device_type}"
        return Verdict(Status.WONT, why, "use sdpa on this device", device_dependent=True, downloads=repo)
    verdict = Verdict(Status.HUB, f"transformers downloads {repo} from the Hub at load", None, True, downloads=repo)
    trusted = repo.split("/")[0] == kernel_tables.TRUSTED_ORG or key in (m.compatible_flash or [])
    if not trusted:
        verdict.fix = f"pass allow_all_kernels=True: only {kernel_tables.TRUSTED_ORG} repos are trusted without it"
    if not devices:
        verdict.notes.append(f"whether {repo} has a build for {t.device_type} is known only at load (network)")
    return verdict


def rule(key: str, env: Env) -> Verdict:
    """What transformers' rules say about ``attn_implementation=key`` on the target device."""
    m, t = env.model, env.target
    if key.startswith("paged|") and key != "paged|eager":
        base = key.removeprefix("paged|")
        verdict = rule(base, env)
        verdict.resolves_to = verdict.resolves_to or base
        verdict.notes.append("deprecated alias: transformers strips 'paged|' (FutureWarning)")
        return verdict
    if m.compatible_flash and "flash" in key and key not in m.compatible_flash:
        switched = _compatible_switch(env)
        verdict = rule(switched, env)
        verdict.resolves_to = switched
        verdict.notes.append(f"{m.class_name} lists {m.compatible_flash}: transformers switches {key} to {switched}")
        return verdict
    flash = FLASH_KEY.match(key)
    if flash and int(flash.group(1)) in _matrix():
        return _flash_rule(key, int(flash.group(1)), env)
    if meta_build.is_hub_kernel(key):
        return _hub_rule(key, env)
    if key == "sdpa" and not m.supports_sdpa:
        return Verdict(Status.WONT, f"{m.class_name} has no sdpa attention", f"{NO_SUPPORT}; use eager")
    if key == "flex_attention":
        if not m.supports_flex:
            other = "sdpa" if m.supports_sdpa else "eager"
            return Verdict(Status.WONT, f"{m.class_name} has no flex_attention", f"{NO_SUPPORT}; use {other}")
        if t.device_type == "tpu":
            # transformers' is_torch_flex_attn_available: torch's flex_attention refuses TPU tensors.
            return Verdict(Status.WONT, "torch's flex_attention does not run on TPU", "use sdpa", device_dependent=True)
    return Verdict(Status.WORKS, _works_reason(key))


def _works_reason(key: str) -> str:
    reasons = {
        "eager": "plain PyTorch attention: every model, every device",
        "sdpa": "torch.nn.functional.scaled_dot_product_attention (the default)",
        "flex_attention": "torch's flex_attention",
        "paged|eager": "eager attention over a paged KV cache (continuous batching)",
    }
    return reasons.get(key, "registered in transformers' AttentionInterface")


def _compatible_switch(env: Env) -> str:
    """transformers' pick among a model's _compatible_flash_implementations: the first with builds for the device."""
    listed = env.model.compatible_flash or []
    dev = env.target.device_type
    fits = [i for i in listed if dev in env.kernel_devices.get(env.fallback.get(i, i), (dev,))]
    return (fits or listed)[0]


# ---------------------------------------------------------------- checking as if on a target


def transformers_flash_check(version: int, device: TargetDevice) -> str | None:
    """transformers' own ``_flash_attn_import_error`` as if on ``device`` with the package installed: its refusal."""
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.modeling_utils import PreTrainedModel

    entry = dict(_matrix()[version])
    run = AsIf(device, answers={"is_flash_attn_greater_or_equal": lambda *a, **k: True})
    entry["general_availability_check"] = lambda *a, **k: False  # so transformers walks its reasons one by one
    entry["pkg_availability_check"] = lambda *a, **k: True  # the package, installed on the target
    entry["supported_devices"] = tuple((run.device_check(c.__name__), n) for c, n in entry["supported_devices"])
    custom = entry.get("custom_supported_devices", ())
    entry["custom_supported_devices"] = tuple((run.device_check(c.__name__), m) for c, m in custom)
    try:
        run.call(PreTrainedModel._flash_attn_import_error, None, **entry)
    except ImportError as exc:
        return " ".join(str(exc).split())
    return None


def _checked_as_if(row: AttentionRow, v: Verdict, version: int, target: CatalogTarget) -> AttentionRow:
    refused = transformers_flash_check(version, target.device())
    row.checked = True
    row.check = (
        f"transformers' own check (_flash_attn_import_error) run as if on the {target.accelerator.name}, "
        f"{flash_package(version)} installed there"
    )
    if refused and v.status in {Status.WORKS, Status.HUB}:
        row.status, row.reason = Status.WONT, _first_sentence(refused.split("error: ", 1)[-1])
        row.notes.append(f"nbhw's reading of transformers' rules said {v.status}: {v.reason}")
    elif not refused and v.status is Status.WONT:
        row.notes.append("transformers' own check accepts it: the refusal is nbhw's documented gate")
    return row


# ---------------------------------------------------------------- checking with a meta build


@dataclass
class AttentionRow:
    """One attn_implementation value: whether it works on the target, why, the fix, and how that was checked."""

    key: str
    kind: str
    status: Status
    reason: str
    fix: str | None
    checked: bool
    check: str
    resolves_to: str | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)


def build_for(key: str | None, env: Env) -> meta_build.MetaBuild:
    return meta_build.build(env.model.config, dtype=env.dtype, attn_implementation=key, auto_name=env.model.auto_class)


def _first_sentence(text: str) -> str:
    head = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    return head if len(head) <= 240 else head[:237] + "..."


def unseen(t: Target) -> bool:
    """Whether the target is an accelerator nbhw knows nothing of: not here, and not named from the catalog (a bare
    index in max_memory on a machine without one, a device=cuda:3 beyond this machine's GPUs)."""
    return t.catalog is None and t.info is None and t.device_type != "cpu"


def _unseen_verdict(key: str, v: Verdict, t: Target) -> Verdict:
    """A device-dependent key on an unseen accelerator: what works everywhere is advised, and why."""
    why = (
        f"{t.device} is not here to check: which GPU it is (its kind, compute capability and the kernels built "
        f"for it) decides whether {key} loads, so nbhw advises sdpa, which works on every device"
    )
    rules = f"transformers' rules for a {t.device_type} device: {v.status}: {v.reason}"
    fix = "use sdpa, or name the hardware with target= (nbhw.targets() lists it) for advice on its kind"
    return Verdict(Status.DEPENDS, why, fix, device_dependent=True, notes=[rules, *v.notes])


def check(key: str, kind: str, env: Env) -> AttentionRow:
    """Read the rules for ``key``, then let a meta build decide wherever a build here can answer."""
    v = rule(key, env)
    if v.device_dependent and v.status is not Status.WONT and unseen(env.target):
        v = _unseen_verdict(key, v, env.target)
    row = AttentionRow(key, kind, v.status, v.reason, v.fix, False, "", v.resolves_to, None, list(v.notes))
    if v.downloads:
        if v.status in {Status.HUB, Status.WORKS}:
            # For a model the row stays unvalidated; for the hardware alone the rules' answer is the answer.
            row.status = Status.HUB if env.model.reference else Status.DOWNLOAD
        row.check = f"not checked: a build would download {v.downloads} from the Hub"
        return row
    flash = FLASH_KEY.match(key)
    if env.target.catalog is not None and flash and v.downloads is None and int(flash.group(1)) in _matrix():
        return _checked_as_if(row, v, int(flash.group(1)), env.target.catalog)
    if v.device_dependent and not env.target.live:
        t = env.target
        why = f"{t.device} is not here" if not t.present else f"it runs on {t.seen} here"
        row.check = f"read from transformers' rules: {why}, so a build can't check {t.device_type}"
        return row
    if meta_build.needs_download(key) and v.status != Status.WONT:
        # metabuild's coarser guard: never build when a download is possible, even where the rules say none.
        row.check = "not checked: a build here might download a Hub kernel"
        return row
    built = build_for(key, env)
    row.checked, row.error = True, built.error
    if built.ok:
        row.resolves_to = str(built.model.config._attn_implementation) if built.model is not None else v.resolves_to
        if row.resolves_to == key:
            row.resolves_to = None
    if built.ok and v.runtime:
        row.check = "meta build: transformers loads it; the first forward fails"
    elif built.ok == (v.status == Status.WORKS):
        row.check = "meta build agrees"
    else:
        row.status = Status.WORKS if built.ok else Status.WONT
        row.reason = "transformers accepts it" if built.ok else _first_sentence(built.error or "")
        row.check = "meta build (nbhw's reading of the rules said otherwise)"
        row.notes.append(f"nbhw's reading of transformers' rules said {v.status}: {v.reason}")
    return row
