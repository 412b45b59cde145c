"""A compiled extension against the installed torch, read from its file: what loading it and its kernels would hit.

Four things make a torch extension fail, and each can be read without loading it (loading a broken one is what
crashes): a ``DT_NEEDED`` library ld.so would not find ("cannot open shared object file"), a torch symbol this
torch does not export ("undefined symbol", a build for another torch or C++ ABI), a second CUDA runtime, and a
fat binary with no code for a GPU ("no kernel image is available").
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from nbhw.core.hardware import cuda_arch, elf
from nbhw.core.hardware.findings import Finding, Gpu, System, TorchFacts, Trigger, When

# Symbols torch's own libraries define: C++ names in namespaces c10 / at / torch / caffe2 (also their vtables,
# typeinfo, guard variables and thunks), THP* globals of libtorch_python, and the C shims of the stable ABI.
_TORCH_SYMBOL = re.compile(
    r"^(?:_Z(?:T[VISTW]|GV|TH|T[hv][n0-9_]+)?(?:N[rVKRO]*)?(?:3c10|2at|5torch|6caffe2)"
    r"|_Z\d+THP|aoti_torch_|torch_)"
)
# Libraries every Linux Python process has; never reported as missing.
_SYSTEM_LIBS = re.compile(r"^(?:libc|libm|libdl|libpthread|librt|libutil|ld-linux[-\w]*|libstdc\+\+|libgcc_s)\.so")
_DEFAULT_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64")


@dataclass(frozen=True)
class ExtensionReport:
    """What one extension .so needs that this torch / this machine does not give."""

    path: Path
    missing_libraries: tuple[str, ...]
    missing_symbols: tuple[str, ...]
    cudart: str | None
    cxx11_abi: bool | None
    gpu_code: tuple[elf.GpuCode, ...] | None
    seconds: float


def loaded_sonames(lib_dir: Path | None) -> frozenset[str]:
    """The sonames torch's own libraries pull in (an extension needing one finds it loaded already)."""
    if lib_dir is None or not lib_dir.is_dir():
        return frozenset()
    names: set[str] = set()
    for lib in lib_dir.glob("lib*.so*"):
        try:
            dyn = elf.dynamic(lib)
        except (OSError, elf.ElfError):
            continue
        names.add(dyn.soname or lib.name)
        names.update(dyn.needed)
    return frozenset(names)


def _search_dirs(path: Path, runpath: Iterable[str]) -> list[Path]:
    """Where ld.so looks for a DT_NEEDED name (ld.so(8)): the object's RPATH/RUNPATH, LD_LIBRARY_PATH, then the
    default directories; /etc/ld.so.cache is asked separately. Not site-packages/nvidia/*/lib nor
    /usr/local/cuda: libraries there are found only when torch has already loaded them (``loaded_sonames``).
    """
    origin = str(path.parent)
    dirs = [Path(p.replace("$ORIGIN", origin).replace("${ORIGIN}", origin)) for p in runpath]
    dirs += [Path(p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    return dirs + [Path(p) for p in _DEFAULT_DIRS]


def _in_ld_cache(soname: str) -> bool:
    # The cache's string table holds every soname NUL-terminated; a byte search is enough to ask for one.
    try:
        data = Path("/etc/ld.so.cache").read_bytes()
    except OSError:
        return False
    return b"\x00" + soname.encode() + b"\x00" in data


def library_found(soname: str, path: Path, runpath: Iterable[str], loaded: frozenset[str]) -> bool:
    """Whether ld.so would find this DT_NEEDED library when the extension is loaded after torch."""
    if soname in loaded or _SYSTEM_LIBS.match(soname):
        return True
    return any((d / soname).is_file() for d in _search_dirs(path, runpath)) or _in_ld_cache(soname)


def _torch_scope(torch: TorchFacts, needed: Iterable[str]) -> list[Path]:
    """The torch libraries in the extension's lookup scope: its DT_NEEDED ones and theirs, breadth first."""
    if torch.lib_dir is None:
        return []
    queue, seen = list(needed), []
    while queue:
        lib = torch.lib_dir / queue.pop(0)
        if lib in seen or not lib.is_file():
            continue
        seen.append(lib)
        try:
            queue += elf.dynamic(lib).needed
        except (OSError, elf.ElfError):
            continue
    return seen


def cxx11_abi(torch_symbols: Iterable[str]) -> bool | None:
    """The C++ ABI an extension was built with, from how its torch imports spell std::string.

    The new ABI mangles it as std::__cxx11::basic_string (``St7__cxx11``); the old one abbreviates it ``Ss``.
    None when no imported torch symbol takes a string. A hint for the message only: the missing symbols decide.
    """
    names = list(torch_symbols)
    if any("St7__cxx11" in s for s in names):
        return True
    if any("Ss" in s for s in names):
        return False
    return None


def inspect_extension(path: Path, torch: TorchFacts) -> ExtensionReport:
    """Read one extension .so against the installed torch: libraries, torch symbols, CUDA runtime, ABI, GPU code."""
    start = time.perf_counter()
    dyn = elf.dynamic(path)
    missing_libs = tuple(n for n in dyn.needed if not library_found(n, path, dyn.runpath, torch.loaded_sonames))
    wanted = sorted(s for s in elf.undefined_symbols(path) if _TORCH_SYMBOL.match(s))
    scope = [elf.exports(lib) for lib in _torch_scope(torch, dyn.needed)]
    missing_syms = tuple(s for s in wanted if not any(s in table for table in scope)) if scope else ()
    cudart = next((n for n in dyn.needed if n.startswith("libcudart.so")), None)
    return ExtensionReport(
        path, missing_libs, missing_syms, cudart, cxx11_abi(wanted), elf.gpu_code(path), time.perf_counter() - start
    )


def torch_cudart(torch: TorchFacts) -> str | None:
    """The CUDA runtime torch's libraries load (libcudart.so.12 / .13)."""
    return next((n for n in sorted(torch.loaded_sonames) if n.startswith("libcudart.so")), None)


# ---------------------------------------------------------------- the findings one extension gives


@dataclass(frozen=True)
class Subject:
    """Whose extension this is, and how to repair it: a rebuild for this torch, and one for a GPU it lacks."""

    subject: str  # the finding id's prefix: "flash-attn", "bitsandbytes", "hub-kernel"
    package: str
    fix: str
    triggers: tuple[Trigger, ...]
    fix_for_gpu: Callable[[Gpu], str] | None = None
    when_broken: When = "load"


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _missing_library(s: Subject, ext: ExtensionReport, t: TorchFacts) -> Finding:
    first = ext.missing_libraries[0]
    cpu_torch = any(n.startswith(("libtorch_cuda", "libc10_cuda")) for n in ext.missing_libraries) and not t.cuda
    return Finding(
        f"{s.subject}:missing-library",
        s.package,
        "error",
        f"importing {ext.path.name} fails: '{first}: cannot open shared object file'"
        + (f" (it needs a CUDA build of torch; this torch {t.version} is CPU-only)" if cpu_torch else ""),
        s.when_broken,
        s.fix,
        (f"{ext.path.name} needs {', '.join(ext.missing_libraries)}, which ld.so would not find",),
        s.triggers,
    )


def _undefined_symbol(s: Subject, ext: ExtensionReport, t: TorchFacts) -> Finding:
    abi_note = ""
    if ext.cxx11_abi is not None and t.cxx11_abi is not None and ext.cxx11_abi != t.cxx11_abi:
        abi_note = " (it was built with the other C++ ABI)"
    return Finding(
        f"{s.subject}:undefined-symbol",
        s.package,
        "error",
        f"importing {ext.path.name} fails with 'undefined symbol: {ext.missing_symbols[0]}': it was built for "
        f"another torch than {t.version}{abi_note}",
        s.when_broken,
        s.fix,
        (
            f"{_count(len(ext.missing_symbols), 'torch symbol')} it imports not exported by this torch's libraries",
            *(f"missing: {m}" for m in ext.missing_symbols[:3]),
        ),
        s.triggers,
    )


def _no_kernel_image(s: Subject, ext: ExtensionReport, gpu: Gpu, code: tuple[elf.GpuCode, ...]) -> Finding:
    assert gpu.capability is not None
    return Finding(
        f"{s.subject}:no-kernel-image",
        s.package,
        "error",
        f"{ext.path.name} has no GPU code for {gpu.device} ({cuda_arch.sm_name(gpu.capability)}): its first "
        "kernel fails with 'no kernel image is available for execution on the device'",
        "first forward",
        s.fix_for_gpu(gpu) if s.fix_for_gpu else s.fix,
        (f"{ext.path.name} carries {' '.join(c.name for c in code) or 'no GPU code'}",),
        s.triggers,
        gpu.device,
    )


def extension_findings(s: Subject, ext: ExtensionReport, here: System) -> list[Finding]:
    """The findings one extension gives: missing libraries, undefined torch symbols, CUDA runtime, GPU code."""
    t = here.torch
    out = [_missing_library(s, ext, t)] if ext.missing_libraries else []
    if ext.missing_symbols:
        out.append(_undefined_symbol(s, ext, t))
    torch_rt = torch_cudart(t)
    if ext.cudart and torch_rt and ext.cudart != torch_rt and ext.cudart not in ext.missing_libraries:
        out.append(
            Finding(
                f"{s.subject}:cuda-mismatch",
                s.package,
                "warning",
                f"{ext.path.name} runs on {ext.cudart} while torch uses {torch_rt}: two CUDA runtimes in one process",
                s.when_broken,
                s.fix,
                (f"torch {t.version} is built with CUDA {t.cuda}",),
                s.triggers,
            )
        )
    if ext.gpu_code is not None:
        code = ext.gpu_code
        out += [
            _no_kernel_image(s, ext, gpu, code)
            for gpu in here.gpus
            if gpu.capability and cuda_arch.verdict(code, gpu.capability) == "none"
        ]
    return out
