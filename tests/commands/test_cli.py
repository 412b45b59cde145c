"""`python -m nbhw`: same words as %hw, documented JSON, exit 2 on mistakes, cheap imports."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest
import torch

from nbhw.__main__ import main
from nbhw.core.hardware.report import SCHEMA_PATH, accelerate_config_file, report
from tests.support.fakes import FakeGpu, FakeHardware


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "nbhw", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, check=False)


def test_report_json_validates_against_the_documented_schema() -> None:
    proc = run("report", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    jsonschema.validate(data, json.loads(SCHEMA_PATH.read_text()))
    assert len([b for b in data["backends"] if not b["extra"]]) == 11
    # The build as torch itself reports it (a subprocess can't be faked: compare with this torch).
    hip, cuda = torch.version.hip, torch.version.cuda
    build = f"ROCm {hip}" if hip else f"CUDA {cuda}" if cuda else "CPU"
    assert data["packages"]["torch"] == torch.__version__ and data["torch"]["build"] == build


def test_schema_rejects_a_report_missing_a_field() -> None:
    data = report().to_dict()
    del data["backends"][0]["usable"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, json.loads(SCHEMA_PATH.read_text()))


def test_report_text_tells_what_transformers_env_and_accelerate_env_tell() -> None:
    text = run("report").stdout
    for fact in (
        "Platform:",
        "Python:",
        "PyTorch: 2.",
        "transformers",
        "accelerate",
        "huggingface_hub",
        "safetensors",
        "deepspeed",
        "numpy",
        "RAM",
        "Accelerate config:",
        "`accelerate` CLI:",
        "NVIDIA driver:",
    ):
        assert fact in text, fact


def test_accelerate_config_path_follows_accelerates_own_rule(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    code = "from accelerate.commands.config.config_args import default_config_file as f; print(f)"
    theirs = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert str(accelerate_config_file()) == theirs


def test_devices_text_and_json() -> None:
    assert "Who picks what here" in run("devices").stdout
    assert json.loads(run("devices", "--json").stdout)["backends"][0]["key"] == "cpu"


@pytest.mark.parametrize("argv", [["bogus"], ["devices", "--bogus"], ["report", "x"], ["plan", "m", "--quantize", "2"]])
def test_mistakes_exit_2_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert (err.startswith("error: ") and "\n" not in err and "valid" in err) or "choose" in err or "4bit" in err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "devices" in capsys.readouterr().out


def test_import_nbhw_loads_no_heavy_library() -> None:
    code = (
        "import sys, nbhw; nbhw.__version__; heavy = [m for m in ('torch', 'transformers', 'plotly', "
        "'ipywidgets', 'accelerate') if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_load_ext_loads_no_heavy_library() -> None:
    code = (
        "import sys\nfrom IPython.testing.globalipapp import get_ipython\nip = get_ipython()\n"
        "ip.run_line_magic('load_ext', 'nbhw')\nassert 'hw' in ip.magics_manager.magics['line']\n"
        "print([m for m in ('torch', 'transformers', 'plotly', 'ipywidgets', 'accelerate') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_detection_never_imports_transformers_or_accelerate() -> None:
    code = (
        "import sys, nbhw; nbhw.detect(); print([m for m in ('transformers', 'accelerate', 'plotly') "
        "if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_report_asks_cudnn_its_version_without_initialising_cuda(
    fake_hw: FakeHardware, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    import torch

    fake_hw.nvidia(FakeGpu())

    def initialises_cuda() -> int:
        raise AssertionError("torch.backends.cudnn.version() checks every GPU's capability: it initialises CUDA")

    monkeypatch.setattr(torch.backends.cudnn, "version", initialises_cuda)
    monkeypatch.setattr(torch._C, "_cudnn", types.SimpleNamespace(getVersionInt=lambda: 91002), raising=False)
    assert report().cudnn == "91002"
