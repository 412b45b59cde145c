"""The out-of-memory report: recognised from torch's classes and messages; in a real shell with a fake device.

The device is faked at the allocator boundary (tests/support/fake_allocator.py): an op that would go over its
limit raises what the backend raises. The report's holders, its failed size and its fixes (the planner's projected
peaks, and
freeing what the traceback holds) are checked against what the shell holds.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import pytest
import torch

import nbhw.session
from nbhw.core.measured import fixes as F
from nbhw.core.measured.oom_report import OutOfMemory
from nbhw.core.memory import keeps_alive
from nbhw.core.memory import out_of_memory as oom
from nbhw.core.render import size
from nbhw.session import out_of_memory_report, shell_free
from tests.support.cells import fails, run
from tests.support.fake_allocator import FakeDevice, FakeMemory

GIB, MIB = 1024**3, 1024**2

CUDA = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.06 GiB is "
    "free. Process 1234 has 78.08 GiB memory in use. Of the allocated memory 76.50 GiB is allocated by PyTorch, and "
    "1.02 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)
CUDA_OLD = (
    "CUDA out of memory. Tried to allocate 36.00 MiB (GPU 1; 7.93 GiB total capacity; 130.35 MiB already allocated; "
    "47.06 MiB free; 188.00 MiB reserved in total by PyTorch)"
)
XPU = (
    "XPU out of memory. Tried to allocate 1.00 GiB. GPU 1 has a total capacity of 15.11 GiB of which 0 bytes is free. "
    "Of the allocated memory 14.00 GiB is allocated by PyTorch, and 12.00 MiB is reserved by PyTorch but unallocated."
)
MPS = (
    "MPS backend out of memory (MPS allocated: 8.00 GB, other allocations: 1.20 GB, max allowed: 9.07 GB). Tried to "
    "allocate 512.00 MB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit."
)
HIP = (
    "HIP out of memory. Tried to allocate 20.00 MiB. GPU 3 has a total capacity of 191.98 GiB of which 4.00 MiB "
    "is free."
)
ACCELERATOR = "CUDA error: out of memory\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."


def test_the_out_of_memory_classes_are_read_from_torch() -> None:
    found = oom.out_of_memory_types()
    assert torch.OutOfMemoryError in found
    assert torch.cuda.OutOfMemoryError is torch.OutOfMemoryError  # one class in torch 2.13, re-exported


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (torch.OutOfMemoryError(CUDA), ("cuda:0", 2 * GIB, round(79.15 * GIB), round(1.06 * GIB), round(76.5 * GIB))),
        (torch.OutOfMemoryError(CUDA_OLD), ("cuda:1", 36 * MIB, round(7.93 * GIB), round(47.06 * MIB), 136681882)),
        (torch.OutOfMemoryError(XPU), ("xpu:1", GIB, round(15.11 * GIB), 0, 14 * GIB)),
        (RuntimeError(MPS), ("mps", 512 * MIB, None, None, None)),  # TORCH_CHECK(false, ...): a RuntimeError
        (torch.OutOfMemoryError(HIP), ("cuda:3", 20 * MIB, round(191.98 * GIB), 4 * MIB, None)),
        (torch.AcceleratorError(ACCELERATOR), ("cuda", None, None, None, None)),
    ],
)
def test_the_failed_allocation_is_read_from_each_backends_message(
    error: BaseException, expected: tuple[str, int | None, int | None, int | None, int | None]
) -> None:
    """(device, failed size, capacity, free, allocated by PyTorch) as each allocator prints them."""
    assert oom.is_out_of_memory(error)
    failed = oom.failed_allocation(error)
    assert (failed.device, failed.nbytes, failed.capacity, failed.free, failed.allocated) == expected
    assert not failed.exact


def test_the_cpu_allocators_real_failure_gives_the_exact_size() -> None:
    with pytest.raises(RuntimeError) as caught:
        torch.empty(2**60, dtype=torch.uint8)
    assert type(caught.value) is RuntimeError  # not an OutOfMemoryError: recognised by the allocator's words
    assert oom.is_out_of_memory(caught.value)
    failed = oom.failed_allocation(caught.value)
    assert (failed.device, failed.nbytes, failed.exact) == ("cpu", 2**60, True)


@pytest.mark.parametrize(
    "error",
    [RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"), ValueError("out of memory"), None],
)
def test_other_errors_are_not_out_of_memory(error: BaseException | None) -> None:
    assert not oom.is_out_of_memory(error)


# ---------------------------------------------------------------- the planner's slot


def request(**changes: Any) -> F.FitRequest:
    failed = oom.failed_allocation(torch.OutOfMemoryError(CUDA))
    values: dict[str, Any] = {
        "device": "cuda:0", "capacity": failed.capacity, "failed": failed, "held": {"variable": GIB},
        "models": ["model"], "cell": "model.generate(ids, max_new_tokens=32768)", "plan": None, "traceback_bytes": 0,
    }  # fmt: skip
    return F.FitRequest(**(values | changes))


def test_the_run_planners_slot_takes_a_fit_request_and_answers_fixes() -> None:
    """The interface the run planner fills (tests/core/measured/test_oom_fixes.py: its fixes on a real generate()):
    FitRequest in, Fixes out; a request with no generate() call in it gets none."""
    signature = inspect.signature(F.run_planner_fixes)
    assert list(signature.parameters) == ["request"]
    assert signature.parameters["request"].annotation in (F.FitRequest, "FitRequest")
    assert signature.return_annotation in (tuple[F.Fix, ...], "tuple[Fix, ...]")
    assert F.run_planner_fixes(request()) == ()
    assert set(inspect.signature(F.Fix).parameters) == {"change", "code", "peak_bytes", "fits", "frees", "by"}


def test_freeing_the_traceback_is_a_fix_with_the_bytes_it_gives_back() -> None:
    assert F.free_traceback_fix(request()) is None
    fix = F.free_traceback_fix(request(traceback_bytes=3 * MIB))
    assert fix == F.Fix("free what the last error's traceback holds", "nbhw.free(traceback=True)", frees=3 * MIB,
                        by="attribution")  # fmt: skip


# ---------------------------------------------------------------- in a real shell, with a fake device


@pytest.fixture
def shell(fresh_ip: Any) -> Any:
    run(fresh_ip, "import torch\nfrom torch import nn")
    return fresh_ip


@pytest.fixture
def gpu(shell: Any) -> FakeDevice:
    device = FakeDevice(limit=10**9)
    shell.user_ns["gpu"] = device
    run(
        shell,
        "with gpu:\n"
        "    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))\n"
        "    batch = torch.randn(512, 64)\n",
    )
    device.limit = device.allocated + 100_000  # room for less than the first layer's output
    return device


class HalveTheBatch:
    """A stand-in for nbhw's run planner: it answers from what the request carries, with a projected peak."""

    def __init__(self) -> None:
        self.requests: list[F.FitRequest] = []

    def __call__(self, request: F.FitRequest) -> Sequence[F.Fix]:
        self.requests.append(request)
        assert request.failed.nbytes is not None
        peak = sum(request.held.values()) + request.failed.nbytes // 4
        return [F.Fix("batch 512 -> 128", "model(batch[:128])", peak, peak <= (request.capacity or 0))]


def report_of(shell: Any, gpu: FakeDevice, error: BaseException, **kwargs: Any) -> OutOfMemory:
    return out_of_memory_report(shell, error, memory=FakeMemory(gpu), device="cpu", **kwargs)


def test_the_report_names_the_holders_the_failed_size_and_the_planners_fixes(shell: Any, gpu: FakeDevice) -> None:
    error = fails(shell, "with gpu:\n    out = model(batch)")
    assert isinstance(error, torch.OutOfMemoryError)
    planner = HalveTheBatch()
    report = report_of(shell, gpu, error, cell="with gpu:\n    out = model(batch)", planner=planner)
    assert (report.failed.nbytes, report.failed.printed) == (512 * 256 * 4, "512.00 KiB")
    assert report.failed.device == "cuda:0" and report.device == "cpu"
    assert report.failed.allocated == gpu.allocated  # the fake's counter, read back from its message
    model = shell.user_ns["model"]
    params = sum(p.untyped_storage().nbytes() for p in model.parameters())
    assert report.held is not None
    assert sum(g.nbytes for g in report.held.groups if any(h.label == "model" for h in g.holders)) == params
    frames = {h.label for g in report.held.groups for h in g.holders if h.kind == "traceback"}
    assert {"Linear.forward() › input", "Sequential.forward() › input", "Linear.forward() › self"} <= frames
    [asked] = planner.requests
    assert asked.device == "cpu" and asked.models == ["model"] and "model(batch)" in asked.cell
    assert asked.held["variable"] == params + 512 * 64 * 4 and asked.traceback_bytes == report.traceback_bytes
    peak = sum(asked.held.values()) + 512 * 256  # the planner's projection is what the report shows, as it is
    assert report.fixes[0] == F.Fix("batch 512 -> 128", "model(batch[:128])", peak, peak <= gpu.limit)
    text = report.text()
    assert "the failed allocation was 512.00 KiB (524,288 bytes, as printed)" in text
    assert f"batch 512 -> 128: peak {size(peak)}, does not fit (the run planner)  model(batch[:128])" in text


def test_the_traceback_bytes_the_report_names_are_what_freeing_it_gives_back(shell: Any, gpu: FakeDevice) -> None:
    run(shell, "def step(x):\n    h = x[:128] * 2\n    return model(h)\n")
    error = fails(shell, "with gpu:\n    out = step(batch)")
    report = report_of(shell, gpu, error)
    assert report.traceback_bytes == 128 * 64 * 4  # h: held only by the frames; batch is still a variable
    assert report.fixes == (F.free_traceback_fix(report.request),)  # type: ignore[arg-type]
    assert report.fixes_note == F.RUN_PLANNER_PENDING  # the run planner's slot answered nothing: said so
    assert "free what the last error's traceback holds: gives back 32.0 KiB now (attribution)" in report.text()
    del error
    [cpu] = shell_free(shell, traceback=True, memory=FakeMemory(gpu)).devices
    assert cpu.expected == cpu.measured == report.traceback_bytes


def test_a_failing_planner_is_named_and_the_report_still_shows(shell: Any, gpu: FakeDevice) -> None:
    def broken(request: F.FitRequest) -> Sequence[F.Fix]:
        raise KeyError("no such model")

    error = fails(shell, "with gpu:\n    out = model(batch)")
    report = report_of(shell, gpu, error, planner=broken)
    assert report.fixes_note == "the run planner failed: KeyError: 'no such model'"
    assert report.held is not None and report.held.groups


@pytest.fixture
def reported(shell: Any, monkeypatch: pytest.MonkeyPatch) -> list[OutOfMemory]:
    """%load_ext nbhw's own cell hook, with the fake device's counters read where nbhw reads torch's."""
    shown: list[OutOfMemory] = []
    monkeypatch.setattr(nbhw.session, "display", shown.append)
    shell.run_line_magic("load_ext", "nbhw")
    return shown


def test_after_a_cell_runs_out_of_memory_nbhws_cell_hook_shows_the_report(
    shell: Any, reported: list[OutOfMemory], monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = FakeDevice(limit=10**9, words="cpu")  # the CPU allocator's words: the failed device is "cpu" itself
    monkeypatch.setattr(nbhw.session, "device_memory", lambda: FakeMemory(gpu))
    shell.user_ns["gpu"] = gpu
    run(shell, "with gpu:\n    kept = torch.zeros(1000)")
    gpu.limit = gpu.allocated + 1000
    error = fails(shell, "with gpu:\n    big = torch.ones(2000)")
    assert type(error) is RuntimeError
    [report] = reported
    assert (report.failed.device, report.failed.nbytes, report.failed.exact) == ("cpu", 8000, True)
    assert report.held is not None and [(g.label, g.nbytes) for g in report.held.groups] == [("kept", 4000)]
    assert report.held.allocated == 4000 and report.held.unattributed == 0  # the counter: no scan needed
    assert "the failed allocation was 7.8 KiB (8,000 bytes)" in report.text()


def test_nothing_is_walked_while_no_cell_ran_out_of_memory(
    shell: Any, gpu: FakeDevice, reported: list[OutOfMemory], monkeypatch: pytest.MonkeyPatch
) -> None:
    walks: list[int] = []
    original = keeps_alive.Walker.__init__

    def counting(self: keeps_alive.Walker, *args: Any) -> None:
        walks.append(1)
        original(self, *args)

    monkeypatch.setattr(keeps_alive.Walker, "__init__", counting)
    run(shell, "with gpu:\n    small = model(batch[:4])")
    fails(shell, "raise ValueError('not memory')")
    fails(shell, "raise RuntimeError('mat1 and mat2 shapes cannot be multiplied')")
    assert walks == [] and reported == []
    fails(shell, "with gpu:\n    out = model(batch)")
    assert walks == [1] and len(reported) == 1


def test_a_transformers_model_running_out_shows_its_own_frames(shell: Any) -> None:
    gpu = FakeDevice(limit=10**9)
    shell.user_ns["gpu"] = gpu
    run(
        shell,
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,\n"
        "                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)\n"
        "with gpu:\n"
        "    llm = LlamaForCausalLM(cfg).eval()\n"
        "    ids = torch.ones(1, 2048, dtype=torch.long)\n",
    )
    gpu.limit = gpu.allocated + 3 * 2048 * 64 * 4  # a few hidden states, not the attention or MLP intermediates
    error = fails(shell, "with gpu, torch.no_grad():\n    out = llm(ids)")
    report = report_of(shell, gpu, error)
    assert report.held is not None
    frames = {h.label for g in report.held.groups for h in g.holders if h.kind == "traceback"}
    assert any(label.startswith("Llama") for label in frames), frames
    assert report.traceback_bytes > 0
    assert report.request is not None and report.request.models == ["llm"]
