"""The Jupyter server extension app: settings, the server's memory sampler, the devices report, the routes."""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Float, TraitError, default, validate

from nbhw.core.errors import UserError
from nbhw.core.memory import sampling
from nbhw.core.memory.sampling import MAX_INTERVAL, MIN_INTERVAL, Sampler
from nbhw.core.memory.sources import machine_sources
from nbhw.server import metrics
from nbhw.server.handlers import ReportFailed, Stopped, routes
from nbhw.server.processes import KernelRef, gpu_processes, nvml_gpus, server_kernels

# `python -m nbhw report --json` runs in a child process: the server never imports torch or a vendor plugin.
REPORT_COMMAND = ("-m", "nbhw", "report", "--json")
REPORT_TIMEOUT = 120.0
# The child starts in the folder holding the nbhw package this server imported, so `-m nbhw` finds that copy
# rather than an `nbhw/` folder in the server's working directory.
PACKAGE_PARENT = Path(__file__).resolve().parents[2]


def env_float(name: str, fallback: float) -> float:
    """A number from the environment, ``fallback`` when unset; a TraitError naming the variable when malformed."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return fallback
    try:
        return float(raw)
    except ValueError:
        raise TraitError(f"{name} must be a number of seconds; got {raw!r}") from None


def env_bool(name: str, fallback: bool) -> bool:
    """A yes/no from the environment (1/0, true/false, yes/no, on/off), ``fallback`` when unset."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return fallback
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise TraitError(f"{name} must be one of 1, 0, true, false, yes, no, on, off; got {raw!r}")


# Checks for configured values and for environment defaults alike (traitlets does not validate dynamic defaults).
def check_interval(value: float) -> float:
    """Seconds between samples, in the sampler's range."""
    if not MIN_INTERVAL <= value <= MAX_INTERVAL:
        raise TraitError(f"NbhwApp.interval must be between {MIN_INTERVAL} and {MAX_INTERVAL:g} seconds; got {value!r}")
    return float(value)


def check_window(value: float) -> float:
    """Seconds of history: positive and finite."""
    if not 0 < value < math.inf:
        raise TraitError(f"NbhwApp.window must be a positive number of seconds; got {value!r}")
    return float(value)


def check_max_age(value: float) -> float:
    """Seconds a devices report is reused: 0 or more, finite."""
    if not 0 <= value < math.inf:
        raise TraitError(f"NbhwApp.devices_max_age must be a number of seconds, 0 or more; got {value!r}")
    return float(value)


class NbhwApp(ExtensionApp):
    """nbhw in the Jupyter server: the host's devices, GPU and host memory, and Prometheus metrics under /nbhw/."""

    name = "nbhw"
    description = __doc__

    interval = Float(
        help=f"Seconds between the server's memory samples ({MIN_INTERVAL} to {MAX_INTERVAL:g}); "
        "default $NBHW_SERVER_INTERVAL or 1.0."
    ).tag(config=True)
    window = Float(help="Seconds of memory history kept; default $NBHW_SERVER_WINDOW or 600.").tag(config=True)
    per_process = Bool(
        help="Show each GPU process (PID, memory, and the kernel it belongs to) in /nbhw/api/memory and "
        "/nbhw/metrics; default $NBHW_SERVER_PER_PROCESS or true."
    ).tag(config=True)
    devices_max_age = Float(
        help="Seconds a devices report is reused before /nbhw/api/devices runs the report again; "
        "default $NBHW_SERVER_DEVICES_MAX_AGE or 60."
    ).tag(config=True)

    @default("interval")
    def _interval_default(self) -> float:
        return check_interval(env_float("NBHW_SERVER_INTERVAL", 1.0))

    @default("window")
    def _window_default(self) -> float:
        return check_window(env_float("NBHW_SERVER_WINDOW", 600.0))

    @default("per_process")
    def _per_process_default(self) -> bool:
        return env_bool("NBHW_SERVER_PER_PROCESS", True)

    @default("devices_max_age")
    def _devices_max_age_default(self) -> float:
        return check_max_age(env_float("NBHW_SERVER_DEVICES_MAX_AGE", 60.0))

    @validate("interval")
    def _valid_interval(self, proposal: Any) -> float:
        return check_interval(proposal["value"])

    @validate("window")
    def _valid_window(self, proposal: Any) -> float:
        return check_window(proposal["value"])

    @validate("devices_max_age")
    def _valid_max_age(self, proposal: Any) -> float:
        return check_max_age(proposal["value"])

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._sampler: Sampler | None = None
        self._sampler_lock = asyncio.Lock()
        self._stopped = False
        self._report: tuple[float, str] | None = None
        self._report_task: asyncio.Future[str] | None = None

    # -- extension hooks

    def initialize_settings(self) -> None:
        """Check that interval and window go together before any route can start the sampler."""
        try:
            sampling.validate(self.interval, self.window)
        except UserError as exc:
            raise TraitError(f"NbhwApp: {exc}") from None

    def initialize_handlers(self) -> None:
        """The routes, under the server's base_url."""
        self.handlers.extend(routes())

    async def stop_extension(self) -> None:
        """Stop the sampler and any report still running; later requests get 503."""
        self._stopped = True
        if self._report_task is not None and not self._report_task.done():
            self._report_task.cancel()
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.stop()

    # -- the sampler

    @property
    def sampler(self) -> Sampler | None:
        """The server's sampler once a route has started it."""
        return self._sampler

    async def started_sampler(self) -> Sampler:
        """The server's sampler, created and started on first use (NVML's first call is made off the IO loop)."""
        self._check_running()
        async with self._sampler_lock:
            if self._sampler is None:
                loop = asyncio.get_running_loop()
                sampler = await loop.run_in_executor(None, self._new_sampler)
                if self._stopped:
                    sampler.stop()
                    self._check_running()
                self._sampler = sampler
        return self._sampler

    def _new_sampler(self) -> Sampler:
        # The host and the GPUs by nvidia-smi index, whether or not something imported torch in this process.
        return Sampler(self.interval, self.window, sources=machine_sources()).start()

    def _check_running(self) -> None:
        if self._stopped:
            raise Stopped("the nbhw server extension has stopped (the server is shutting down)")

    async def kernels(self, sampler: Sampler) -> dict[int, KernelRef]:
        """PID -> this server's kernel, with the notebook each kernel's session has open (when there are GPUs)."""
        if not self.per_process or self.serverapp is None or not nvml_gpus(sampler.sources()):
            return {}
        paths: dict[str, str] = {}
        try:
            sessions = await ensure_async(self.serverapp.session_manager.list_sessions())
            paths = {s["kernel"]["id"]: s["path"] for s in sessions if s.get("kernel")}
        except Exception as exc:  # a server without sessions still maps kernels to PIDs
            self.log.debug("nbhw: sessions not read: %s", exc)
        return server_kernels(self.serverapp.kernel_manager, paths)

    async def memory_body(self, since: float | None) -> dict[str, Any]:
        """The body of /nbhw/api/memory."""
        sampler = await self.started_sampler()
        kernels = await self.kernels(sampler)
        return await asyncio.get_running_loop().run_in_executor(None, self._memory, sampler, since, kernels)

    def _memory(self, sampler: Sampler, since: float | None, kernels: dict[int, KernelRef]) -> dict[str, Any]:
        body: dict[str, Any] = sampler.samples(since=since).to_dict()
        body.update(window=sampler.window, running=sampler.running, now=sampler.wall_time())
        body["latest"] = sampler.latest or sampler.read_now().values
        body["processes"], body["process_errors"] = None, {}
        if self.per_process:
            found, errors = gpu_processes(nvml_gpus(sampler.sources()), kernels)
            body["processes"], body["process_errors"] = [p.to_dict() for p in found], errors
        return body

    async def metrics_body(self) -> bytes:
        """The body of /nbhw/metrics."""
        sampler = await self.started_sampler()
        kernels = await self.kernels(sampler)
        return await asyncio.get_running_loop().run_in_executor(None, self._metrics, sampler, kernels)

    def _metrics(self, sampler: Sampler, kernels: dict[int, KernelRef]) -> bytes:
        latest = sampler.latest or sampler.read_now().values
        found = gpu_processes(nvml_gpus(sampler.sources()), kernels)[0] if self.per_process else None
        return metrics.exposition(sampler.traces, latest, found)

    # -- the devices report

    async def devices_body(self) -> str:
        """`python -m nbhw report --json` for this host, reused for ``devices_max_age`` seconds; one run at a time."""
        self._check_running()
        cached = self._report
        if cached is not None and time.monotonic() - cached[0] < self.devices_max_age:
            return cached[1]
        if self._report_task is None or self._report_task.done():
            self._report_task = asyncio.ensure_future(self._run_report())
        # Shielded: a client that goes away does not cancel the run the others wait for.
        return await asyncio.shield(self._report_task)

    async def _run_report(self) -> str:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *REPORT_COMMAND,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=PACKAGE_PARENT,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), REPORT_TIMEOUT)
        except asyncio.TimeoutError:
            raise ReportFailed(f"python -m nbhw report --json took more than {REPORT_TIMEOUT:g} s") from None
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        if proc.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines() or ["no message"]
            raise ReportFailed(f"python -m nbhw report --json exited with {proc.returncode}: {lines[-1]}")
        text = out.decode()
        try:
            json.loads(text)
        except ValueError as exc:
            raise ReportFailed(f"python -m nbhw report --json printed no JSON: {exc}") from None
        self._report = (time.monotonic(), text)
        return text
