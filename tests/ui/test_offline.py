"""Offline: with HF_HUB_OFFLINE=1 and no network nothing in nbhw tries to connect or waits; a Hub id that is not in
the cache gets "config not available offline" and still gets its code. Online with the network down, asking the Hub
fails fast and the code is still there.

Sockets are blocked in this process: every connect and every name lookup is recorded and refused.
"""

from __future__ import annotations

import ast
import errno
import json
import socket
import time
from typing import Any

import pytest
from IPython.core.error import UsageError

import nbhw
from nbhw.__main__ import main
from nbhw.core.hf import model_config
from nbhw.core.plan.load_form import Form
from nbhw.ui.attention import advice_html
from nbhw.ui.devices import devices_html
from nbhw.ui.load import parts
from nbhw.ui.worker import last

HUB_ID = "nbhw-test/not-in-any-cache-7b"


@pytest.fixture
def tried(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Refuse the network: each attempt is recorded and gets the error a machine without a route gets."""
    attempts: list[str] = []

    def connect(self: socket.socket, address: Any, *args: Any) -> Any:
        attempts.append(f"connect {address!r}")
        raise OSError(errno.ENETUNREACH, "Network is unreachable (blocked by the test)")

    def lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        attempts.append(f"getaddrinfo {host!r}")
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known (blocked by the test)")

    def create_connection(address: Any, *args: Any, **kwargs: Any) -> Any:
        attempts.append(f"create_connection {address!r}")
        raise OSError(errno.ENETUNREACH, "Network is unreachable (blocked by the test)")

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect)
    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    return attempts


@pytest.fixture
def hub_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def hub_online(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # read by huggingface_hub when it was imported
    monkeypatch.setattr(model_config, "_unreachable", {})  # no earlier test's "the Hub did not answer"


def valid_code_for(code: str, model: str) -> None:
    ast.parse(code)
    assert f'model_id = "{model}"' in code and ".from_pretrained(model_id" in code


def test_with_hf_hub_offline_nothing_connects_and_a_hub_id_still_gets_its_code(
    hub_offline: None, tried: list[str], ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    assert "Who picks what here" in nbhw.detect().text()
    assert json.loads(nbhw.report().json())["schema_version"] == 1
    assert "nbhw-backends" in devices_html()
    with pytest.raises(nbhw.UserError, match=f"config not available offline: {HUB_ID} is not in the local HF cache"):
        nbhw.attention(HUB_ID)
    assert "config not available offline" in advice_html(HUB_ID, "", "", offline=False).html

    plan = nbhw.plan(HUB_ID, dtype="bfloat16")
    valid_code_for(plan.code, HUB_ID)
    assert plan.check() == [f"config not available offline: {HUB_ID} is not in the local HF cache"]
    assert "config not available offline" in plan.text() and plan.to_dict()["code"] == plan.code

    preview = last(parts(Form(HUB_ID, dtype="bfloat16"))).preview  # the panel's Load tab
    valid_code_for(preview.code, HUB_ID)
    assert preview.problems == plan.check()

    assert main(["plan", HUB_ID]) == 1  # dry-run problems, and the code
    out = capsys.readouterr().out
    assert f'model_id = "{HUB_ID}"' in out and "config not available offline" in out
    assert main(["attention", HUB_ID]) == 2
    assert "config not available offline" in capsys.readouterr().err

    ip.run_line_magic("load_ext", "nbhw")
    shown: list[str] = []
    ip.set_next_input, saved = (lambda text, replace=False: shown.append(text)), ip.set_next_input
    try:
        ip.run_line_magic("hw", f"load {HUB_ID} --emit")
    finally:
        ip.set_next_input = saved
    [code] = shown
    valid_code_for(code, HUB_ID)
    with pytest.raises(UsageError, match="config not available offline"):
        ip.run_line_magic("hw", f"attention {HUB_ID}")
    assert tried == []
    assert time.monotonic() - started < 60


def test_offline_flags_never_connect_even_when_the_hub_is_allowed(hub_online: None, tried: list[str]) -> None:
    plan = nbhw.plan(HUB_ID, offline=True)
    valid_code_for(plan.code, HUB_ID)
    assert plan.check() == [f"config not available offline: {HUB_ID} is not in the local HF cache"]
    with pytest.raises(nbhw.UserError, match="config not available offline"):
        nbhw.attention(HUB_ID, offline=True)
    preview = last(parts(Form(HUB_ID, dtype="float32", offline=True))).preview
    valid_code_for(preview.code, HUB_ID)
    assert "Who picks what here" in nbhw.detect().text() and nbhw.report().to_dict()["packages"]
    assert tried == []


def test_online_with_the_network_down_the_hub_fails_fast_and_the_code_is_still_there(
    hub_online: None, tried: list[str]
) -> None:
    started = time.monotonic()
    plan = nbhw.plan(HUB_ID)
    valid_code_for(plan.code, HUB_ID)
    [problem] = plan.check()
    assert problem.startswith(f"config not available: could not fetch {HUB_ID}'s config.json: the Hub did not answer")
    assert "set HF_HUB_OFFLINE=1" in problem
    assert tried, "online, nbhw asks the Hub for config.json (and nothing else)"
    assert all("huggingface.co" in attempt for attempt in tried), tried
    # One attempt without retries (huggingface_hub's own download retried for 23 s here).
    assert time.monotonic() - started < 5
    # The panel re-plans on every change: for a minute nbhw does not ask again.
    attempts = len(tried)
    preview = last(parts(Form(HUB_ID, dtype="float32"))).preview
    valid_code_for(preview.code, HUB_ID)
    assert "the Hub did not answer" in preview.problems[0] and len(tried) == attempts
