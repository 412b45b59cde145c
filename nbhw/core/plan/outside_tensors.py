"""Around the run: what a backend holds outside tensors (:func:`framework_reserve`, a stated figure with its source)
and host memory while from_pretrained reads the checkpoint (:func:`host_load_peak`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reserve:
    """Device memory the framework holds outside any tensor: a stated figure, its source, and how to override it."""

    backend: str
    bytes: int
    what: str
    source: str


MiB = 2**20


def framework_reserve(
    backend: str,
    *,
    capability: tuple[int, int] | None = None,
    total_memory: int | None = None,
    override: int | None = None,
) -> Reserve:
    """The per-device reserve the plan adds to a device's peak (``override``: the user's own measured figure).

    These are stated figures with their sources, not measurements of this machine: no tracker sees a CUDA context.
    The GPU suite (where a GPU is lent) measures the real figure (mem_get_info before/after the first kernel) and
    records it next to the stated one.
    """
    if override is not None:
        return Reserve(backend, int(override), "your figure (--reserve)", "override")
    if backend in ("cuda", "nvidia"):
        return _cuda_reserve(backend, capability, total_memory)
    if backend in ("rocm", "hip"):
        return Reserve(
            backend,
            512 * MiB + 80 * MiB,
            "HIP context (no published figure; larger than CUDA's per vllm#43236) + hipBLASLt workspace "
            "(80 MiB default in the 2.13 ROCm builds)",
            "ROCm/pytorch#3657 / pytorch#197201 (hipBLASLt 80 MiB); context figure unmeasured: override it",
        )
    if backend == "xpu":
        return Reserve(
            backend,
            512 * MiB,
            "Level Zero context and oneDNN kernels (no published figure)",
            "unmeasured: override it; note pytorch#180145 (xe driver mirrors device allocations in host RAM)",
        )
    if backend == "mps":
        return Reserve(
            backend,
            0,
            "unified memory: the budget is torch.mps.recommended_max_memory() (Metal's "
            "recommendedMaxWorkingSetSize); PYTORCH_MPS_HIGH_WATERMARK_RATIO (default 1.7) caps allocations",
            "pytorch docs: MPS environment variables, torch.mps.recommended_max_memory",
        )
    if backend == "cpu":
        return Reserve(
            backend,
            520 * MiB,
            "the Python process: torch + transformers imports (~380 MiB RSS) and the "
            "lazy imports of the first from_pretrained (~140 MiB)",
            "measured with torch 2.13.0+cpu, transformers 5.24.0 (nbhw's run-planner notes)",
        )
    return Reserve(backend, 512 * MiB, "no figure for this backend", "unmeasured: override it")


# Hopper and later: NVML's bytes for the process minus torch's pool, after a bf16 generate with SDPA (nbhw's GPU suite,
# tests/gpu/test_run.py, on an H200 with torch 2.11.0+cu130 and driver 580.159.04, 2026-12-04). The published
# 300-400 MB (lazy loading, CUDA 11.7) was 222 MiB short there.
HOPPER_CONTEXT = 686 * MiB


def _cuda_reserve(backend: str, capability: tuple[int, int] | None, total_memory: int | None) -> Reserve:
    major = capability[0] if capability else 8
    # cuBLAS: CUBLAS_WORKSPACE_CONFIG default ":4096:2:16:8" (8 MiB + 128 KiB) before Hopper, 32 MiB from sm90;
    # cuBLASLt: 1 MiB, 4 MiB on Ampere >= 24 GiB, 32 MiB from sm90 (pytorch#120925).
    cublas = 32 * MiB if major >= 9 else (4096 * 2 + 16 * 8) * 1024
    lt = 32 * MiB if major >= 9 else 4 * MiB if major == 8 and (total_memory or 0) >= 24 * 2**30 else MiB
    workspaces = (
        "pytorch#120925 (cuBLASLt workspace sizes), CUBLAS_WORKSPACE_CONFIG default in "
        "aten/src/ATen/cuda/CublasHandlePool.cpp"
    )
    if major >= 9:
        return Reserve(
            backend,
            HOPPER_CONTEXT + cublas + lt,
            "CUDA context and the modules a generate loads (686 MiB measured on an H200) + cuBLAS / cuBLASLt "
            "workspaces",
            "measured by nbhw's GPU suite on an H200 (torch 2.11.0+cu130, driver 580.159.04; the published "
            f"~300-400 MB of pytorch#86509 / #109888 was 222 MiB short there); {workspaces}",
        )
    return Reserve(
        backend,
        400 * MiB + cublas + lt,
        "CUDA context with lazy module loading (~300-400 MB) + cuBLAS / cuBLASLt workspaces",
        "pytorch#86509 (287 MB lazy vs 667 MB eager loading, measured at merge), pytorch#109888 and "
        f"#107667 (maintainer: ~300-400 MB since CUDA 11.7 lazy loading; not measured here), {workspaces}",
    )


@dataclass(frozen=True)
class LoadPeak:
    """Host memory while from_pretrained reads a safetensors checkpoint (to the CPU, or through it to a device)."""

    private_bytes: int  # anonymous memory: cannot be reclaimed by the kernel
    file_bytes: int  # the checkpoint's mapped pages: page cache, reclaimable, but counted in RSS
    note: str

    @property
    def rss_bytes(self) -> int:
        """What top / a notebook memory monitor shows at the peak."""
        return self.private_bytes + self.file_bytes


def host_load_peak(loaded_bytes: int, checkpoint_bytes: int, *, cast: bool, mmap: bool = True) -> LoadPeak:
    """The load's host peak, by transformers 5.24's loading path (modeling_utils._load_pretrained_model and
    core_model_loading._materialize_copy), as measured by nbhw's load-peak test.

    ``loaded_bytes``: the weights that stay on the CPU. mmap (the default on Linux/macOS unless the file is on an HF
    mount): every shard is opened with safe_open and stays mapped until the whole load ends. Same dtype: tensors
    stay views of the mapping (nothing private; pages come in on first use). A cast: ``tensor[...].to(dtype)``
    makes a private copy in the new dtype, while the pages read stay resident until the files close.
    ``disable_mmap=True`` (and HF mounts): each file is read into memory and deserialised, so the file is held
    twice before the cast.
    """
    if not mmap:
        # Measured: 2.0x the file for float32 -> float32 and float32 -> bfloat16 alike; a cast to a wider dtype
        # (bfloat16 -> float32) without mmap was not measured, hence the max.
        held = max(2 * checkpoint_bytes, checkpoint_bytes + loaded_bytes)
        return LoadPeak(held, 0, "disable_mmap / HF mount: the file's bytes and their tensors are both private")
    if not cast:
        return LoadPeak(0, checkpoint_bytes, "same dtype: the weights are the checkpoint's mapped pages (file-backed)")
    return LoadPeak(
        loaded_bytes,
        checkpoint_bytes,
        "dtype cast: a private copy in the new dtype, plus the checkpoint's pages until the load ends",
    )
