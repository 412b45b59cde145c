"""nbhw.pin() / %hw pin -> nbhw.plan(pinned=...) round trip in a real IPython shell; a file from another transformers
gets a note; broken and hostile files are one-line errors, with nothing from them executed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import transformers
from IPython.core.error import UsageError

import nbhw
from nbhw.core.errors import UserError
from nbhw.core.plan.pinned import MOST_BYTES, read_pin

ROOT = Path(__file__).resolve().parents[3]


def run(shell: Any, code: str) -> Any:
    result = shell.run_cell(code, store_history=True)
    result.raise_error()
    return result


@pytest.fixture
def pinned(session: Any, tmp_path: Path) -> Path:
    """A pin of the tiny model loaded by nbhw's cell, with sdpa, measured while %hw memory ran."""
    path = tmp_path / "run.json"
    run(session, "%hw memory --interval 0.05 --window 60")
    try:
        run(session, nbhw.plan(attn_implementation="sdpa").code)
    finally:
        run(session, "%hw memory --stop")
    run(session, f"%hw pin {path}")
    return path


def test_pin_writes_what_ran_and_plan_reads_it_back(session: Any, pinned: Path) -> None:
    data = json.loads(pinned.read_text())
    import torch
    import transformers

    assert (
        data["versions"]["torch"] == torch.__version__ and data["versions"]["transformers"] == transformers.__version__
    )
    assert data["model_class"] == "Qwen3ForCausalLM" and data["attention"] == {"": "sdpa"}
    assert data["arguments"]["attn_implementation"] == "sdpa" and data["devices"] == {"cpu": 450112}
    assert data["peaks"] and data["peaks"][0]["device"] == "host" and data["peaks"][0]["bytes"] > 0
    again = nbhw.plan(pinned=str(pinned))
    assert again.model == data["model"] and again.args.attn_implementation == "sdpa"
    assert again.pinned is not None and again.pinned.devices == {"cpu": 450112}
    text = again.text()
    assert f"Pinned run ({pinned})" in text and "this plan puts" not in text  # same weights per device
    assert again.to_dict()["pinned"]["path"] == str(pinned)
    # The plan's arguments win over the pin's where given; the difference is named.
    other = nbhw.plan(pinned=str(pinned), attn_implementation="eager")
    assert "attn_implementation: pinned 'sdpa', this plan 'eager'" in other.text()


def test_a_later_run_is_checked_against_the_pin(session: Any, pinned: Path) -> None:
    later = nbhw.plan(pinned=str(pinned))
    run(session, later.code)
    run(session, "import torch\nmodel = model.to(torch.bfloat16)")
    found = nbhw.loaded()["model"]
    assert found.comparison is not None
    assert "this run's weights take 219.8 KiB less than the pinned one's on cpu" in found.comparison.pinned


def test_a_pin_from_another_transformers_gets_a_note(pinned: Path) -> None:
    data = json.loads(pinned.read_text())
    data["versions"]["transformers"] = "4.57.1"
    pinned.write_text(json.dumps(data))
    text = nbhw.plan(pinned=str(pinned)).text()
    assert f"the pinned run used transformers 4.57.1, this one has {transformers.__version__}" in text


def test_pin_needs_a_model_and_a_folder(session: Any, tmp_path: Path) -> None:
    session.run_cell("model = None")
    with pytest.raises(UsageError, match=r"name the model; loaded: none"):
        session.run_line_magic("hw", f"pin {tmp_path / 'x.json'}")
    with pytest.raises(UsageError, match=r"does not exist"):
        session.run_line_magic("hw", "pin /no/such/folder/x.json")
    run(session, nbhw.plan().code)
    with pytest.raises(UsageError, match=r"no transformers model named 'other'; valid: model"):
        session.run_line_magic("hw", f"pin {tmp_path / 'x.json'} --model other")
    with pytest.raises(UserError, match=r"is not a transformers model"):
        nbhw.pin(object(), str(tmp_path / "x.json"))


# ---------------------------------------------------------------- broken and hostile files


def _good() -> dict[str, Any]:
    return {"format": "nbhw-pin", "format_version": 1, "model": "x", "versions": {}, "devices": {"cpu": 1}}


HOSTILE: dict[str, Any] = {
    "not json": b"{'format': 'nbhw-pin'}",
    "code": b"__import__('os').system('touch {marker}')",
    "pickle": b"\x80\x04\x95cos\nsystem\n(S'touch {marker}'\ntR.",
    "a list": b"[1, 2, 3]",
    "no format": json.dumps({"model": "x"}).encode(),
    "NaN": json.dumps({**_good(), "devices": {"cpu": float("nan")}}).encode(),
    "Infinity": json.dumps(_good()).replace('"cpu": 1', '"cpu": Infinity').encode(),
    "twice a key": b'{"format": "nbhw-pin", "format": "nbhw-pin", "format_version": 1, "model": "x"}',
    "deep": ('{"format": "nbhw-pin", "x": ' + "[" * 100_000 + "]" * 100_000 + "}").encode(),
    "long string": json.dumps({**_good(), "model": "m" * 100_000}).encode(),
    "negative bytes": json.dumps({**_good(), "devices": {"cpu": -5}}).encode(),
    "bool bytes": json.dumps({**_good(), "devices": {"cpu": True}}).encode(),
    "unknown field": json.dumps({**_good(), "__class__": "os.system"}).encode(),
    "newer format": json.dumps({**_good(), "format_version": 99}).encode(),
    "bad peak": json.dumps({**_good(), "peaks": [{"what": "x", "device": "cpu", "bytes": "1e99"}]}).encode(),
    "not utf-8": b"\xff\xfe{}",
    "bad device_map": json.dumps({**_good(), "arguments": {"device_map": "gpu"}}).encode(),
    "unknown argument": json.dumps({**_good(), "arguments": {"eval": "1"}}).encode(),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_broken_or_hostile_pin_is_one_line_and_runs_nothing(kind: str, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    path = tmp_path / "pin.json"
    path.write_bytes(HOSTILE[kind].replace(b"{marker}", str(marker).encode()))
    with pytest.raises(UserError) as caught:
        nbhw.plan(pinned=str(path))
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and len(message) < 400, message
    assert not marker.exists()


def test_files_that_are_not_pins_are_refused_before_reading(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="is not a regular file"):
        read_pin("/dev/zero")  # would never end if read
    with pytest.raises(UserError, match="is not a regular file"):
        read_pin(str(tmp_path))
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MOST_BYTES + 1))
    with pytest.raises(UserError, match="more than a pin ever is"):
        read_pin(str(big))
    with pytest.raises(UserError, match="cannot be read"):
        read_pin(str(tmp_path / "missing.json"))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="is not a regular file"):
        read_pin(str(fifo))  # opening it would block


def test_the_magic_and_the_cli_say_a_bad_pin_in_one_line(ip: Any, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    ip.run_line_magic("load_ext", "nbhw")
    with pytest.raises(UsageError, match=r"pinned file .*the top level is not an object"):
        ip.run_line_magic("hw", f"load --pinned {bad} --emit")
    done = subprocess.run(
        [sys.executable, "-m", "nbhw", "load", "--pinned", str(bad)], check=False, capture_output=True, text=True,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "the top level is not an object" in done.stderr


def test_hw_load_pinned_shows_the_plan_beside_the_pinned_run(session: Any, pinned: Path) -> None:
    from IPython.utils.capture import capture_output

    with capture_output() as shown:
        run(session, f"%hw load --pinned {pinned}")
    text = shown.stdout + "".join(o.data.get("text/plain", "") for o in shown.outputs)
    assert f"Pinned run ({pinned})" in text
