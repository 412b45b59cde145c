"""Shared fixtures: fake hardware at the boundary, a real IPython shell, and thread hygiene."""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.fakes import FakeHardware

pytest_plugins = ["tests.support.schedule"]

_OWN_HOME = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-bf16", choices=("real", "with", "without"), default="real",
        help="run as on a CPU with or without native bf16 (AVX512-BF16 / AMX), faked at nbhw's CPU-flags probe in the "
        "test processes (child processes and kernels see the real CPU); default: this machine's",
    )  # fmt: skip


@pytest.fixture(autouse=True, scope="session")
def cpu_bf16(request: pytest.FixtureRequest) -> Iterator[str]:
    """``--cpu-bf16``: this CPU's bf16 flags as the run asks (the real ones by default)."""
    wanted = request.config.getoption("--cpu-bf16")
    if wanted == "real":
        yield wanted
        return
    from nbhw.core.hardware import probes

    real = probes._cpu_flags
    bf16 = {"avx512_bf16", "amx_bf16"}
    probes._cpu_flags = (lambda: real() | bf16) if wanted == "with" else (lambda: real() - bf16)  # type: ignore[assignment]
    try:
        yield wanted
    finally:
        probes._cpu_flags = real  # type: ignore[assignment]


def pytest_configure(config: pytest.Config) -> None:
    """Keep nbhw's files (the tiny model) out of the user's home: one temporary NBHW_HOME per run.

    Under pytest-xdist each worker makes its own (the controller's, inherited, would be shared by workers that build
    the tiny model at the same time)."""
    _share_the_cores()
    # Dry runs kept on disk would carry one test's patched boundary into another's plan: the suite keeps none
    # (tests/core/plan/test_run_store.py turns it on for itself).
    os.environ["NBHW_KEEP_DRY_RUNS"] = "0"
    made = os.environ.get("NBHW_TEST_HOME_MADE")
    if os.environ.get("PYTEST_XDIST_WORKER") and made and os.environ.get("NBHW_HOME") == made:
        del os.environ["NBHW_HOME"]
    if "NBHW_HOME" not in os.environ:
        os.environ["NBHW_HOME"] = os.environ["NBHW_TEST_HOME_MADE"] = tempfile.mkdtemp(prefix="nbhw-test-home-")
        config.stash[_OWN_HOME] = os.environ["NBHW_HOME"]


def _share_the_cores() -> None:
    """Under pytest-xdist, each worker's share of the cores for torch's threads, here and in the kernels, shells
    and ranks its tests start (they inherit OMP_NUM_THREADS). Otherwise every worker runs torch on all cores: on 2
    cores a tiny model's generate took 70 s on 2 threads beside a busy worker, 6 s on 1. A value you set is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    threads = max(1, (os.cpu_count() or 1) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:  # already imported: its pool was sized before the variable was set
        sys.modules["torch"].set_num_threads(threads)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the temporary NBHW_HOME this run made."""
    home = config.stash.get(_OWN_HOME, None)
    if home:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def fake_hw(monkeypatch: pytest.MonkeyPatch) -> FakeHardware:
    """Fake hardware for one test (see tests/support/fakes.py); the real CPU machine is still there underneath."""
    for name in (
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "ACCELERATE_TORCH_DEVICE",
        "LOCAL_RANK",
        "WORLD_SIZE",
    ):
        monkeypatch.delenv(name, raising=False)
    return FakeHardware(monkeypatch)


@pytest.fixture
def ip() -> Iterator[object]:
    """The real IPython shell (a process-wide singleton), with nbhw unloaded before and after."""
    from IPython.testing.globalipapp import get_ipython

    shell = get_ipython()
    shell.run_line_magic("unload_ext", "nbhw") if "nbhw" in shell.extension_manager.loaded else None
    yield shell
    if "nbhw" in shell.extension_manager.loaded:
        shell.run_line_magic("unload_ext", "nbhw")


def _forget_the_session(shell: object) -> None:
    shell.reset(new_session=False)  # type: ignore[attr-defined]
    shell.last_execution_result = None  # type: ignore[attr-defined]
    shell.InteractiveTB.tb = None  # type: ignore[attr-defined]
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)


@pytest.fixture
def fresh_ip(ip: object) -> Iterator[object]:
    """The real IPython shell with an empty session: no variables, output history or last error, before and after."""
    _forget_the_session(ip)
    yield ip
    _forget_the_session(ip)
    gc.collect()


@pytest.fixture
def session(ip: Any) -> Iterator[Any]:
    """The shell with nbhw loaded and no models or origins from an earlier test (nor left for a later one)."""
    from nbhw.core.measured import origins

    ip.run_line_magic("load_ext", "nbhw")
    origins.forget()
    yield ip
    ip.run_cell("model = tokenizer = inputs = outputs = None")
    origins.forget()


@pytest.fixture(autouse=True)
def no_nbhw_threads_left() -> Iterator[None]:
    """Every test must leave no nbhw thread running."""
    yield
    left = [t.name for t in threading.enumerate() if t.name.startswith("nbhw") and t.is_alive()]
    assert not left, f"nbhw threads left running: {left}"


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """torch on one thread for a module (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``): CPU flash
    attention keeps per-thread scratch buffers inside the kernel that no tensor-level tracker sees (the plan says so);
    with one thread they stay small next to tiny models, as they are next to real ones."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer Llama with hidden 256 (1.8M parameters) in bfloat16, saved locally: wide enough for every
    quantization format's blocks and groups (bitsandbytes 64, quanto 128)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    return str(folder)
