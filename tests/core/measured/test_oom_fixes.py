"""The out-of-memory report's fixes from the run planner, in a real shell with nbhw's tiny model (real transformers)
generating on a device faked at the allocator boundary (tests/support/fake_allocator.py).

The report reads which generate() call ran out (its batch, prompt and max_length, from the traceback), plans that
model's run against what the device could give torch, and proposes a shorter context and a smaller batch with their
projected peaks; each proposed change, run for real on the same fake device, then fits.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nbhw.core.hf.tiny_model import tiny_model_path
from nbhw.core.measured import fixes as F
from nbhw.core.measured.run_asked import asked_run
from nbhw.session import out_of_memory_report, shell_free
from tests.support.cells import fails, run
from tests.support.fake_allocator import FakeDevice, FakeMemory

PROMPT, NEW, BATCH = 50, 150, 4  # the tiny model takes 256 positions
LONG = 199  # a prompt that fills the context: the run the planner sizes (prefill at context - 1, one decode)


@pytest.fixture
def shell(fresh_ip: Any) -> Any:
    torch.manual_seed(0)
    fresh_ip.user_ns.update(gpu=FakeDevice(limit=10**12), path=str(tiny_model_path()))
    run(fresh_ip, "import torch\nfrom transformers import AutoModelForCausalLM\n"
                  "model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)\n"
                  "with gpu:  # the weights move onto the fake device (loading maps the file: no op makes them)\n"
                  "    for t in [*model.parameters(), *model.buffers()]:\n"
                  "        t.data = t.data.clone()\n")  # fmt: skip
    assert fresh_ip.user_ns["gpu"].allocated >= sum(p.numel() * 4 for p in fresh_ip.user_ns["model"].parameters())
    return fresh_ip


def generate(batch: int, prompt: int, new: int) -> str:
    options = f"max_new_tokens={new}, min_new_tokens={new}, do_sample=False"
    ids = f"torch.randint(0, 100, ({batch}, {prompt}))"
    return f"with gpu, torch.no_grad():\n    ids = {ids}\n    out = model.generate(ids, {options})\n"


def peak_of(shell: Any, code: str) -> int:
    """The fake device's peak allocated bytes while a cell runs (limit lifted)."""
    gpu = shell.user_ns["gpu"]
    gpu.limit, top = 10**12, [0]
    real = gpu._add

    def add(storage: Any) -> None:
        real(storage)
        top[0] = max(top[0], gpu.allocated)

    gpu._add = add
    try:
        run(shell, code)
    finally:
        del gpu._add
    run(shell, "del out, ids")
    return top[0]


def test_the_run_that_ran_out_is_read_from_generates_frames(shell: Any) -> None:
    gpu = shell.user_ns["gpu"]
    gpu.limit = gpu.allocated + 100_000
    error = fails(shell, generate(BATCH, PROMPT, NEW))
    asked = asked_run(error)
    assert asked is not None and asked.model is shell.user_ns["model"]
    assert (asked.batch, asked.prompt, asked.context, asked.dtype) == (BATCH, PROMPT, PROMPT + NEW, "float32")
    assert asked_run(RuntimeError("not in generate")) is None


def test_fixes_come_from_the_planner_and_each_one_fits_when_run(shell: Any) -> None:
    gpu = shell.user_ns["gpu"]
    weights = gpu.allocated
    full = peak_of(shell, generate(BATCH, LONG, 1))
    gpu.limit = weights + (full - weights) // 2  # room for about half the run
    error = fails(shell, generate(BATCH, LONG, 1))
    assert isinstance(error, torch.OutOfMemoryError)
    report = out_of_memory_report(shell, error, memory=FakeMemory(gpu), device="cpu")
    planned = {f.change.split()[0]: f for f in report.fixes if f.by == "the run planner"}
    assert set(planned) == {"prompt", "batch"}, report.text()  # the CPU has nowhere to offload to
    assert all(f.fits and f.peak_bytes is not None and f.peak_bytes <= gpu.limit for f in planned.values())
    shorter = int(planned["prompt"].change.split("-> ")[1].split()[0])
    fewer = int(planned["batch"].change.split("-> ")[1])
    assert 0 < shorter < LONG and 1 <= fewer < BATCH
    assert f"prompt {LONG} -> {shorter} tokens: peak" in report.text()
    del error
    shell_free(shell, traceback=True, memory=FakeMemory(gpu))  # the report's last fix: the frames give back
    limit = gpu.limit
    for code in (generate(BATCH, shorter, 1), generate(fewer, LONG, 1)):
        measured = peak_of(shell, code)
        assert measured <= limit, f"the planner's fix ran to {measured:,} B, over the device's {limit:,} B: {code}"


def test_without_a_generate_call_the_report_says_what_it_projects_and_where() -> None:
    request = F.FitRequest("cuda:0", None, F.FailedAllocation("cuda:0", 1, "1 bytes", False), {}, [], "", None, 0)
    assert F.run_planner_fixes(request) == ()
