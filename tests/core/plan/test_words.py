"""`%hw load` in the real IPython shell and `python -m nbhw plan`: same words, same plan, exit codes."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError

import nbhw
from nbhw.__main__ import main
from nbhw.core.hf.tiny_model import tiny_model_path
from tests.support.pins import skip_unless_pinned


def test_emit_sets_the_next_input_to_exactly_the_plans_code(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    ip.rl_next_input = None
    ip.run_line_magic("hw", "load --dtype bfloat16 --attn eager --emit")
    assert ip.rl_next_input == nbhw.plan(dtype="bfloat16", attn_implementation="eager").code
    shown = capsys.readouterr().out
    assert "Dry run: transformers accepts this plan here" in shown and "Estimate" in shown and "Placement" in shown
    assert "from_pretrained(" not in shown  # the code went into the next cell, not the output


def test_emit_keeps_an_awkward_path_and_every_option(ip: Any, tmp_path: Path) -> None:
    folder = tmp_path / "my 'tiny' model"
    shutil.copytree(tiny_model_path(), folder)
    ip.run_line_magic("load_ext", "nbhw")
    line = (
        f'load {shlex.quote(str(folder))} --device-map \'{{"": "cpu"}}\' --dtype float16 --attn sdpa --kernels '
        "--quantize 8bit --max-memory 0=70GiB cpu=200GiB --offline --emit"
    )
    ip.run_line_magic("hw", line)
    expected = nbhw.plan(
        str(folder),
        device_map={"": "cpu"},
        dtype="float16",
        attn_implementation="sdpa",
        use_kernels=True,
        quantization="8bit",
        max_memory={0: "70GiB", "cpu": "200GiB"},
        offline=True,
    )
    assert ip.rl_next_input == expected.code and str(folder) in expected.code


def test_without_emit_the_report_shows_the_code_and_no_cell_is_made(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    ip.rl_next_input = None
    ip.run_line_magic("hw", "load --device-map sequential")
    assert ip.rl_next_input is None
    out = capsys.readouterr().out
    assert 'device_map="sequential"' in out and "Placement: fits on one device (cpu)" in out


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("load --max-memory 0=80GB!", "70GiB"),
        ("load --max-memory cuda:0=1GiB", "cpu"),
        ("load --device-map bogus", "balanced_low_0"),
        ("load --dtype int4", "bfloat16"),
        ("load --quantize 3bit", "4bit"),
        ("load --attn nope", "sdpa"),
        ("load ./no/such/folder --emit", "no such folder"),
        ("load --budget 0=24GiB", "give max_memory with it"),
        ("load --max-memory 0=13GiB --budget 1=24GiB", "budget names device 1"),
        ("load --max-memory 0=13GiB --budget 0=12GiB", "valid: at least 13GiB"),
        ("load --max-memory 0=13GiB --budget 0=24", "budget size '24' is not valid"),
    ],
)
def test_mistakes_are_one_line_usage_errors(ip: Any, line: str, words: str) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    ip.rl_next_input = None
    with pytest.raises(UsageError) as err:
        ip.run_line_magic("hw", line)
    assert "\n" not in str(err.value) and words in str(err.value), str(err.value)
    assert ip.rl_next_input is None


def test_cli_plan_prints_code_estimate_placement_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    for part in ("Code", "from_pretrained(", "Dry run: transformers accepts", "Estimate", "KV cache", "Placement: "):
        assert part in out, part


def test_cli_plan_exits_1_when_the_dry_run_finds_problems(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--device-map", "cuda:1", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["problems"] and "cuda:1" in data["problems"][0]
    assert data["code"] == nbhw.plan(device_map="cuda:1").code
    assert data["estimate"]["parameters"] == nbhw.plan().estimate.parameters  # type: ignore[union-attr]


def test_cli_plan_exits_2_on_a_mistake_in_a_real_process() -> None:
    argv = [sys.executable, "-m", "nbhw", "plan", "--max-memory", "0=80GB!"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1 and "70GiB" in proc.stderr


def test_the_printed_load_example_is_what_nbhw_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    from benchmarks.bench_plan import CONFIG

    skip_unless_pinned("The reference's load example", "transformers", "kernels")  # e.g. Hub kernels' default
    page = (Path(__file__).resolve().parents[3] / "docs" / "reference" / "examples.md").read_text()
    m = re.search(r"^\$ python -m nbhw load (\./llama-3-70b .*?)\n(.*?)\n```", page, re.M | re.S)
    assert m, "the reference's load plan example"
    (tmp_path / "llama-3-70b").mkdir()
    (tmp_path / "llama-3-70b" / "config.json").write_text(json.dumps(CONFIG))
    monkeypatch.chdir(tmp_path)
    printed = subprocess.run(
        [sys.executable, "-m", "nbhw", "load", *shlex.split(m.group(1))], capture_output=True, text=True, check=False
    ).stdout

    def without_dry_run(text: str) -> str:  # the dry run depends on this machine's GPUs
        return re.sub(r"^Dry run.*?\n\n", "", text, flags=re.M | re.S)

    assert without_dry_run(printed).strip() == without_dry_run(m.group(2)).strip()
