"""How cuda:N maps to physical NVIDIA GPUs: CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, read without a CUDA context.

CUDA numbers devices FASTEST_FIRST unless CUDA_DEVICE_ORDER=PCI_BUS_ID; nvidia-smi and NVML number them in
PCI bus order. CUDA_VISIBLE_DEVICES indexes CUDA's order. The parsing rules are torch's own
(``torch.cuda._parse_visible_devices``), so a GPU list means here what it means to torch.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from nbhw.core.hardware.data import GpuOrderRow
from nbhw.core.hardware.nvml import NvmlGpu


@dataclass
class VisibleGpus:
    """The GPUs CUDA would show this process, in cuda:N order."""

    rows: list[GpuOrderRow] = field(default_factory=list)
    exact: bool = True
    hides_all: bool = False
    order_differs_from_nvidia_smi: bool = False
    problems: list[str] = field(default_factory=list)
    initialised_rows: list[GpuOrderRow] | None = None


def _torch_cuda() -> Any | None:
    torch = sys.modules.get("torch")
    return getattr(torch, "cuda", None) if torch is not None else None


def _selection(gpus: list[NvmlGpu]) -> tuple[list[int] | None, list[str]]:
    """Indices into CUDA's base order that CUDA_VISIBLE_DEVICES selects, and what looked wrong."""
    cuda = _torch_cuda()
    parse = getattr(cuda, "_parse_visible_devices", None)
    if cuda is None or parse is None:
        return None, ["this torch has no CUDA_VISIBLE_DEVICES parser to ask; mapping not shown"]
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    picked: list[Any] = list(parse())
    problems: list[str] = []
    if picked and isinstance(picked[0], str):
        if picked[0].startswith("MIG-"):
            return None, ["CUDA_VISIBLE_DEVICES names MIG instances; nbhw shows the parent GPUs only"]
        uuids = [g.uuid or "" for g in gpus]
        picked = list(cuda._transform_uuid_to_ordinals(picked, uuids))
    kept: list[int] = []
    for value in picked:
        if int(value) >= len(gpus):
            if raw is None:
                break
            problems.append(
                f"CUDA_VISIBLE_DEVICES={raw!r} names GPU {value}, which does not exist; "
                "it and later entries are ignored"
            )
            break
        kept.append(int(value))
    if raw is not None and raw.strip() and not kept and not problems:
        problems.append(f"CUDA_VISIBLE_DEVICES={raw!r} selects no GPU (invalid or repeated entries hide all)")
    return kept, problems


def _base_order(gpus: list[NvmlGpu]) -> tuple[list[NvmlGpu], bool]:
    """CUDA's device order before CUDA_VISIBLE_DEVICES, and whether it is certain."""
    if os.environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") == "PCI_BUS_ID":
        return list(gpus), True
    # FASTEST_FIRST is a driver heuristic: newest compute capability first, ties in PCI order.
    ranked = sorted(gpus, key=lambda g: tuple(-c for c in (g.compute_capability or (0, 0))))
    same_kind = len({(g.name, g.compute_capability) for g in gpus}) <= 1
    return ranked, same_kind


def _row(ordinal: int, gpu: NvmlGpu) -> GpuOrderRow:
    return GpuOrderRow(f"cuda:{ordinal}", gpu.index, gpu.name, gpu.pci_bus_id, gpu.uuid)


def _initialised_rows(gpus: list[NvmlGpu]) -> list[GpuOrderRow] | None:
    """The mapping CUDA really uses, read from torch once it has initialised CUDA itself (no new context)."""
    cuda = _torch_cuda()
    if cuda is None or not cuda.is_initialized():
        return None
    by_uuid = {(g.uuid or "").removeprefix("GPU-"): g for g in gpus}
    rows = []
    for ordinal in range(cuda.device_count()):
        uuid = str(cuda.get_device_properties(ordinal).uuid).removeprefix("GPU-")
        gpu = by_uuid.get(uuid)
        if gpu is None:
            return None
        rows.append(_row(ordinal, gpu))
    return rows


def visible_gpus(gpus: list[NvmlGpu]) -> VisibleGpus:
    """Map cuda:N to NVML GPUs the way CUDA will, and say where that differs from nvidia-smi."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is not None and raw.strip() == "":
        return VisibleGpus(hides_all=True)
    selection, problems = _selection(gpus)
    if selection is None:
        return VisibleGpus(exact=False, problems=problems)
    base, exact = _base_order(gpus)
    rows = [_row(n, base[i]) for n, i in enumerate(selection)]
    pci_rows = [_row(n, gpus[i]) for n, i in enumerate(selection)]
    result = VisibleGpus(rows=rows, exact=exact, problems=problems)
    result.order_differs_from_nvidia_smi = any(
        r.nvml_index != p.nvml_index for r, p in zip(rows, pci_rows, strict=True)
    )
    try:
        result.initialised_rows = _initialised_rows(gpus)
    except Exception:
        result.initialised_rows = None
    if result.initialised_rows is not None:
        result.exact = True
    return result
