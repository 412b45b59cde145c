"""A real Jupyter kernel for tests (this venv's python, PYTHONPATH inherited), and what its messages showed."""

from __future__ import annotations

import os
import queue
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from jupyter_client.manager import KernelManager


class Kernel:
    """A real ipykernel started with this venv's python; PYTHONPATH is inherited."""

    def __init__(self) -> None:
        self.manager = KernelManager(kernel_name="python3")
        self.manager.kernel_spec.argv[0] = sys.executable
        self.manager.start_kernel(env=dict(os.environ))
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)

    def run(self, code: str, timeout: float = 60) -> tuple[str, list[dict[str, Any]]]:
        """Execute a cell; its stdout, and every iopub message that arrived while it ran."""
        msg_id = self.client.execute(code)
        out: list[str] = []
        seen: list[dict[str, Any]] = []
        running = False
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"cell did not finish in {timeout} s: {code!r}") from None
            mine = msg["parent_header"].get("msg_id") == msg_id
            kind = msg["msg_type"]
            if mine and kind == "execute_input":
                running = True
            elif mine and kind == "status" and msg["content"]["execution_state"] == "idle":
                break
            elif mine and kind == "stream" and msg["content"]["name"] == "stdout":
                out.append(msg["content"]["text"])
            elif mine and kind == "error":
                raise AssertionError("\n".join(msg["content"]["traceback"]))
            if running:
                seen.append(msg)
        return "".join(out), seen

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


@pytest.fixture(name="kernel")
def fresh_kernel() -> Iterator[Kernel]:
    """The ``kernel`` fixture: a fresh real kernel for one test, shut down after it. A test module gets it by
    importing it (``from tests.support.kernel import fresh_kernel``; pytest finds it under the name ``kernel``)."""
    k = Kernel()
    try:
        yield k
    finally:
        k.close()


def shown(messages: list[dict[str, Any]], mime: str = "text/plain") -> str:
    return "".join(m["content"]["data"].get(mime, "") for m in messages if m["msg_type"] == "display_data")
