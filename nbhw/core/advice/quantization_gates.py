"""Whether a quantization method works on a device: transformers' own checks, run for this machine or a target.

:func:`gate` runs the sequence ``from_pretrained`` runs — the quantizer's ``__init__``, ``validate_environment``,
``update_device_map``, ``update_dtype`` — through :class:`nbhw.core.hf.as_if.AsIf`: for a target, as if on its
device; for this machine's accelerator, as if on the device detection read (so no CUDA context is created); on a
CPU-only machine, for real. A package check that fails (``is_X_available`` is False) is named, then assumed installed
on the next pass, so a row says both "pip install X" (transformers' own message) and what the device check says
next. Where transformers' code can't tell, :func:`documented_gates` writes the gate from documentation or from the
package's own list, and says so in ``Gate.source``.
"""

from __future__ import annotations

import copy
import importlib
import re
from dataclasses import dataclass, field
from typing import Any

from nbhw.core.advice.quantization_methods import classes, hub_kernels, one_line
from nbhw.core.advice.status import Status
from nbhw.core.hardware import package_checks, since_start
from nbhw.core.hf.as_if import AsIf, NotModelled, TargetDevice, stand_in

READ = "transformers' own checks"
DOCS = "documentation"
MAX_PASSES = 8  # one more package assumed per pass; no quantizer checks more than a handful


@dataclass(frozen=True)
class Where:
    """The device a gate is read for: this machine or a target, as its checks and the emitted code see it."""

    label: str
    device: TargetDevice | None  # None: run for real on this (CPU-only) machine
    device_map: Any  # what from_pretrained hands the quantizer
    dtype: str
    device_type: str
    code_device_map: str  # what the emitted cell writes
    target: bool = False


@dataclass
class Gate:
    """One method on one device: the verdict, why, the fix, and where the answer came from."""

    status: Status
    why: str
    fix: str | None = None
    source: str = READ
    installs: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    dtype: str | None = None
    downloads: list[str] = field(default_factory=list)  # the Hub kernels the load fetches (a method asking for kernels)


@dataclass
class _Pass:
    error: BaseException | None = None
    quantizer: Any = None
    missing: tuple[str, str] | None = None  # (package check, transformers' message)
    unreadable: str | None = None
    dtype: str | None = None
    dtype_note: str | None = None


def _pkg(check: str) -> str:
    return check.removeprefix("is_").removesuffix("_available").replace("_", "-")


def _new_quantizer(qcls: Any, config: Any, pre_quantized: bool, run: AsIf, bare: bool) -> Any:
    q: Any = object.__new__(qcls)
    try:
        run.call(qcls.__init__, q, config, pre_quantized=pre_quantized)
    except (ImportError, AttributeError, NameError):
        if not (run.assume or bare):
            raise
        # __init__ imports the package itself (gptq: optimum.gptq): build the bare quantizer to read
        # validate_environment anyway; its checks use only these two attributes before importing the package.
        q.quantization_config, q.pre_quantized = config, pre_quantized
    return q


def _missing(run: AsIf, exc: BaseException) -> str | None:
    """The package check to blame: a False one (not yet assumed) named in the message, else the last for ImportError."""
    unmet = [name for name, here in run.seen.packages if not here and name not in run.assume]
    text = str(exc).casefold().replace("-", "_")
    named = [n for n in unmet if _pkg(n).replace("-", "_") in text]
    if named:
        return named[-1]
    return unmet[-1] if unmet and isinstance(exc, ImportError) else None


# An installed package's version, as a check reads it for a package it is told to assume installed: the release pip
# installs now, which nbhw can't know offline; it is read as newer than any floor transformers states.
RELEASE_PIP_INSTALLS = "999"


def _versions(installing: set[str], read: list[str]) -> dict[str, Any]:
    """Stand-ins for ``importlib.metadata`` in a check's globals: the packages being installed have a version (each
    one so read is added to ``read``)."""
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            if _dist(name) not in installing:
                raise
            if name not in read:
                read.append(name)
            return RELEASE_PIP_INSTALLS

    view = stand_in("importlib.metadata", {"version": version}, metadata)
    return {"metadata": view, "importlib": stand_in("importlib", {"metadata": view}, importlib)}


def _dist(name: str) -> str:
    return name.casefold().replace("_", "-")


def _one_pass(
    key: str, config: Any, where: Where, pre: bool, assume: list[str], *, bare: bool, installing: set[str],
    read: list[str],
) -> tuple[_Pass, AsIf]:  # fmt: skip
    qcls, _ = classes(key)
    run = AsIf(where.device, assume, answers=_versions(installing, read))
    out = _Pass()
    try:
        q = _new_quantizer(qcls, copy.deepcopy(config), pre, run, bare)
        out.quantizer = q
        run.call(qcls.validate_environment, q, device_map=copy.deepcopy(where.device_map), weights_only=True)
        run.call(qcls.update_device_map, q, copy.deepcopy(where.device_map))
        out.dtype, out.dtype_note = _dtype_for(qcls, q, where.dtype, run)
    except NotModelled as exc:
        out.unreadable = f"transformers' check reads {exc}, which nbhw doesn't answer for a target"
    except Exception as exc:
        _failed(out, run, exc, assume, bare)
    return out, run


def _failed(out: _Pass, run: AsIf, exc: BaseException, assume: list[str], bare: bool) -> None:
    name = _missing(run, exc)
    if name is not None:
        out.missing = (name, one_line(exc))
    elif isinstance(exc, ModuleNotFoundError) and exc.name and not bare:
        # A module the package checks didn't see (optimum-quanto makes `optimum` look installed, not optimum.gptq).
        out.missing = (f"module:{exc.name}", f"{one_line(exc)} (pip install {exc.name.split('.')[0]})")
    elif isinstance(exc, ImportError | AttributeError | NameError) and (assume or bare):
        needs = ", ".join(_pkg(a) for a in assume) or "the package"
        out.unreadable = f"the rest of the check needs {needs} installed to read"
    else:
        out.error = exc


def _dtype_for(qcls: Any, q: Any, wanted: str, run: AsIf) -> tuple[str, str | None]:
    """The dtype transformers loads with (update_dtype may change it or refuse it; then nbhw tries float16)."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    try:
        got = run.call(qcls.update_dtype, q, getattr(torch, wanted))
    except ValueError as exc:
        if wanted == "float16":
            raise
        run.call(qcls.update_dtype, q, torch.float16)
        return "float16", f"update_dtype refused {wanted}: {one_line(exc)}"
    name = str(got).removeprefix("torch.")
    return name, (f"update_dtype changes dtype {wanted} to {name}" if name != wanted else None)


def _unmet(run: AsIf) -> str | None:
    """The last package check the run found False here and did not assume: a refusal may follow from it."""
    unmet = [name for name, here in run.seen.packages if not here and name not in run.assume]
    return unmet[-1] if unmet else None


def _read_again(out: _Pass, run: AsIf) -> bool:
    """A refusal after a package check answered False here: the package becomes the pass's missing one, to read the
    check again with it installed (GPTQ refuses a CPU only while gptqmodel is missing)."""
    unmet = _unmet(run) if out.missing is None and out.error is not None else None
    if unmet is not None:
        out.missing = (unmet, f"{unmet}() is False here (pip install {_pkg(unmet)})")
    return unmet is not None


def _assume(missing: str, assume: list[str], installing: set[str]) -> bool:
    """Take the missing package as installed on the next pass; True when that pass can read only a bare quantizer
    (a module the package checks didn't see)."""
    if missing.startswith("module:"):
        installing.add(_dist(missing.removeprefix("module:").split(".")[0]))
        return True
    assume.append(missing)
    installing.add(_dist(_pkg(missing)))
    return False


def _same_refusal(a: _Pass, b: _Pass) -> bool:
    return a.error is not None and b.error is not None and one_line(a.error) == one_line(b.error)


def gate(key: str, config: Any, where: Where, pre_quantized: bool = False) -> Gate:
    """transformers' checks for ``key`` on ``where``, reading past missing packages (they become the fix).

    A refusal that follows a package check answered False (GPTQ: "GPU is required" unless gptqmodel is installed)
    is read again with that package assumed installed; the package joins the fix only if the answer changes.
    """
    assume: list[str] = []
    installs: list[str] = []
    installing: set[str] = set()
    read: list[str] = []  # versions of packages not installed here that the checks compared
    calls: list[str] = []
    kept: list[str] = []
    bare = False
    tried: tuple[_Pass, AsIf] | None = None
    for _ in range(MAX_PASSES):
        out, run = _one_pass(key, config, where, pre_quantized, assume, bare=bare, installing=installing, read=read)
        calls += [c for c in run.seen.calls if c not in calls]
        kept += [k for k in run.seen.kept if k not in kept]
        if tried is not None and _same_refusal(out, tried[0]):
            out, run = tried  # the package changes nothing: the refusal stands, and the package is not in the fix
            out.missing = None
            assume.pop()
            installs.pop()
            break
        tried = (out, run) if _read_again(out, run) else None
        if out.missing is None:
            break
        bare = _assume(out.missing[0], assume, installing) or bare
        installs.append(out.missing[1])
    notes = [f"transformers logs: {msg}" for level, msg in run.seen.logs if level in {"warning", "warn", "error"}]
    if read:
        notes.append(f"{', '.join(read)}: not installed here; transformers' version checks read the release pip "
                     "installs as new enough")  # fmt: skip
    g = _verdict(out, where, installs, notes + run.seen.quirks)
    g.calls, g.dtype = calls, out.dtype
    if out.dtype_note:
        g.notes.append(out.dtype_note)
    if any(_pkg(name) == KERNELS for name, _ in run.seen.packages):
        _hub_download(g, key, where)
    _restart_for_kept_answers(g, kept, assume, bare, where)
    return g


KERNELS = "kernels"  # the package transformers loads Hub kernels with (its is_kernels_available check)


def _hub_download(g: Gate, key: str, where: Where) -> None:
    """A method whose check asks for the kernels package fetches a Hub kernel at load: say which, and that whether
    it has a build for the device is known only then (the checks pass either way; nothing here downloads)."""
    if g.status not in {Status.WORKS, Status.PACKAGE}:
        return
    named = hub_kernels(key)
    what = ", ".join(named) if named else "a Hub kernel (its name is not a literal in the integration code nbhw reads)"
    g.downloads = named or [what]
    g.why += f"; the load {'then ' if g.status is Status.PACKAGE else ''}fetches {what} from the Hub"
    g.notes.append(
        f"{what}: downloaded at load by the kernels package (network, or its cache); whether it has a build for "
        f"{where.device_type} and the torch there is known only then, not from transformers' checks"
    )


def _restart_for_kept_answers(g: Gate, kept: list[str], assume: list[str], bare: bool, where: Where) -> None:
    """Package checks transformers answered False and keeps (its ``lru_cache``), whose own code now finds the
    package: pip installed it since. Only a restart makes transformers see it, so the fix says that, not pip."""
    if not kept:
        return
    for check in reversed(kept):
        dist = package_checks.distribution(_pkg(check))  # what the check's own importlib.metadata lookup finds
        what = f"{dist.metadata['Name']} {dist.version}" if dist is not None else _pkg(check)
        g.notes.insert(0, f"{what} is installed now, but transformers keeps its first answer to {check}() (False) "
                          "until the kernel restarts")  # fmt: skip
    everything = set(kept) >= set(assume) and not bare
    g.fix = since_start.RESTART if everything or not g.fix else f"{since_start.RESTART}; {g.fix}"
    if everything and g.status is Status.PACKAGE:
        g.why = f"transformers' checks pass on {where.label} once the kernel restarts (the packages are installed)"


def install_hint(problem: str | None) -> str | None:
    """The ``pip install ...`` words in one of transformers' messages, if it names one."""
    word = r"(?:'[^']*'|\"[^\"]*\"|(?!and\b|or\b)[^\s`'\")(]*[^\s`'\")(.])"
    m = re.search(rf"pip install {word}(?: {word})*", problem or "")
    if m:
        return m.group(0).strip().rstrip(".")
    # "requires fbgemm-gpu library": transformers names the package without the command
    named = re.search(r"requires (?:the )?([A-Za-z][\w.-]*) library|No module named '(\w+)", problem or "")
    return f"pip install {named.group(1) or named.group(2)}" if named else None


def _short(message: str) -> str:
    head = message.split(". ", maxsplit=1)[0]
    return head if len(head) <= 160 else head[:159] + "…"


def _verdict(out: _Pass, where: Where, installs: list[str], notes: list[str]) -> Gate:
    fix_install = "; ".join(dict.fromkeys(install_hint(i) or _short(i) for i in installs)) or None
    if out.error is not None:
        return Gate(Status.WONT, one_line(out.error), _device_fix(out.error, fix_install), READ, installs, notes=notes)
    if out.unreadable is not None:
        why = out.unreadable + (f"; first: {fix_install}" if installs else "")
        return Gate(Status.NOT_CHECKED, why, fix_install, READ, installs, notes=notes)
    dequantized = bool(getattr(getattr(out.quantizer, "quantization_config", None), "dequantize", False))
    if dequantized:
        why = next((n.removeprefix("transformers logs: ") for n in notes), "transformers dequantizes on this device")
        return Gate(Status.DEQUANTIZED, why, fix_install, READ, installs, notes=notes)
    if installs:
        why = f"transformers' checks pass on {where.label} once the packages are installed"
        return Gate(Status.PACKAGE, why, fix_install, READ, installs, notes=notes)
    return Gate(Status.WORKS, f"transformers' checks pass on {where.label}", None, READ, installs, notes=notes)


def fix_for(problem: str) -> str:
    """The fix for one of transformers' refusals (a plan's problem): the package it names, else what it asks for."""
    return install_hint(problem) or _device_fix(Exception(problem), None)


def _device_fix(exc: BaseException, install: str | None) -> str:
    """What the refusal asks for, in the words of transformers' own message."""
    text = str(exc)
    cc = re.search(r"compute capability >= ?([\d.]+)", text)
    if cc:
        fix = f"a GPU with compute capability >= {cc.group(1)}"
    elif re.search(r"sm1\d\d\+|Blackwell", text):
        fix = "a Blackwell GPU (compute capability >= 10.0)"
    elif "MPS" in text:
        fix = "a Mac with Apple Silicon (mps)"
    elif "device_map" in text or "offload" in text.lower():
        fix = "a device_map on one accelerator, without cpu or disk"
    elif re.search(r"GPU or (Intel )?XPU", text):
        fix = "a CUDA GPU or an Intel XPU"
    elif "GPU" in text:
        fix = "a CUDA GPU"
    elif "dtype" in text:
        fix = "the dtype the message names"
    else:
        fix = "another method, or hardware it supports"
    return fix + (f"; and {install}" if install else "")


# ---------------------------------------------------------------- gates transformers' code doesn't hold


def documented_gates(key: str, where: Where, config: Any = None) -> Gate | None:
    """What nbhw writes from documentation (or a package's own list) where transformers' check can't tell."""
    if key.startswith("bitsandbytes") and where.device is not None:
        return _bnb_backend(where)
    if key == "gguf":
        why = (
            "transformers reads the .gguf file's header first (packed weights run with a Hub kernel when kernels "
            "is installed, else the whole model is dequantized): nothing to check without the file"
        )
        return Gate(Status.NOT_CHECKED, why, "pass gguf_file=... to from_pretrained", DOCS + ": GgufHfQuantizer")
    if key == "fp_quant" and where.device is not None and not getattr(config, "pseudoquantization", False):
        cc = where.device.capability
        if where.device.has_cuda and (cc is None or cc[0] < 10):
            why = (
                "real FP-Quant needs a Blackwell GPU and qutlass (transformers' own ImportError says so; its "
                "check only looks for qutlass)"
            )
            fix = "FPQuantConfig(pseudoquantization=True) to emulate, or a Blackwell GPU"
            return Gate(Status.WONT, why, fix, DOCS + ": transformers' FPQuant message")
    return None


def _bnb_backend(where: Where) -> Gate | None:
    # transformers checks available devices ∩ bnb's devices, and the CPU is always available: on a TPU or a
    # Neuron device the check passes though bitsandbytes can't run there. bitsandbytes' own list decides.
    try:
        # An optional package: imported only when its gate is read for a device.
        bitsandbytes = importlib.import_module("bitsandbytes")
        supported = set(getattr(bitsandbytes, "supported_torch_devices", set()))
        source = "bitsandbytes.supported_torch_devices (installed here)"
    except ImportError:
        supported = {"cpu", "cuda", "xpu", "mps", "npu", "hpu"}
        source = DOCS + ": bitsandbytes' installation guide"
    torch_type = where.device.torch_type if where.device else "cpu"
    if torch_type in supported:
        return None
    why = f"bitsandbytes has no {where.device_type} backend (supported: {', '.join(sorted(supported))})"
    return Gate(Status.WONT, why, "torchao or quanto, or a GPU", source)
