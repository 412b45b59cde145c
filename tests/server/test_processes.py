"""Per-process GPU memory: real kernels started by the test server, NVML's process lists faked."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tornado.httpclient import HTTPResponse

from nbhw.server import NbhwApp
from nbhw.server.processes import server_kernels
from tests.support.fakes import GIB, FakeGpu

Fetch = Callable[..., Awaitable[HTTPResponse]]
MIB = 2**20


async def run_in_kernel(jp_serverapp: Any, kernel_id: str, code: str) -> list[str]:
    """Run code in one of the server's kernels; the words it printed."""
    client = jp_serverapp.kernel_manager.get_kernel(kernel_id).client()
    client.start_channels()
    printed: list[str] = []

    def keep(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])

    try:
        await client.wait_for_ready(timeout=120)
        reply = await client.execute_interactive(code, output_hook=keep, timeout=120)
    finally:
        client.stop_channels()
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(printed).split()


@pytest.fixture
def strangers() -> Iterator[list[int]]:
    """PIDs of processes the test starts, killed at the end wherever they run."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            proc.kill()
            proc.wait(10)


@pytest.mark.slow
async def test_gpu_processes_carry_the_kernel_they_belong_to(
    fake_hw: Any, jp_fetch: Fetch, jp_serverapp: Any, nbhw_app: NbhwApp, strangers: list[int]
) -> None:
    fake = fake_hw.nvidia(FakeGpu(), FakeGpu())
    # A notebook's kernel (through a session) and a bare kernel, both started by this server.
    session = json.loads(
        (
            await jp_fetch(
                "api",
                "sessions",
                method="POST",
                body=json.dumps({"path": "work/train.ipynb", "type": "notebook", "kernel": {"name": "python3"}}),
            )
        ).body
    )
    notebook_kernel = session["kernel"]["id"]
    bare_kernel = json.loads(
        (await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))).body
    )["id"]

    # Each kernel says its own PID; the bare one also starts a child (a DataLoader worker, say).
    (notebook_pid,) = await run_in_kernel(jp_serverapp, notebook_kernel, "import os; print(os.getpid())")
    bare_pid, child_pid = await run_in_kernel(
        jp_serverapp,
        bare_kernel,
        "import os, subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "print(os.getpid(), child.pid)",
    )
    strangers.append(int(child_pid))
    # A process no kernel of this server started (another user's job, another server's kernel).
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    strangers.append(other.pid)

    fake.gpus[0].processes = [(int(notebook_pid), 3 * GIB), (other.pid, GIB)]
    fake.gpus[1].processes = [(int(bare_pid), 2 * GIB), (int(child_pid), 512 * MIB)]

    body = json.loads((await jp_fetch("nbhw", "api", "memory")).body)
    by_pid = {p["pid"]: p for p in body["processes"]}
    assert body["process_errors"] == {}
    assert by_pid[int(notebook_pid)] == {
        "device": "gpu0",
        "pid": int(notebook_pid),
        "used_memory": 3 * GIB,
        "kernel": {"id": notebook_kernel, "name": "python3", "pid": int(notebook_pid), "path": "work/train.ipynb"},
    }
    assert by_pid[other.pid]["kernel"] is None
    bare = {"id": bare_kernel, "name": "python3", "pid": int(bare_pid), "path": None}
    assert by_pid[int(bare_pid)]["kernel"] == bare
    assert by_pid[int(child_pid)]["kernel"] == bare  # the child belongs to the kernel that started it
    assert by_pid[int(child_pid)]["device"] == "gpu1"

    text = (await jp_fetch("nbhw", "metrics")).body.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    per_process = {
        (s.labels["device"], s.labels["pid"], s.labels["kernel_id"], s.labels["kernel_name"]): s.value
        for s in families["nbhw_gpu_process_memory_bytes"].samples
    }
    assert per_process == {
        ("gpu0", notebook_pid, notebook_kernel, "python3"): 3 * GIB,
        ("gpu0", str(other.pid), "", ""): GIB,
        ("gpu1", bare_pid, bare_kernel, "python3"): 2 * GIB,
        ("gpu1", child_pid, bare_kernel, "python3"): 512 * MIB,
    }
    per_kernel = {
        (s.labels["device"], s.labels["kernel_id"]): s.value for s in families["nbhw_kernel_gpu_memory_bytes"].samples
    }
    assert per_kernel == {("gpu0", notebook_kernel): 3 * GIB, ("gpu1", bare_kernel): 2.5 * GIB}

    # A kernel shut down is no longer anyone's owner: its PID, if NVML still lists it, shows without a kernel.
    await jp_fetch("api", "kernels", bare_kernel, method="DELETE")
    assert int(bare_pid) not in server_kernels(jp_serverapp.kernel_manager)
    body = json.loads((await jp_fetch("nbhw", "api", "memory")).body)
    assert {p["pid"]: p["kernel"] for p in body["processes"]}[int(bare_pid)] is None
    assert os.getpid() not in {p["pid"] for p in body["processes"]}
