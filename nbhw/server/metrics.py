"""The server sampler's latest figures in the Prometheus text exposition format (gauges, bytes)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily

from nbhw.core.memory import Trace
from nbhw.server.processes import GpuProcessMemory

# The classic text format: what every Prometheus version scrapes.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (device is the host, kind) -> (metric name, help); other devices are GPUs labelled by their name.
HOST = {
    "available": ("nbhw_host_memory_available_bytes", "Memory the machine can still give to processes (psutil)."),
    "capacity": ("nbhw_host_memory_total_bytes", "The machine's total memory (psutil)."),
    "rss": ("nbhw_server_resident_memory_bytes", "Resident memory of the Jupyter server process itself (psutil)."),
}
GPU = {
    "used": ("nbhw_gpu_memory_used_bytes", "Memory used on the GPU by all processes, as the driver reports it (NVML)."),
    "capacity": ("nbhw_gpu_memory_total_bytes", "The GPU's total memory (NVML)."),
}
PROCESS = (
    "nbhw_gpu_process_memory_bytes",
    "GPU memory held by one process; kernel labels empty when not this server's.",
)
KERNEL = ("nbhw_kernel_gpu_memory_bytes", "GPU memory held by one of this server's kernels and its child processes.")


class _Families:
    """A collector over families built beforehand (generate_latest only calls collect())."""

    def __init__(self, families: list[GaugeMetricFamily]) -> None:
        self.families = families

    def collect(self) -> Iterator[GaugeMetricFamily]:
        return iter(self.families)


def memory_families(traces: Sequence[Trace], latest: Mapping[str, int]) -> list[GaugeMetricFamily]:
    """One gauge family per host figure and per GPU figure, from the latest sample."""
    families: dict[str, GaugeMetricFamily] = {}
    for trace in traces:
        value = latest.get(trace.key)
        table, labels = (HOST, []) if trace.device == "host" else (GPU, ["device"])
        if value is None or trace.kind not in table:
            continue
        name, doc = table[trace.kind]
        family = families.setdefault(name, GaugeMetricFamily(name, doc, labels=labels))
        family.add_metric([] if trace.device == "host" else [trace.device], float(value))
    return list(families.values())


def process_families(processes: Sequence[GpuProcessMemory]) -> list[GaugeMetricFamily]:
    """Per process on each GPU, and per kernel (its processes summed)."""
    per_process = GaugeMetricFamily(*PROCESS, labels=["device", "pid", "kernel_id", "kernel_name"])
    per_kernel = GaugeMetricFamily(*KERNEL, labels=["device", "kernel_id", "kernel_name"])
    sums: dict[tuple[str, str, str], int] = {}
    for p in processes:
        if p.used_memory is None:
            continue
        kernel_id, kernel_name = (p.kernel.id, p.kernel.name or "") if p.kernel else ("", "")
        per_process.add_metric([p.device, str(p.pid), kernel_id, kernel_name], float(p.used_memory))
        if p.kernel:
            key = (p.device, kernel_id, kernel_name)
            sums[key] = sums.get(key, 0) + p.used_memory
    for labels, total in sums.items():
        per_kernel.add_metric(list(labels), float(total))
    return [per_process, per_kernel]


def exposition(
    traces: Sequence[Trace], latest: Mapping[str, int], processes: Sequence[GpuProcessMemory] | None
) -> bytes:
    """The text a Prometheus scrape gets; without per-process details when ``processes`` is None."""
    families = memory_families(traces, latest)
    if processes is not None:
        families += process_families(processes)
    collector: Any = _Families(families)
    data: bytes = generate_latest(collector)
    return data
