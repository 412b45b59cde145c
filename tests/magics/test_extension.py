"""The IPython extension contract in a real shell: load, already loaded, reload, unload, help, usage errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from IPython.core.error import UsageError


def test_load_registers_hw_and_unload_removes_it(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert "hw" not in ip.magics_manager.magics["line"]
    assert ip.run_line_magic("load_ext", "nbhw") is None
    assert "hw" in ip.magics_manager.magics["line"]
    capsys.readouterr()
    ip.run_line_magic("load_ext", "nbhw")
    assert "The nbhw extension is already loaded" in capsys.readouterr().out
    ip.run_line_magic("unload_ext", "nbhw")
    assert "hw" not in ip.magics_manager.magics["line"]
    assert not [c for c in ip.configurables if type(c).__name__ == "HwMagics"]


def test_reload_leaves_exactly_one_magic_and_one_configurable(ip: Any) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    ip.run_line_magic("reload_ext", "nbhw")
    ip.run_line_magic("reload_ext", "nbhw")
    assert "hw" in ip.magics_manager.magics["line"]
    assert len([c for c in ip.configurables if type(c).__name__ == "HwMagics"]) == 1


def test_hw_devices_prints_the_eleven_rows_in_a_terminal_shell(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    ip.run_line_magic("hw", "devices")
    out = capsys.readouterr().out
    for label in (
        "cpu",
        "cuda (NVIDIA)",
        "cuda (AMD ROCm)",
        "neuron",
        "tpu",
        "xpu",
        "mps",
        "hpu",
        "npu",
        "mlu",
        "musa",
    ):
        assert f"\n  {label} " in out, label
    assert "Who picks what here" in out and "TrainingArguments(...).device" in out


def test_hw_devices_json_is_the_hardware_dict(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    ip.run_line_magic("hw", "devices --json")
    data = json.loads(capsys.readouterr().out)
    assert [b["key"] for b in data["backends"]][:2] == ["cpu", "cuda"]
    assert data["backends"][0]["usable"] is True


def test_hw_report_renders_text_and_json(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    ip.run_line_magic("hw", "report")
    assert "environment report" in capsys.readouterr().out
    ip.run_line_magic("hw", "report --json")
    assert json.loads(capsys.readouterr().out)["schema_version"] == 1


def test_help_is_the_docstring_of_every_subcommand(ip: Any) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    doc = ip.find_line_magic("hw").__doc__
    for words in (
        "%hw devices",
        "%hw memory",
        "--interval",
        "%hw attention",
        "%hw load",
        "--max-memory",
        "--emit",
        "%hw report",
        "--json",
    ):
        assert words in doc, words


@pytest.mark.parametrize(
    ("line", "names"),
    [
        (
            "bogus",
            "devices, memory, attention, load, serve, quantization, targets, train, fit, report, loaded, pin, doctor",
        ),
        ("devices --bogus", "--json"),
        ("devices extra words", "--json"),
        ("memory --interval x", "number of seconds"),
        ("memory --interval -2", "positive"),
        ("memory --window 0", "positive"),
        ("load m --quantize 3bit", "4bit, 8bit"),
        ("report 'unbalanced", "cannot split"),
    ],
)
def test_mistakes_raise_one_line_usage_errors_naming_valid_values(ip: Any, line: str, names: str) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    with pytest.raises(UsageError) as err:
        ip.run_line_magic("hw", line)
    message = str(err.value)
    assert "\n" not in message and names in message


def test_usage_error_in_a_cell_shows_no_traceback(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    result = ip.run_cell("%hw bogus")
    captured = capsys.readouterr()
    assert isinstance(result.error_in_exec, UsageError)
    assert "Traceback" not in captured.out + captured.err
    assert "UsageError: %hw: unknown subcommand 'bogus'" in captured.err


def test_config_sets_the_memory_defaults(ip: Any) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    ip.run_line_magic("config", "HwMagics.interval = 2.0")
    magics = next(c for c in ip.configurables if type(c).__name__ == "HwMagics")
    assert magics.interval == 2.0
