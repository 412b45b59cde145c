"""The GPU suite's own parts, checked on any machine: the skip decision, the ~1B model, the probes, the results
file and table, and the driver's run to "no GPU". (Not marked ``gpu``: these run in the default CPU run.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.gpu import bigmodel, gpuenv, results
from tests.gpu.gpuenv import ROOT, NvmlGpu, why_no_gpu
from tests.support.fakes import GIB, FakeGpu, FakeHardware

H200 = NvmlGpu(0, "NVIDIA H200", "GPU-0", "00000000:18:00.0", 141 * GIB, (9, 0))


def test_skip_reason_names_every_missing_piece() -> None:
    cpu_torch = "this torch (2.13.0+cpu) is a CPU-only build (torch.cuda is not compiled)"
    no_driver = "NVML could not start (NVMLError_LibraryNotFound: NVML Shared Library Not Found)"
    both = gpuenv.reasons_no_gpu(cpu_torch, [], no_driver, None)
    assert both == f"no NVIDIA GPU to verify against: {cpu_torch}; {no_driver}"
    assert gpuenv.reasons_no_gpu(None, [], None, None).endswith(": NVML sees no GPU")
    assert gpuenv.reasons_no_gpu(None, [H200], None, " ").endswith(
        "CUDA_VISIBLE_DEVICES is empty, which hides every GPU"
    )
    assert gpuenv.reasons_no_gpu(None, [H200], None, "0") == ""
    assert gpuenv.reasons_no_gpu(None, [H200], None, None) == ""


def test_a_cuda_machine_is_recognised_from_nvml_without_a_cuda_context(
    fake_hw: FakeHardware, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    fake = fake_hw.nvidia(FakeGpu(name="NVIDIA H200", total=141 * GIB, cc=(9, 0)))
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    gpus, error = gpuenv.nvml_gpus()
    assert error is None
    assert [(g.name, g.memory_total, g.compute_capability) for g in gpus] == [("NVIDIA H200", 141 * GIB, (9, 0))]
    assert gpus[0].uuid.startswith("GPU-") and gpus[0].pci_bus_id
    assert why_no_gpu.__wrapped__() == ""
    fake_hw.env(CUDA_VISIBLE_DEVICES="")
    assert "CUDA_VISIBLE_DEVICES is empty" in why_no_gpu.__wrapped__()
    assert fake.calls.count("init") == fake.calls.count("shutdown") == 3
    assert not torch.cuda.is_initialized()


def test_this_machine_is_told_apart_from_a_gpu_machine() -> None:
    import torch

    marks = gpuenv.gpu_only()
    skip = marks[1]
    assert marks[0].name == "gpu" and skip.args == (bool(why_no_gpu()),)
    if torch.version.cuda is None:
        assert why_no_gpu().startswith("no NVIDIA GPU to verify against: this torch")
        assert skip.kwargs["reason"] == why_no_gpu()


def test_billion_config_has_about_a_billion_parameters_on_the_meta_device(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    import nbhw

    config = bigmodel.billion_config(300, 1)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    count = sum(p.numel() for p in model.parameters())
    assert count == bigmodel.parameter_count(config)
    assert 0.95e9 <= count <= 1.1e9
    # The estimate the GPU test compares torch's allocation with, from the config alone.
    config.save_pretrained(tmp_path)
    estimate = nbhw.plan(str(tmp_path)).estimate
    assert estimate is not None and estimate.dtype == "bfloat16"
    assert estimate.parameters == count and estimate.parameter_bytes == 2 * count


@pytest.mark.slow
def test_a_one_layer_copy_loads_through_the_load_probe_on_this_machine(tmp_path: Path) -> None:
    path = bigmodel.build(tmp_path / "one-layer", num_hidden_layers=1, hidden_size=256, intermediate_size=512)
    from transformers import AutoConfig

    expected = bigmodel.parameter_count(AutoConfig.from_pretrained(path))
    facts = gpuenv.run_probe("load", str(path))
    assert facts["problems"] == [] and facts["parameters"] == expected == facts["estimate"]["parameters"]
    assert facts["dtypes"] == ["torch.bfloat16"] and facts["estimate"]["dtype"] == "bfloat16"
    assert facts["loaded_bytes"] == facts["estimate"]["total_bytes"]
    assert facts["code"].startswith("from transformers import") and not facts["context_after_planning"]["initialized"]
    if facts["allocated_after"] is None:  # no GPU: the model is where the plan put it
        assert facts["devices"] == [f"{facts['placement']['device_map']['']}"] == ["cpu"]


def test_probes_run_here_and_see_what_torch_sees() -> None:
    import torch

    facts = gpuenv.run_probe("context", "detect")
    assert facts["what"] == "detect" and not facts["after"]["initialized"]
    assert facts["before"]["torch_imported"] is False  # nbhw imported torch only when asked to detect
    if torch.version.cuda is None:
        assert facts["control"] is None and "cuda" not in facts["said"]["usable"]
        seen = gpuenv.run_probe("visible", env={"CUDA_VISIBLE_DEVICES": "0"})
        assert seen["torch"] == [] and not seen["nbhw_before"]["usable"] and seen["env"]["CUDA_VISIBLE_DEVICES"] == "0"


def test_the_preflight_probe_runs_here() -> None:
    import torch

    facts = gpuenv.run_probe("preflight")
    assert not facts["context"]["initialized"] and not facts["bad_fork_child_after_nbhw"]
    assert facts["predicted"] == {} == facts["real"] or torch.version.cuda is not None
    if torch.version.cuda is None:  # a CPU build: nothing to read, and get_arch_list() has no trap to arm
        assert facts["arch_from_binary"] == [] == facts["get_arch_list"]
        assert not facts["bad_fork_child_after_get_arch_list"]


SAMPLE = """
import pytest

def test_passes(record_property):
    record_property("allocated_gib", 2.0)

def test_fails():
    assert 1 + 1 == 3, "arithmetic broke"

@pytest.mark.skip(reason="needs two GPUs")
def test_skipped():
    pass

@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")

def test_errors(broken):
    pass
"""

HOOK = """
from tests.gpu import results

def pytest_runtest_logreport(report):
    results.record(report)
"""


def test_results_round_trip_through_a_real_pytest_run(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(textwrap.dedent(SAMPLE))
    (tmp_path / "conftest.py").write_text(HOOK)
    out = tmp_path / "tests.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), results.RESULTS_ENV: str(out)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_sample.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout
    found = {r.name: r for r in results.read(out)}
    assert {k: r.outcome for k, r in found.items()} == {
        "test_sample.py::test_passes": "passed",
        "test_sample.py::test_fails": "failed",
        "test_sample.py::test_skipped": "skipped",
        "test_sample.py::test_errors": "error",
    }
    assert found["test_sample.py::test_passes"].figures == {"allocated_gib": 2.0}
    assert "arithmetic broke" in found["test_sample.py::test_fails"].message
    assert found["test_sample.py::test_skipped"].message == "needs two GPUs"
    assert "fixture broke" in found["test_sample.py::test_errors"].message
    lines = results.table(list(found.values())).splitlines()
    assert lines[0].split() == ["result", "s", "test", "figures", "/", "why"]
    assert [line.split()[0] for line in lines[1:4]] == ["ok", "FAILED", "ERROR"]
    assert "allocated_gib=2.0" in lines[1] and "arithmetic broke" in lines[2]
    assert lines[4] == "skipped (1): needs two GPUs"
    assert lines[5] == "1 passed, 1 failed, 1 error, 1 skipped"


def test_table_keeps_long_reasons_to_one_line() -> None:
    long = results.TestResult("tests/gpu/test_x.py::test_y", "failed", 1.5, "E " + "word " * 100)
    line = results.table([long]).splitlines()[1]
    assert line.endswith("…") and len(line) < 200 and line.startswith("FAILED  1.5  test_x.py::test_y")


@pytest.mark.slow
def test_driver_runs_to_no_gpu_and_leaves_its_results(tmp_path: Path) -> None:
    if not why_no_gpu():
        pytest.skip("an NVIDIA GPU is here: the driver runs the suite for real (tests/gpu/run_on_device.sh)")
    env = {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "PYTHON": sys.executable,
        "NBHW_GPU_WHEELS": str(tmp_path / "no-wheels"),  # nothing to install: this machine has every package
    }
    proc = subprocess.run(
        ["bash", str(ROOT / "tests/gpu/run_on_device.sh")], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("nbhw GPU suite: Python") and lines[2] == f"no GPU: {why_no_gpu()}"
    assert lines[-1].startswith("no GPU: every GPU test skipped, nothing was checked")
    data: dict[str, Any] = json.loads((tmp_path / "out/results.json").read_text())
    assert data["pytest"]["exit_code"] == 0 and not data["pytest"]["cut_short"]
    assert data["machine"]["no_gpu"] == why_no_gpu() and data["machine"]["missing_modules"] == []
    tests = data["tests"]
    assert len(tests) >= 20 and {t["outcome"] for t in tests} == {"skipped"}
    assert {t["message"] for t in tests} == {why_no_gpu()}
    assert data["summary"]["skipped"] == len(tests) and data["summary"]["passed"] == 0
    names = {t["nodeid"].split("::")[0] for t in tests}
    assert names == {
        f"tests/gpu/test_{m}.py"
        for m in ("attention", "catalog_memory", "detect", "doctor", "holders", "loaded", "memory",
                  "offline_kernels", "plan", "run", "serve", "train", "visible")
    }  # fmt: skip
    assert (tmp_path / "out/junit.xml").read_text().count("<skipped") == len(tests)


def test_driver_verdict_and_header_say_what_happened() -> None:
    from tests.gpu import driver

    gpu = {"name": "NVIDIA H200", "memory_total": 141 * GIB, "compute_capability": (9, 0)}
    on_gpu = {"no_gpu": None, "gpus": [gpu]}
    ok = [results.TestResult("tests/gpu/test_a.py::test_a", "passed", 1.0)]
    skipped = [results.TestResult("tests/gpu/test_a.py::test_a", "skipped", 0.0, "needs two GPUs")]
    failed = [*ok, results.TestResult("tests/gpu/test_b.py::test_b", "failed", 1.0, "boom")]
    assert driver.verdict(on_gpu, 0, False, ok) == ("PASSED on NVIDIA H200: every GPU check held", 0)
    assert driver.verdict(on_gpu, 1, False, failed)[1] == 1
    assert driver.verdict(on_gpu, 0, False, skipped)[0].startswith("NOTHING CHECKED")
    assert driver.verdict(on_gpu, None, True, ok)[0].startswith("CUT SHORT")
    assert driver.verdict({"no_gpu": "no NVIDIA GPU", "gpus": []}, 0, False, skipped) == (
        "no GPU: every GPU test skipped, nothing was checked",
        0,
    )
    facts = {
        "python": "3.12.3",
        "packages": {"torch": "2.11.0", "transformers": "5.24.0", "accelerate": "1.15.0"},
        "nbhw": "/repo/nbhw",
        "gpus": [gpu],
        "missing_modules": ["IPython"],
    }
    lines = driver.header(facts).splitlines()
    assert lines[1] == "GPUs (NVML): NVIDIA H200 (141 GiB, cc 9.0)"
    assert lines[2].startswith("MISSING modules: IPython")
