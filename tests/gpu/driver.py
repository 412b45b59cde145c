"""Run the GPU suite once and leave its results: ``python -m tests.gpu.driver --out DIR``.

Writes DIR/results.json (machine, versions, every test's outcome and figures), DIR/junit.xml and DIR/pytest.log,
and prints a short table. Without an NVIDIA GPU it says so and exits 0 (every GPU test skips). Exit 1 when a test
failed, errored or the run was cut short. ``tests/gpu/run_on_device.sh`` calls it on a lent GPU machine.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tests.gpu import results
from tests.gpu.gpuenv import GIB, ROOT, nvml_gpus, probe_env, why_no_gpu

PACKAGES = (
    "torch",
    "transformers",
    "accelerate",
    "nvidia-ml-py",
    "tokenizers",
    "safetensors",
    "huggingface_hub",
    "pytest",
    "pytest-timeout",
    "ipython",
    "traitlets",
    "ipywidgets",
    "plotly",
    "anywidget",
    "numpy",
    "psutil",
    "packaging",
)
# What the suite imports besides the standard library; a missing one is named before the run starts.
MODULES = (
    "torch",
    "transformers",
    "accelerate",
    "pynvml",
    "tokenizers",
    "safetensors",
    "huggingface_hub",
    "pytest_timeout",
    "IPython",
    "traitlets",
    "ipywidgets",
    "plotly",
    "anywidget",
    "numpy",
    "psutil",
    "yaml",
    "packaging",
)


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """Where the suite runs: Python, packages, GPUs by NVML, and why there is no GPU (no CUDA context)."""
    import nbhw

    gpus, nvml_error = nvml_gpus()
    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "nbhw": str(Path(nbhw.__file__).parent),
        "packages": {name: _version(name) for name in PACKAGES},
        "missing_modules": [m for m in MODULES if importlib.util.find_spec(m) is None],
        "gpus": [asdict(g) for g in gpus],
        "nvml_error": nvml_error,
        "no_gpu": why_no_gpu() or None,
    }


def header(facts: dict[str, Any]) -> str:
    """Two or three lines naming the machine."""
    p = facts["packages"]
    gpus = ", ".join(
        f"{g['name']} ({g['memory_total'] / GIB:.0f} GiB, cc {'.'.join(map(str, g['compute_capability']))})"
        for g in facts["gpus"]
    )
    lines = [
        f"nbhw GPU suite: Python {facts['python']}, torch {p['torch']}, transformers {p['transformers']}, "
        f"accelerate {p['accelerate']}; nbhw from {facts['nbhw']}",
        f"GPUs (NVML): {gpus or 'none'}",
    ]
    if facts["missing_modules"]:
        lines.append(
            f"MISSING modules: {', '.join(facts['missing_modules'])} — carry their wheels (tests/gpu/fetch_wheels.sh)"
        )
    return "\n".join(lines)


def pytest_command(out: Path, extra: list[str]) -> list[str]:
    """The pytest run: the gpu tests only, JUnit XML into ``out``, no cache written into the tree."""
    return [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "tests/gpu",
        "-p",
        "no:cacheprovider",
        "-rfEs",
        f"--junitxml={out / 'junit.xml'}",
        "-o",
        "junit_family=xunit2",
        *extra,
    ]


def run_pytest(command: list[str], out: Path, timeout: float) -> tuple[int | None, bool, float]:
    """Run pytest (its output into out/pytest.log); (exit code, cut short, seconds)."""
    env = probe_env({results.RESULTS_ENV: str(out / "tests.jsonl"), "PYTHONUNBUFFERED": "1"})
    started = time.monotonic()
    with (out / "pytest.log").open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code: int | None = proc.wait(timeout=timeout)
            cut = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # pytest and the probes it started, not just pytest
            proc.wait()
            code, cut = None, True
    return code, cut, round(time.monotonic() - started, 1)


def verdict(facts: dict[str, Any], code: int | None, cut: bool, found: list[results.TestResult]) -> tuple[str, int]:
    """The last line printed, and the driver's exit code."""
    tally = results.counts(found)
    if cut:
        return "CUT SHORT: the run passed its time limit; the results hold the tests that finished", 1
    if tally["failed"] or tally["error"] or code not in (0, 5):
        return f"FAILED: pytest exit {code}; see pytest.log and results.json", 1
    if facts["no_gpu"]:
        return "no GPU: every GPU test skipped, nothing was checked", 0
    if not tally["passed"]:
        return "NOTHING CHECKED: a GPU is here but no GPU test passed (all skipped or deselected)", 1
    return f"PASSED on {facts['gpus'][0]['name']}: every GPU check held", 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.gpu.driver", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where the results go (default: $OUT, else a new temporary folder)")
    parser.add_argument("--timeout", type=float, default=480.0, help="seconds before the pytest run is cut short")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    out = Path(args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="nbhw-gpu-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "tests.jsonl").unlink(missing_ok=True)
    facts = machine()
    print(header(facts), flush=True)
    if facts["no_gpu"]:
        print(f"no GPU: {facts['no_gpu']}", flush=True)
    command = pytest_command(out, args.pytest_args)
    code, cut, seconds = run_pytest(command, out, args.timeout)
    found = results.read(out / "tests.jsonl")
    line, status = verdict(facts, code, cut, found)
    data = {
        "machine": facts,
        "pytest": {"command": command[1:], "exit_code": code, "cut_short": cut, "seconds": seconds},
        "summary": {**results.counts(found), "verdict": line},
        "tests": [asdict(r) for r in found],
    }
    (out / "results.json").write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    print(results.table(found))
    print(f"{line} ({seconds:g} s; results in {out})")
    return status


if __name__ == "__main__":
    sys.exit(main())
