"""NbhwApp's settings (traitlets, environment defaults, checks) and how the extension is found."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError, HTTPResponse
from traitlets import TraitError
from traitlets.config import Config

import nbhw
from nbhw.server import NbhwApp, metrics
from nbhw.server.handlers import routes

Fetch = Callable[..., Awaitable[HTTPResponse]]
ENV = ("NBHW_SERVER_INTERVAL", "NBHW_SERVER_WINDOW", "NBHW_SERVER_PER_PROCESS", "NBHW_SERVER_DEVICES_MAX_AGE")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_defaults_without_environment(clean_env: pytest.MonkeyPatch) -> None:
    app = NbhwApp()
    assert (app.interval, app.window, app.per_process, app.devices_max_age) == (1.0, 600.0, True, 60.0)


def test_environment_gives_the_defaults_and_config_wins(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("NBHW_SERVER_INTERVAL", "0.25")
    clean_env.setenv("NBHW_SERVER_WINDOW", "120")
    clean_env.setenv("NBHW_SERVER_PER_PROCESS", "no")
    clean_env.setenv("NBHW_SERVER_DEVICES_MAX_AGE", "5")
    app = NbhwApp()
    assert (app.interval, app.window, app.per_process, app.devices_max_age) == (0.25, 120.0, False, 5.0)
    configured = NbhwApp(config=Config({"NbhwApp": {"interval": 2.0, "per_process": True}}))
    assert (configured.interval, configured.window, configured.per_process) == (2.0, 120.0, True)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("NBHW_SERVER_INTERVAL", "fast", "NBHW_SERVER_INTERVAL must be a number of seconds; got 'fast'"),
        ("NBHW_SERVER_PER_PROCESS", "maybe", "NBHW_SERVER_PER_PROCESS must be one of 1, 0, true, false"),
        ("NBHW_SERVER_INTERVAL", "0", "NbhwApp.interval must be between 0.05 and 3600 seconds; got 0.0"),
    ],
)
def test_a_malformed_environment_value_is_refused_naming_it(
    clean_env: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    clean_env.setenv(name, value)
    app = NbhwApp()
    with pytest.raises(TraitError, match=message):
        _ = app.interval if "INTERVAL" in name else app.per_process


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"interval": 0.01}, "NbhwApp.interval must be between 0.05 and 3600 seconds; got 0.01"),
        ({"window": -1}, "NbhwApp.window must be a positive number of seconds; got -1.0"),
        ({"devices_max_age": float("inf")}, "NbhwApp.devices_max_age must be a number of seconds, 0 or more"),
    ],
)
def test_out_of_range_settings_are_refused(
    clean_env: pytest.MonkeyPatch, settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(TraitError, match=message):
        NbhwApp(**settings)


def test_interval_and_window_are_checked_together(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(TraitError, match="72000 samples; at most 20000"):
        NbhwApp(interval=0.05, window=3600).initialize_settings()


@pytest.mark.parametrize("nbhw_config", [{"interval": 0.05, "window": 3600.0}])
async def test_a_server_with_bad_settings_runs_without_nbhw_and_says_why(
    capsys: pytest.CaptureFixture[str], jp_fetch: Fetch
) -> None:
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("nbhw", "api", "memory")
    assert info.value.code == 404
    assert (await jp_fetch("api", "status")).code == 200
    logged = capsys.readouterr().err  # the server logs to stderr while it starts
    assert "nbhw | extension failed loading" in logged and "at most 20000" in logged


def test_extension_point_names_the_app_without_making_import_nbhw_load_the_server() -> None:
    assert nbhw._jupyter_server_extension_points() == [{"module": "nbhw.server", "app": NbhwApp}]
    heavy = ("jupyter_server", "tornado", "traitlets", "nbhw.server")
    code = f"import json, sys, nbhw; print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_the_reference_documents_every_setting_route_and_metric_the_code_has() -> None:
    reference = Path(__file__).resolve().parents[2] / "docs" / "reference"
    server = (reference / "server.md").read_text(encoding="utf-8")
    settings = set(re.findall(r"^c\.NbhwApp\.(\w+) = ", server, re.M))
    assert settings == set(NbhwApp.class_own_traits(config=True))
    assert set(re.findall(r"\$(NBHW_SERVER_\w+)", server)) == set(ENV)
    assert {f"/{pattern.lstrip('/')}" for pattern, _ in routes()} <= set(re.findall(r"`GET (/nbhw/[\w/]+)", server))
    metrics_page = (reference / "metrics.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^# TYPE (nbhw_\w+) gauge$", metrics_page, re.M))
    assert documented == set(re.findall(r"^\| `(nbhw_\w+)` \|", metrics_page, re.M))  # the table names each one
    names = {name for name, _ in [*metrics.HOST.values(), *metrics.GPU.values(), metrics.PROCESS, metrics.KERNEL]}
    assert documented == names
