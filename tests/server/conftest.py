"""A real Jupyter server (pytest-jupyter) with nbhw enabled and unauthenticated access refused.

pytest-jupyter's fixtures are imported here rather than named in ``pytest_plugins``: pytest refuses
``pytest_plugins`` in a conftest below the rootdir, and this keeps its autouse fixtures (a fresh event loop,
the server clean-up) to the server tests. Being defined in this deeper conftest, the server clean-up runs before
tests/conftest.py's check that no nbhw thread is left, so that check also proves the sampler stopped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403
from traitlets.config import Config

from nbhw.server import NbhwApp

ENABLE = Path(__file__).resolve().parents[2] / "jupyter-config" / "jupyter_server_config.d" / "nbhw.json"


@pytest.fixture
def nbhw_config() -> dict[str, Any]:
    """NbhwApp settings for one test (parametrize this name to change them)."""
    return {}


@pytest.fixture
def jp_server_config(nbhw_config: dict[str, Any]) -> Config:
    """nbhw enabled the way jupyter-config/ enables it, every request authenticated, fast sampling."""
    enabled = json.loads(ENABLE.read_text(encoding="utf-8"))["ServerApp"]["jpserver_extensions"]
    return Config(
        {
            # Terminals off: pytest-jupyter would add them, and nbhw's routes are what is tested.
            "ServerApp": {
                "jpserver_extensions": {"jupyter_server_terminals": False, **enabled},
                "allow_unauthenticated_access": False,
            },
            "NbhwApp": {"interval": 0.1, "window": 30.0, **nbhw_config},
        }
    )


@pytest.fixture
def nbhw_app(jp_serverapp: Any) -> NbhwApp:
    """The extension app the test server loaded."""
    app = jp_serverapp.extension_manager.extension_points["nbhw"].app
    assert isinstance(app, NbhwApp)
    return app
