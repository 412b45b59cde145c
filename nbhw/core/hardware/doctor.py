"""``nbhw.doctor()``: the pre-flight checks of the installed binaries, before memory is ever the problem.

The worst failures come first: a torch wheel with no kernels for this GPU ("no kernel image is available" while
``torch.cuda.is_available()`` is True), a flash-attn wheel built for another torch ("undefined symbol"), a
bitsandbytes build without this backend, a Hub kernel with no build for this torch, a package installed again
while its old version runs (``%pip install -U`` in a running kernel). Each check reads files (ELF
headers, symbol tables, fat binaries, wheel metadata, the HF cache) and never loads an extension it checks
(flash-attn and bitsandbytes are not imported; the ``kernels`` package is, for its own build resolver), creates a
CUDA context, calls into the CUDA driver, arms torch's fork trap, or touches the network.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from nbhw.core.hardware import cuda_arch, nvml, package_checks, probes, since_start, visible_devices
from nbhw.core.hardware.extensions import loaded_sonames
from nbhw.core.hardware.findings import Check, Finding, Gpu, Preflight, System, TorchFacts

CheckResult = tuple[list[Finding], list[Check]]
ROCM_ARCH_NOT_READ = (
    "a ROCm build's list is only given by torch.cuda.get_arch_list(), which arms torch's fork trap "
    "(forked children then fail to start HIP); nbhw asks it only once torch has initialised HIP itself"
)


# ---------------------------------------------------------------- what is installed here


def _companions() -> tuple[tuple[str, str], ...]:
    found = []
    for dist in ("torchvision", "torchaudio"):
        try:
            found.append((dist, importlib.metadata.version(dist)))
        except importlib.metadata.PackageNotFoundError:
            continue
    return tuple(found)


def _cxx11_abi_of(torch: Any) -> bool | None:
    # The public torch.compiled_with_cxx11_abi() returns torch._C._GLIBCXX_USE_CXX11_ABI: no device involved.
    fn = getattr(torch, "compiled_with_cxx11_abi", None)
    return bool(fn()) if callable(fn) else None


def arch_list(torch: Any, lib_dir: Path) -> tuple[tuple[str, ...], str]:
    """(the architectures this torch was built for, where that was read), without arming the fork trap."""
    version = getattr(torch, "version", None)
    if getattr(version, "hip", None):
        if not torch.cuda.is_initialized():
            return (), ROCM_ARCH_NOT_READ
        return tuple(torch.cuda.get_arch_list()), "torch.cuda.get_arch_list()"
    if not getattr(version, "cuda", None):
        return (), ""
    found = cuda_arch.arch_list_from_binary(lib_dir)
    if found is None:
        return (), "libtorch_python.so holds no single CUDA_ARCH_FLAGS list"
    return found, cuda_arch.ARCH_FLAGS_SOURCE


def torch_facts() -> TorchFacts | None:
    """The installed torch, or None when it is not installed."""
    torch = probes.torch_module()
    if torch is None:
        return None
    version = getattr(torch, "version", None)
    cuda, hip = getattr(version, "cuda", None), getattr(version, "hip", None)
    lib_dir = cuda_arch.torch_lib_dir(torch)
    arch, source = arch_list(torch, lib_dir)
    return TorchFacts(
        version=str(torch.__version__),
        cuda=cuda,
        hip=hip,
        xpu=getattr(version, "xpu", None),
        cxx11_abi=_cxx11_abi_of(torch),
        arch_list=arch,
        arch_source=source,
        lib_dir=lib_dir if lib_dir.is_dir() else None,
        loaded_sonames=loaded_sonames(lib_dir),
        companions=_companions(),
        driver_cuda=nvml.read().cuda_driver_version if cuda else None,
    )


def gfx_from_sysfs(root: Path = Path("/sys/class/kfd/kfd/topology/nodes")) -> list[str]:
    """AMD GPU targets from the amdgpu driver's topology files (gfx_target_version 90402 -> gfx942)."""
    targets = []
    for props in sorted(root.glob("*/properties")):
        try:
            text = props.read_text()
        except OSError:
            continue
        m = re.search(r"^gfx_target_version (\d+)$", text, re.MULTILINE)
        if m and int(m.group(1)):
            v = int(m.group(1))
            targets.append(f"gfx{v // 10000}{(v // 100) % 100:x}{v % 100:x}")
    return targets


def _amd_gpus() -> tuple[Gpu, ...]:
    # amdsmi when installed (nbhw's ROCm probe), else the driver's sysfs files: never HIP itself.
    if probes.module_installed("amdsmi"):
        probed = probes.probe_cuda_rocm()
        found = [Gpu(d.device, d.name, gfx=d.compute_capability) for d in probed.devices]
        if found and all(g.gfx for g in found):
            return tuple(found)
    return tuple(Gpu(f"cuda:{i}", gfx=gfx) for i, gfx in enumerate(gfx_from_sysfs()))


def _nvidia_gpus() -> tuple[Gpu, ...]:
    # NVML and CUDA_VISIBLE_DEVICES as nbhw's cuda probe reads them: cuda:N in the order CUDA will number them.
    view = nvml.read()
    if not view.available:
        return ()
    visible = visible_devices.visible_gpus(view.gpus)
    by_index = {g.index: g for g in view.gpus}
    rows = visible.initialised_rows or visible.rows
    return tuple(
        Gpu(f"cuda:{n}", by_index[r.nvml_index].name, capability=by_index[r.nvml_index].compute_capability)
        for n, r in enumerate(rows)
    )


def gpus(torch: TorchFacts) -> tuple[Gpu, ...]:
    """The GPUs this torch would use, from NVML / amdsmi / sysfs (no CUDA context)."""
    if torch.hip:
        return _amd_gpus()
    if torch.cuda:
        return _nvidia_gpus()
    return ()


def system() -> System | None:
    """This machine, or None when torch is not installed."""
    facts = torch_facts()
    if facts is None:
        return None
    return System(torch=facts, gpus=gpus(facts))


# ---------------------------------------------------------------- torch's architectures against the GPUs


def _reinstall_torch(torch: TorchFacts, index: str) -> str:
    pins = " ".join([f"torch=={torch.base_version}"] + [f"{d}=={v.split('+')[0]}" for d, v in torch.companions])
    return f"pip install --force-reinstall {pins} --index-url {cuda_arch.TORCH_WHEELS}/{index}"


def _torch_fix(here: System, gpu: Gpu) -> str:
    """Reinstall from the newest index that runs every GPU natively; else update the driver first; else build."""
    assert gpu.capability is not None
    ccs = [g.capability for g in here.gpus if g.capability]
    index = cuda_arch.torch_index_for(ccs, here.torch.driver_cuda)
    if index:
        return _reinstall_torch(here.torch, index)
    newest = cuda_arch.torch_index_for(ccs, None)
    if newest:
        return f"update the NVIDIA driver, then {_reinstall_torch(here.torch, newest)}"
    return f"build torch from source with TORCH_CUDA_ARCH_LIST={gpu.capability[0]}.{gpu.capability[1]}"


def _arch_finding(here: System, gpu: Gpu, verdict: str) -> Finding:
    t = here.torch
    assert gpu.capability is not None
    sm = cuda_arch.sm_name(gpu.capability)
    evidence = (
        f"torch {t.version} was built for {' '.join(t.arch_list)} ({t.arch_source})",
        f"{gpu.device} ({gpu.name or 'GPU'}) has compute capability {gpu.capability[0]}.{gpu.capability[1]} (NVML)",
    )
    if verdict == "jit":
        what = (
            f"{gpu.device} has no native torch kernels ({sm}); the driver compiles them from PTX on first use "
            "(a slow first run, and newer features may be missing)"
        )
        return Finding(
            "torch:ptx-only", "torch", "warning", what, "first forward", _torch_fix(here, gpu), evidence,
            (), gpu.device,
        )  # fmt: skip
    what = (
        f"torch has no kernels for {gpu.device} ({sm}): the first operation on it fails with 'CUDA error: no "
        "kernel image is available for execution on the device', although torch.cuda.is_available() is True"
    )
    return Finding(
        "torch:no-kernel-image", "torch", "error", what, "load", _torch_fix(here, gpu), evidence,
        (), gpu.device,
    )  # fmt: skip


def _rocm_finding(here: System, gpu: Gpu, built: set[str]) -> Finding:
    t = here.torch
    return Finding(
        "torch:no-kernel-image",
        "torch",
        "error",
        f"torch has no code objects for {gpu.device} ({gpu.gfx}): the first operation on it fails with "
        "'HIP error: invalid device function'",
        "load",
        f"pip install --force-reinstall torch=={t.base_version} --index-url {probes.ROCM_WHEELS} "
        f"(a ROCm build whose torch.cuda.get_arch_list() lists {gpu.gfx})",
        (f"torch {t.version} was built for {' '.join(sorted(built))} ({t.arch_source})", f"{gpu.device} is {gpu.gfx}"),
        (),
        gpu.device,
    )


def _check_rocm_arch(here: System) -> CheckResult:
    built = {a.split(":")[0] for a in here.torch.arch_list}
    if not built:
        return [], [Check("torch architectures", "unknown", here.torch.arch_source)]
    if any(a.endswith("-generic") for a in built):
        # A generic target may cover these GPUs; LLVM decides which, and nbhw does not guess.
        return [], [Check("torch architectures", "unknown", f"built for {' '.join(sorted(built))} (generic)")]
    findings = [_rocm_finding(here, g, built) for g in here.gpus if g.gfx and g.gfx.split(":")[0] not in built]
    status: Literal["ok", "finding"] = "finding" if findings else "ok"
    return findings, [Check("torch architectures", status, f"built for {' '.join(sorted(built))}")]


def check_torch_arch(here: System) -> CheckResult:
    """The architectures the installed torch was built for against each GPU."""
    t = here.torch
    if not (t.cuda or t.hip):
        return [], [Check("torch architectures", "skipped", f"torch {t.version} is a CPU build")]
    if not here.gpus:
        return [], [Check("torch architectures", "skipped", "no GPU visible to this process")]
    if t.hip:
        return _check_rocm_arch(here)
    found = cuda_arch.codes(t.arch_list)
    if not found:
        return [], [Check("torch architectures", "unknown", f"could not read this torch's arch list: {t.arch_source}")]
    findings = []
    for gpu in here.gpus:
        verdict = cuda_arch.verdict(found, gpu.capability) if gpu.capability else "native"
        if verdict != "native":
            findings.append(_arch_finding(here, gpu, verdict))
    status: Literal["ok", "finding"] = "finding" if findings else "ok"
    return findings, [Check("torch architectures", status, f"built for {' '.join(t.arch_list)} ({t.arch_source})")]


# ---------------------------------------------------------------- all of it

CHECKS: tuple[Callable[[System], CheckResult], ...] = (
    check_torch_arch,
    package_checks.check_flash_attn,
    package_checks.check_bitsandbytes,
    package_checks.check_kernels,
    since_start.check_installed_since_start,
)


def doctor(here: System | None = None) -> Preflight:
    """Run every pre-flight check: ``nbhw.doctor()``, ``%hw doctor``, ``python -m nbhw doctor [--json]``.

    ``here`` gives the facts to check against instead of this machine's: a :class:`nbhw.System` of a torch
    (:class:`nbhw.TorchFacts`) and GPUs (:class:`nbhw.Gpu`) you describe.
    """
    if here is None:
        probes.torch_module()  # torch's own import is not the checks' time (``seconds``)
    start = time.perf_counter()
    here = here or system()
    if here is None:
        return Preflight([], [Check("torch", "skipped", "torch is not installed")], time.perf_counter() - start)
    findings: list[Finding] = []
    checks: list[Check] = []
    for check in CHECKS:
        found, looked = check(here)
        findings += found
        checks += looked
    return Preflight(findings, checks, time.perf_counter() - start)


# Plans ask again and again (the panel re-plans on every change): a result is kept while nothing it depends on
# changed (where packages are found, the variables the checks read, torch's build, the NVML module) and for at
# most RECENT_SECONDS, so a fix installed meanwhile shows at the next plan after that.
RECENT_SECONDS = 10.0
_ENVIRONMENT = ("LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "BNB_CUDA_VERSION", "KERNELS_CACHE")
_recent: dict[str, Any] = {}
_recent_lock = threading.Lock()


def _fingerprint() -> tuple[Any, ...]:
    version = getattr(sys.modules.get("torch"), "version", None)
    return (
        tuple(sys.path),
        tuple(os.environ.get(n) for n in _ENVIRONMENT),
        getattr(version, "cuda", None),
        getattr(version, "hip", None),
        id(sys.modules.get("pynvml")),
    )


def recent() -> Preflight:
    """:func:`doctor` for plans: the last result while it is fresh and its inputs did not change."""
    key = _fingerprint()
    with _recent_lock:
        kept = _recent.get("result")
        if kept is not None and _recent.get("key") == key and time.monotonic() - _recent["at"] < RECENT_SECONDS:
            result: Preflight = kept
            return result
    result = doctor()
    with _recent_lock:
        _recent.update(result=result, key=key, at=time.monotonic())
    return result


def forget_recent() -> None:
    """Drop the kept result (after installing a fix, or between tests)."""
    with _recent_lock:
        _recent.clear()
