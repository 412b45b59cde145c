"""holders, free and the out-of-memory report in a real Jupyter kernel (ipykernel over jupyter_client).

The device is faked at the allocator boundary inside the kernel (tests/fake_allocator.py), in the CPU allocator's
words, so the failed device is the one the tensors live on; nbhw reads the fake's counters where it reads torch's.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.test_memory_kernel import Kernel

pytestmark = pytest.mark.slow

SETUP = """
%load_ext nbhw
import torch
from torch import nn
import nbhw.session
from tests.fake_allocator import FakeDevice, FakeMemory
gpu = FakeDevice(limit=10**9, words="cpu")
nbhw.session.device_memory = lambda: FakeMemory(gpu)
with gpu:
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    batch = torch.randn(512, 64)
def step(x):
    h = x[:128] * 2
    return model(h)
gpu.limit = gpu.allocated + 100_000
"""


def execute(kernel: Kernel, code: str, timeout: float = 120) -> list[dict[str, Any]]:
    """Run a cell; the iopub messages it caused, in order, until the kernel is idle again (errors included)."""
    msg_id = kernel.client.execute(code)
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = kernel.client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no idle after {code!r}: {messages}") from None
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return messages
        messages.append(msg)


def shown(messages: list[dict[str, Any]], mime: str = "text/plain") -> str:
    return "".join(m["content"]["data"].get(mime, "") for m in messages if m["msg_type"] == "display_data")


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    k = Kernel()
    try:
        errors = [m for m in execute(k, SETUP) if m["msg_type"] == "error"]
        assert not errors, errors
        yield k
    finally:
        k.close()


def test_the_report_shows_below_the_out_of_memory_error_of_the_same_cell(kernel: Kernel) -> None:
    messages = execute(kernel, "with gpu:\n    out = step(batch)")
    kinds = [m["msg_type"] for m in messages if m["msg_type"] in ("error", "display_data")]
    assert kinds == ["error", "display_data"]  # the report comes after the traceback, in the same cell
    assert next(m for m in messages if m["msg_type"] == "error")["content"]["ename"] == "RuntimeError"
    text = shown(messages)
    assert "nbhw: out of memory on cpu: the failed allocation was 128.0 KiB (131,072 bytes)" in text
    assert "model + the last error's frames: " in text  # the parameters: the model's, and the frames' while they last
    assert "free what the last error's traceback holds: gives back 32.0 KiB now (attribution)" in text
    assert "<pre class='nbhw-oom'>" in shown(messages, "text/html")


def test_holders_and_free_in_the_kernel(kernel: Kernel) -> None:
    execute(kernel, "with gpu:\n    out = step(batch)")  # h (32 KiB) is held only by the traceback's frames
    execute(kernel, "def make():\n    with gpu:\n        return torch.ones(100) * 2\n")
    execute(kernel, "make()")  # 400 bytes held only by the output history
    html = shown(execute(kernel, "%hw holders"), "text/html")
    assert "What keeps tensors alive" in html and "Out[" in html and "IPython reference" in html
    text = shown(execute(kernel, "%hw free --traceback --history"))
    assert "nbhw free: cleared the output history (1 entries)" in text
    [row] = [line.split() for line in text.splitlines() if line.strip().startswith("cpu ")]
    # 32,768 + 400 bytes, expected and measured; an older traceback in a reference cycle is given back apart, first.
    assert row[:5] == ["cpu", "32.4", "KiB", "32.4", "KiB"] and row[5] == "allocator", row
