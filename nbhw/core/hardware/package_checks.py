"""The pre-flight checks of the packages transformers loads at from_pretrained: flash-attn, bitsandbytes, kernels.

None of them is imported. flash-attn's extensions are read from its files (importing a broken one is what
crashes); bitsandbytes' choice of native library is made by bitsandbytes' own selection functions, compiled from
its installed source and run with stand-ins for torch (importing it asks every GPU for its compute capability, a
CUDA context); a cached Hub kernel's build variants are resolved by the ``kernels`` package's own resolver.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.metadata
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from nbhw.core.hardware import cuda_arch, elf, probes
from nbhw.core.hardware.extensions import Subject, extension_findings, inspect_extension
from nbhw.core.hardware.findings import Check, Finding, Gpu, System, Trigger
from nbhw.core.hf import kernel_tables
from nbhw.core.hf.library_source import library_file
from nbhw.core.hf.private_names import PRIVATE_NAMES, in_installed_version

CheckResult = tuple[list[Finding], list[Check]]

# The flash-attention distributions transformers looks for, by attn_implementation: the names its
# is_flash_attn_{2,3,4}_available() compare (transformers 5.24, utils/import_utils.py).
FLASH_PACKAGES = {
    "flash_attention_2": "flash-attn",
    "flash_attention_3": "flash-attn-3",
    "flash_attention_4": "flash-attn-4",
}
_FA_LOCAL = re.compile(r"cu(\d+)torch(\d+\.\d+)cxx11abi(TRUE|FALSE)", re.IGNORECASE)
BNB_REINSTALL = "pip install --force-reinstall --no-deps bitsandbytes"


def distribution(name: str) -> importlib.metadata.Distribution | None:
    """The installed distribution of that name, None when it is not installed."""
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _extensions(dist: importlib.metadata.Distribution) -> list[Path]:
    out = []
    for f in dist.files or ():
        if f.name.endswith(".so") or ".so." in f.name:
            p = Path(str(dist.locate_file(f)))
            if p.is_file():
                out.append(p)
    return sorted(out)


# ---------------------------------------------------------------- flash-attn 2 / 3 / 4


def wheel_tag(dist: importlib.metadata.Distribution) -> tuple[str, str, bool] | None:
    """(CUDA major, torch major.minor, cxx11 ABI) from a flash-attn wheel's '+cu12torch2.8cxx11abiTRUE' tag.

    The tag is in the version's local part when the wheel was installed by its file name, and in the URL of
    direct_url.json when pip installed it from a URL (flash-attn's setup.py renames the wheel it downloads).
    Shown only: the symbols decide.
    """
    texts = [dist.version]
    direct = dist.read_text("direct_url.json")
    if direct:
        with contextlib.suppress(ValueError, AttributeError):
            texts.append(str(json.loads(direct).get("url", "")))
    for text in texts:
        m = _FA_LOCAL.search(text)
        if m:
            return m.group(1), m.group(2), m.group(3).upper() == "TRUE"
    return None


def _fa_fix(package: str) -> str:
    # flash-attn's setup.py picks the prebuilt wheel for the installed torch, CUDA and C++ ABI when it builds
    # without isolation; a cached wheel built for the old torch is what --no-cache-dir avoids.
    return f"pip install --force-reinstall --no-cache-dir --no-build-isolation --no-deps {package}"


def _fa_fix_for_gpu(package: str) -> Callable[[Gpu], str]:
    def fix(gpu: Gpu) -> str:
        assert gpu.capability is not None
        if gpu.capability < (8, 0):
            # flash-attn's own check: "FlashAttention only supports Ampere GPUs or newer".
            return 'attn_implementation="sdpa" (flash-attn runs on Ampere (8.0) or newer only)'
        arch = f"{gpu.capability[0]}{gpu.capability[1]}"
        # flash-attn's setup.py: FLASH_ATTENTION_FORCE_BUILD skips the prebuilt wheel, FLASH_ATTN_CUDA_ARCHS
        # picks the architectures to compile (a long build; MAX_JOBS bounds its memory).
        return f"FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS={arch} MAX_JOBS=4 {_fa_fix(package)}"

    return fix


def _requirement_findings(
    dist: importlib.metadata.Distribution, package: str, triggers: tuple[Trigger, ...]
) -> list[Finding]:
    """Requirements in the wheel's metadata that the installed packages do not meet (what `pip check` says)."""
    out = []
    for line in dist.requires or ():
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        have = distribution(req.name)
        if have is not None and req.specifier.contains(have.version, prereleases=True):
            continue
        found = f"{req.name} {have.version} is installed" if have else f"{req.name} is not installed"
        out.append(
            Finding(
                f"{package}:requirement",
                package,
                "error",
                f"{package} {dist.version} requires {req}, but {found}",
                "load",
                f'pip install "{req}"',
                (f"Requires-Dist: {line}",),
                triggers,
            )
        )
    return out


def _one_flash_package(here: System, key: str, package: str) -> CheckResult:
    dist = distribution(package)
    if dist is None:
        return [], [Check(package, "skipped", "not installed")]
    triggers = (Trigger("attn_implementation", key),)
    subject = Subject(package, package, _fa_fix(package), triggers, _fa_fix_for_gpu(package))
    found: list[Finding] = []
    checks: list[Check] = []
    exts = _extensions(dist)
    for path in exts:
        try:
            found += extension_findings(subject, inspect_extension(path, here.torch), here)
        except (OSError, elf.ElfError) as exc:
            checks.append(Check(package, "unknown", f"could not read {path.name}: {exc}"))
    found += _requirement_findings(dist, package, subject.triggers)
    tag = wheel_tag(dist)
    detail = f"{dist.version}; {len(exts)} extension(s)"
    if tag:
        detail += f"; wheel built for CUDA {tag[0]}, torch {tag[1]}, cxx11 ABI {tag[2]}"
    return found, [*checks, Check(package, "finding" if found else "ok", detail)]


def check_flash_attn(here: System) -> CheckResult:
    """Each installed flash-attn package's compiled extensions against the installed torch, CUDA and GPUs."""
    findings: list[Finding] = []
    checks: list[Check] = []
    for key, package in FLASH_PACKAGES.items():
        found, looked = _one_flash_package(here, key, package)
        findings += found
        checks += looked
    return findings, checks


# ---------------------------------------------------------------- bitsandbytes


def _bnb_function(package_dir: Path, name: str, env: dict[str, Any]) -> Callable[..., Any] | None:
    """One function of bitsandbytes/cextension.py, compiled from the installed source without importing bitsandbytes.

    Importing bitsandbytes runs torch.cuda.is_available() and get_device_capability() for every GPU (it
    creates a CUDA context) and loads the native library, which is the thing that may be broken.
    """
    source = package_dir / "cextension.py"
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    wanted = {name, "_find_cuda_libs", "_split_cuda_version"}  # the helpers its selection calls
    defs: list[ast.stmt] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    if not any(isinstance(d, ast.FunctionDef) and d.name == name for d in defs):
        return None
    namespace = dict(env)
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(source), "exec"), namespace)
    fn = namespace.get(name)
    return fn if callable(fn) else None


def _silent_logger() -> Any:
    return SimpleNamespace(warning=lambda *a, **k: None, debug=lambda *a, **k: None, info=lambda *a, **k: None)


def bnb_library(here: System, package_dir: Path) -> tuple[str, Path | None, str]:
    """(backend, the native library bitsandbytes would load here, how that was decided)."""
    t = here.torch
    env = {
        "os": os,
        "re": re,
        "Path": Path,
        "logger": _silent_logger(),
        "PACKAGE_DIR": package_dir,
        "DYNAMIC_LIBRARY_SUFFIX": ".so",
        "torch": SimpleNamespace(version=SimpleNamespace(hip=t.hip, cuda=t.cuda, xpu=t.xpu)),
    }
    if t.cuda or t.hip:
        backend = "ROCm" if t.hip else "CUDA"
        fn = _bnb_function(package_dir, "get_cuda_bnb_library_path", env)
        if fn is None:
            return backend, None, "bitsandbytes' get_cuda_bnb_library_path was not found"
        major, minor = (int(x) for x in re.findall(r"\d+", t.hip or t.cuda or "0.0")[:2])
        ccs = sorted(g.capability for g in here.gpus if g.capability) or [(0, 0)]
        specs = SimpleNamespace(
            highest_compute_capability=ccs[-1], cuda_version_string=f"{major}{minor}", cuda_version_tuple=(major, minor)
        )
        return backend, Path(fn(specs)), "bitsandbytes.cextension.get_cuda_bnb_library_path"
    if t.xpu:
        fn = _bnb_function(package_dir, "get_xpu_bnb_library_path", env)
        if fn is None:
            return "XPU", None, "bitsandbytes' get_xpu_bnb_library_path was not found"
        return "XPU", Path(fn()), "bitsandbytes.cextension.get_xpu_bnb_library_path"
    return "CPU", package_dir / "libbitsandbytes_cpu.so", "bitsandbytes.cextension.get_native_library (CPU)"


def _bnb_devices(package_dir: Path) -> set[str] | None:
    """bitsandbytes.supported_torch_devices, read from its __init__.py (transformers checks the plan's devices)."""
    try:
        tree = ast.parse((package_dir / "__init__.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "supported_torch_devices" for t in node.targets
        ):
            try:
                return {str(v) for v in ast.literal_eval(node.value)}
            except ValueError:
                return None
    return None


def bnb_methods() -> tuple[str, ...]:
    """transformers' quantization methods whose quantizer is bitsandbytes' (bitsandbytes_4bit, _8bit).

    The keys of AUTO_QUANTIZER_MAPPING read from transformers/quantizers/auto.py with ast: importing it imports
    every quantizer's package (torchao alone takes seconds).
    """
    path = library_file("transformers", "quantizers/auto.py")
    if path is None:
        return ()
    keys: list[str] = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "AUTO_QUANTIZER_MAPPING" for t in node.targets)
            and isinstance(node.value, ast.Dict)
        ):
            for key, value in zip(node.value.keys, node.value.values, strict=True):
                if isinstance(key, ast.Constant) and "Bnb" in ast.unparse(value):
                    keys.append(str(key.value))
    return tuple(keys)


def _bnb_fix_for_gpu(here: System, package_dir: Path, gpu: Gpu) -> str:
    """Another shipped library that loads here and has code for this GPU (bitsandbytes' BNB_CUDA_VERSION picks
    it), else a source build for the GPU's compute capability."""
    assert gpu.capability is not None
    prefix = "rocm" if here.torch.hip else "cuda"
    for lib in sorted(package_dir.glob(f"libbitsandbytes_{prefix}*.so"), reverse=True):
        try:
            ext = inspect_extension(lib, here.torch)
        except (OSError, elf.ElfError):
            continue
        if not ext.missing_libraries and ext.gpu_code and cuda_arch.verdict(ext.gpu_code, gpu.capability) != "none":
            version = lib.name.removeprefix(f"libbitsandbytes_{prefix}").removesuffix(".so")
            return f"export BNB_{prefix.upper()}_VERSION={version} (bitsandbytes then loads {lib.name})"
    cc = f"{gpu.capability[0]}{gpu.capability[1]}"
    return (
        f"build bitsandbytes from source for it: cmake -DCOMPUTE_BACKEND=cuda -DCOMPUTE_CAPABILITY={cc} -S . "
        "&& make && pip install ."
    )


def _bnb_no_backend(here: System, backend: str, lib: Path, shipped: list[str], how: str) -> Finding:
    return Finding(
        "bitsandbytes:no-backend",
        "bitsandbytes",
        "error",
        f"this bitsandbytes has no {backend} library for torch {here.torch.version}: quantizing fails with "
        f"'No compatible {backend} binary found at {lib}'",
        "load",
        f"{BNB_REINSTALL} (a release that ships {lib.name}), or compile it for {backend} from source",
        (f"it ships {', '.join(shipped) or 'no native library'}", f"it would load {lib.name} ({how})"),
        tuple(Trigger("quantization", m) for m in bnb_methods()),
    )


def _bnb_unsupported_device(here: System, package_dir: Path) -> list[Finding]:
    devices = _bnb_devices(package_dir)
    plan_types = {g.device.split(":")[0] for g in here.gpus} or {"cpu"}
    if devices is None or plan_types & devices:
        return []
    return [
        Finding(
            "bitsandbytes:unsupported-device",
            "bitsandbytes",
            "error",
            f"transformers refuses to quantize: none of {sorted(plan_types)} is in bitsandbytes' "
            f"supported_torch_devices {sorted(devices)}",
            "load",
            "pip install -U bitsandbytes",
            (),
            tuple(Trigger("quantization", m) for m in bnb_methods()),
        )
    ]


def check_bitsandbytes(here: System) -> CheckResult:
    """The native library the installed bitsandbytes would load here, and whether it can run on these GPUs."""
    dist = distribution("bitsandbytes")
    if dist is None:
        return [], [Check("bitsandbytes", "skipped", "not installed")]
    package_dir = Path(str(dist.locate_file("bitsandbytes")))
    shipped = sorted(p.name for p in package_dir.glob("libbitsandbytes_*.so"))
    backends = " ".join(n.removeprefix("libbitsandbytes_").removesuffix(".so") for n in shipped)
    detail = f"{dist.version}; ships {backends or 'no native library'}"
    backend, lib, how = bnb_library(here, package_dir)
    if lib is None:
        return [], [Check("bitsandbytes", "unknown", f"{detail}; {how}")]
    findings: list[Finding] = []
    if backend != "CPU" and not lib.is_file():
        findings.append(_bnb_no_backend(here, backend, lib, shipped, how))
    elif lib.is_file():
        triggers = tuple(Trigger("quantization", m) for m in bnb_methods())
        for_gpu: Callable[[Gpu], str] = lambda gpu: _bnb_fix_for_gpu(here, package_dir, gpu)  # noqa: E731
        subject = Subject("bitsandbytes", "bitsandbytes", BNB_REINSTALL, triggers, for_gpu)
        try:
            findings += extension_findings(subject, inspect_extension(lib, here.torch), here)
        except (OSError, elf.ElfError) as exc:
            return [], [Check("bitsandbytes", "unknown", f"{detail}; could not read {lib.name}: {exc}")]
    findings += _bnb_unsupported_device(here, package_dir)
    status: Literal["ok", "finding"] = "finding" if findings else "ok"
    return findings, [Check("bitsandbytes", status, f"{detail}; would load {lib.name} ({backend})")]


# ---------------------------------------------------------------- kernels and the cached Hub kernels


def kernels_range() -> tuple[str, str] | None:
    """transformers' KERNELS_MIN_VERSION and KERNELS_MAX_VERSION, read from its source (no transformers import)."""
    path = library_file("transformers", "utils/import_utils.py")
    if path is None:
        return None
    try:
        return _read_kernels_range(str(path), os.path.getmtime(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


@functools.lru_cache(maxsize=4)
def _read_kernels_range(path: str, mtime: float) -> tuple[str, str] | None:
    """The range in one version of the file (a 3,000-line parse: kept while the file is unchanged)."""
    found: dict[str, str] = {}
    for node in ast.parse(Path(path).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in ("KERNELS_MIN_VERSION", "KERNELS_MAX_VERSION"):
                    found[target.id] = str(node.value.value)
    if len(found) != 2:
        return None
    return found["KERNELS_MIN_VERSION"], found["KERNELS_MAX_VERSION"]


def _in_range(version: str, low: str, high: str) -> bool:
    try:
        return Version(low) <= Version(version) < Version(high)
    except InvalidVersion:
        return False


def _kernels_version(version: str) -> CheckResult:
    bounds = kernels_range()
    if bounds is None:
        return [], [Check("kernels", "unknown", f"{version}; transformers' accepted range was not found")]
    low, high = bounds
    detail = f"{version} (transformers: >={low},<{high})"
    if _in_range(version, low, high):
        return [], [Check("kernels", "ok", detail)]
    finding = Finding(
        "kernels:version-range",
        "kernels",
        "error",
        f"transformers accepts kernels >={low},<{high}; with {version} it treats kernels as missing: "
        "use_kernels=True and Hub-kernel attention fail with 'Kernels are not available'",
        "load",
        f'pip install "kernels>={low},<{high}"',
        (f"transformers.utils.import_utils KERNELS_MIN_VERSION={low}, KERNELS_MAX_VERSION={high}",),
        # flash_attention_N goes through kernels only when its package is not installed (transformers' fallback).
        (
            Trigger("use_kernels", "True"),
            *(Trigger("attn_implementation", k) for k, p in FLASH_PACKAGES.items() if distribution(p) is None),
        ),
    )
    return [finding], [Check("kernels", "finding", detail)]


def check_kernels(here: System) -> CheckResult:
    """The kernels version against transformers' range, then every Hub kernel in the local cache."""
    dist = distribution("kernels")
    if dist is None or not probes.module_installed("kernels"):
        return [], [Check("kernels", "skipped", "not installed: transformers loads no Hub kernel")]
    findings, checks = _kernels_version(dist.version)
    cached, cache_checks = check_cached_kernels(here)
    return findings + cached, checks + cache_checks


def kernel_cache_dir() -> Path:
    """Where `kernels` keeps Hub kernels: KERNELS_CACHE, else the Hugging Face hub cache (kernels' own rule)."""
    from huggingface_hub import constants  # lazy: huggingface_hub only once kernels is installed

    return Path(os.environ.get("KERNELS_CACHE") or constants.HF_HUB_CACHE)


def cached_kernel_repos(cache: Path) -> list[tuple[str, Path]]:
    """(repo id, snapshot dir) of every cached repo with a build/ folder, for both repo types kernels reads.

    The folders are listed first; huggingface_hub's naming rule (file_download, half a second to import) is asked
    only when one has a build/ folder.
    """
    from huggingface_hub import constants  # lazy: huggingface_hub only once kernels is installed

    sep = constants.REPO_ID_SEPARATOR
    built: list[tuple[list[str], Path]] = []
    for entry in sorted(cache.iterdir()) if cache.is_dir() else ():
        parts = entry.name.split(sep)
        if len(parts) == 3:
            built += [(parts, s) for s in sorted((entry / "snapshots").glob("*")) if (s / "build").is_dir()]
    if not built:
        return []
    from huggingface_hub.file_download import repo_folder_name  # lazy: as above

    prefixes = [repo_folder_name(repo_id="o/n", repo_type=t).split(sep)[0] for t in ("kernel", "model")]
    return [(f"{parts[1]}/{parts[2]}", snapshot) for parts, snapshot in built if parts[0] in prefixes]


def _repo_of(ref: str) -> str:
    """'org/repo' for a kernel reference 'org/repo@v1:function'."""
    return re.split(r"[@:]", ref, maxsplit=1)[0]


def _kernel_triggers(repo: str, rocm: bool) -> tuple[Trigger, ...]:
    """The plan options that load this Hub kernel: naming it, its attention fallback, use_kernels' mapping."""
    triggers = [Trigger("kernel", repo)]
    fallback = kernel_tables.flash_kernel_fallback_in_source(rocm)
    triggers += [Trigger("attn_implementation", k) for k, ref in fallback.items() if _repo_of(ref) == repo]
    if any(_repo_of(ref) == repo for e in kernel_tables.default_mapping().entries for ref in e.repos):
        triggers.append(Trigger("use_kernels", "True"))
    return tuple(triggers)


def _avoid_kernel(repo: str) -> Callable[[Gpu], str]:
    def fix(gpu: Gpu) -> str:
        sm = cuda_arch.sm_name(gpu.capability or (0, 0))
        where = f"{gpu.device} (no code for {sm})"
        return f'do not load {repo} on {where}: use_kernels=False, or attn_implementation="sdpa"'

    return fix


def _get_kernel(repo: str) -> str:
    return f"python -c \"from kernels import get_kernel; get_kernel('{repo}')\""


def _no_variant(here: System, repo: str, reasons: tuple[str, ...], triggers: tuple[Trigger, ...]) -> Finding:
    return Finding(
        "hub-kernel:no-variant",
        repo,
        "error",
        f"the cached {repo} has no build for this system (torch {here.torch.version}, {here.machine}-{here.os}): "
        "loading it fails with 'Cannot find a build variant for this system'",
        "load",
        f"{_get_kernel(repo)} (downloads a newer build, online)",
        reasons[:6],
        triggers,
    )


Resolver = tuple[Callable[..., Any], Callable[..., Any]]


def kernels_resolver() -> tuple[Resolver | None, str]:
    """kernels' own (get_variants_local, resolve_variants), and the module they came from; (None, why) if not found.

    The places are the registry's (nbhw.core.hf.private_names): kernels.variants before 0.19,
    kernels._internals.variants since. The installed release's place is tried first, then the others (the kernels
    already imported may be another release than the one importlib.metadata finds).
    """
    places = [n.module for n in PRIVATE_NAMES if n.only == "kernels" and n.attribute == "resolve_variants"]
    first = [n.module for n in PRIVATE_NAMES if n.module in places and in_installed_version(n)]
    failed: list[str] = []
    for module_name in dict.fromkeys([*first, *places]):
        try:
            # lazy: an optional package (a second or so to import), only once a cached kernel is there to resolve
            module = importlib.import_module(module_name)
        except Exception as exc:  # kernels' own import code: any failure means "could not tell"
            failed.append(f"{module_name}: {type(exc).__name__}: {exc}")
            continue
        get_variants_local = getattr(module, "get_variants_local", None)
        resolve_variants = getattr(module, "resolve_variants", None)
        if callable(get_variants_local) and callable(resolve_variants):
            return (get_variants_local, resolve_variants), module_name
        failed.append(f"{module_name} has no get_variants_local / resolve_variants")
    return None, "; ".join(failed) or "nbhw knows no place of its resolver"


def _one_cached_kernel(here: System, repo: str, snapshot: Path, resolver: Resolver) -> CheckResult:
    get_variants_local, resolve_variants = resolver
    variants = get_variants_local(snapshot / "build")
    accepted, trace = resolve_variants(variants)
    triggers = _kernel_triggers(repo, bool(here.torch.hip))
    if not accepted:
        reasons = tuple(f"{d.variant.variant_str}: {getattr(d, 'reason', 'rejected')}" for d in trace)
        return [_no_variant(here, repo, reasons, triggers)], [
            Check(repo, "finding", f"{len(variants)} build variant(s), none for this system")
        ]
    best = accepted[0].variant_str
    subject = Subject("hub-kernel", repo, f"{_get_kernel(repo)} (a newer build, online)", triggers, _avoid_kernel(repo))
    found: list[Finding] = []
    for so in sorted((snapshot / "build" / best).rglob("*.so")):
        with contextlib.suppress(OSError, elf.ElfError):
            found += extension_findings(subject, inspect_extension(so, here.torch), here)
    return found, [Check(repo, "finding" if found else "ok", f"would load {best}")]


def check_cached_kernels(here: System) -> CheckResult:
    """Each cached Hub kernel's build variants, resolved by the kernels package's own resolver."""
    cache = kernel_cache_dir()
    repos = cached_kernel_repos(cache)
    if not repos:
        return [], [Check("cached Hub kernels", "skipped", f"none in {cache}")]
    resolver, where = kernels_resolver()
    if resolver is None:
        dist = distribution("kernels")
        version = dist.version if dist is not None else "?"
        why = f"kernels {version} has no build-variant resolver where nbhw looks ({where}): unknown"
        return [], [Check("cached Hub kernels", "unknown", why)]
    findings: list[Finding] = []
    checks: list[Check] = []
    for repo, snapshot in repos:
        try:
            found, looked = _one_cached_kernel(here, repo, snapshot, resolver)
        except Exception as exc:  # kernels' own code, on a folder it may not understand: "could not tell"
            why = f"kernels could not read its builds: {type(exc).__name__}: {exc}"
            found, looked = [], [Check(repo, "unknown", why)]
        findings += found
        checks += looked
    return findings, checks
