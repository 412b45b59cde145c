"""The GPU suite's fixtures, and its results written test by test when $NBHW_GPU_RESULTS names a file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gpu import results
from tests.gpu.gpuenv import NvmlGpu, nvml_gpus, why_no_gpu


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Append each test's outcome and recorded figures to the results file as soon as it is known."""
    results.record(report)


@pytest.fixture(scope="session")
def gpu0() -> NvmlGpu:
    """GPU 0 as NVML reports it (read without a CUDA context)."""
    assert not why_no_gpu(), why_no_gpu()
    gpus, error = nvml_gpus()
    assert error is None and gpus, error
    return gpus[0]


@pytest.fixture(scope="session")
def billion_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A ~1B-parameter Qwen3 with random bfloat16 weights and a tokenizer, saved locally for this run."""
    import shutil

    from tests.gpu import bigmodel

    path = tmp_path_factory.mktemp("billion") / "qwen3-1b-random"
    bigmodel.build(path)
    yield path
    shutil.rmtree(path, ignore_errors=True)
