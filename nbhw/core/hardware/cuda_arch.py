"""Which GPU code runs on which NVIDIA GPU: torch's arch list read from its binary, and NVIDIA's rule.

torch's arch list is read from ``libtorch_python.so`` rather than asked of ``torch.cuda.get_arch_list()``: that
call (``torch._C._cuda_getArchFlags``) runs ``poison_fork()`` first (torch/csrc/cuda/Module.cpp), and from then on
every forked child fails with "Cannot re-initialize CUDA in forked subprocess" (accelerate's
``notebook_launcher`` forks), though CUDA was never initialised here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from packaging.version import InvalidVersion, Version

from nbhw.core.hardware import elf

Verdict = Literal["native", "jit", "none"]

# CUDA_ARCH_FLAGS as torch compiles it into libtorch_python.so ("sm_75 sm_80 ... sm_120"), NUL-terminated in .rodata.
# The closing NUL is a lookahead: two lists side by side share it, and both must be seen (then none is trusted).
_ARCH_FLAGS = re.compile(rb"\x00((?:sm|compute)_\d{2,3}[af]?(?: (?:sm|compute)_\d{2,3}[af]?)*)(?=\x00)")
_CODE_NAME = re.compile(r"^(sm|compute)_(\d{2,3})([af]?)$")

# The architectures PyTorch builds its Linux wheels for, per wheel index: TORCH_CUDA_ARCH_LIST in pytorch's
# .ci/manywheel/build_cuda.sh (cu126, cu128, cu129), and cu130 as torch 2.14.1+cu130 lists it. Only used to name
# the index in a fix (the check itself reads the installed torch); it needs a look at each torch release.
WHEEL_ARCHES = {
    "cu126": "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90",
    "cu128": "sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120",
    "cu129": "sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120",
    "cu130": "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120",
}
TORCH_WHEELS = "https://download.pytorch.org/whl"
ARCH_FLAGS_SOURCE = "CUDA_ARCH_FLAGS in libtorch_python.so"


def torch_lib_dir(torch: Any) -> Path:
    """torch/lib, where libtorch*.so and libc10*.so live."""
    return Path(torch.__file__).parent / "lib"


def arch_flags_library(lib_dir: Path) -> Path:
    """The library holding torch's CUDA_ARCH_FLAGS (the tests point this at a small ELF file of their own)."""
    return lib_dir / "libtorch_python.so"


def arch_list_from_binary(lib_dir: Path) -> tuple[str, ...] | None:
    """CUDA_ARCH_FLAGS as this torch was compiled with them; None when the library holds not exactly one list."""
    path = arch_flags_library(lib_dir)
    if not path.is_file():
        return None
    try:
        hits = elf.section_matches(path, ".rodata", _ARCH_FLAGS)
    except (OSError, elf.ElfError):
        return None
    return tuple(hits[0].split()) if len(hits) == 1 else None


def parse_code(name: str) -> elf.GpuCode | None:
    """'sm_90a' -> GpuCode('sm', 90, 'a'); None for anything else (a gfx name, 'sm_xx')."""
    m = _CODE_NAME.match(name.strip())
    return elf.GpuCode(m.group(1), int(m.group(2)), m.group(3)) if m else None


def codes(names: Iterable[str]) -> list[elf.GpuCode]:
    """The code objects an arch list names ('sm_80', 'compute_90a', ...), anything else left out."""
    return [c for c in (parse_code(n) for n in names) if c is not None]


def runs_on(code: elf.GpuCode, capability: tuple[int, int]) -> bool:
    """Whether a device of this compute capability can run this code object.

    NVIDIA's rules (CUDA Ada/Hopper/Blackwell Compatibility Guides, "Application Compatibility"; CUDA C++
    Programming Guide, "Compute Capabilities" / feature sets; NVIDIA blog "NVIDIA Blackwell and NVIDIA CUDA
    12.9 Introduce Family-Specific Architecture Features"): a cubin for X.y runs on X.z with z >= y, never on
    another major; PTX for X.y is JIT-compiled for any device of X.y or higher; 'a' (arch-specific) code runs
    only on exactly X.y; 'f' (family-specific) code runs on X.z with z >= y, PTX included.
    """
    major, minor = divmod(code.arch, 10)
    if code.suffix == "a":
        return capability == (major, minor)
    if code.kind == "sm" or code.suffix == "f":
        return capability[0] == major and capability[1] >= minor
    return capability >= (major, minor)


def verdict(found: Iterable[elf.GpuCode], capability: tuple[int, int]) -> Verdict:
    """'native' when a cubin runs, 'jit' when only PTX does (the driver compiles it at first use), else 'none'."""
    runnable = [c for c in found if runs_on(c, capability)]
    if any(c.kind == "sm" for c in runnable):
        return "native"
    return "jit" if runnable else "none"


def sm_name(capability: tuple[int, int]) -> str:
    """'sm_120' for compute capability 12.0."""
    return f"sm_{capability[0]}{capability[1]}"


def _index_cuda(index: str) -> Version:
    return Version(f"{index[2:-1]}.{index[-1]}")  # cu128 -> 12.8


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def torch_index_for(capabilities: Iterable[tuple[int, int]], driver_cuda: str | None) -> str | None:
    """The newest torch wheel index whose wheels run natively on every GPU and that the driver can run."""
    wanted = list(capabilities)
    driver = _version(driver_cuda)
    fitting = [
        index
        for index, flags in WHEEL_ARCHES.items()
        if (driver is None or _index_cuda(index) <= driver)
        and all(verdict(codes(flags.split()), cc) == "native" for cc in wanted)
    ]
    return max(fitting, key=_index_cuda) if fitting else None
