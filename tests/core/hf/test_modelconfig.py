"""Configs come from a local folder or the HF cache; the Hub only when online and allowed; mistakes are one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nbhw.core.errors import UserError
from nbhw.core.hf import model_config
from nbhw.core.hf.tiny_model import tiny_model_path


def test_local_folder_loads_its_config() -> None:
    found = model_config.load(str(tiny_model_path()))
    assert found.available and found.source == model_config.LOCAL
    assert found.config.model_type == "qwen3" and found.config.num_hidden_layers == 2


def test_hf_cache_is_used_without_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "hub"
    snap = cache / "models--acme--tiny" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    shutil.copy(tiny_model_path() / "config.json", snap / "config.json")
    (cache / "models--acme--tiny" / "refs").mkdir()
    (cache / "models--acme--tiny" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    found = model_config.load("acme/tiny")
    assert found.available and found.source == model_config.CACHE, found.problem


def test_uncached_hub_id_offline_says_so_and_never_downloads(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("nbhw tried the network")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", no_network)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    found = model_config.load("nobody/not-cached-model")
    assert not found.available and "not available offline" in (found.problem or "")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    found = model_config.load("nobody/not-cached-model", offline=True)
    assert "not available offline" in (found.problem or "")


def test_online_fetch_failure_is_a_problem_not_an_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def unreachable(*args: object, **kwargs: object) -> str:
        calls.append("HEAD")
        raise OSError("network unreachable")

    monkeypatch.setattr("huggingface_hub.get_hf_file_metadata", unreachable)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", unreachable)
    monkeypatch.setattr(model_config, "_unreachable", {})
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    found = model_config.load("nobody/not-cached-model")
    assert not found.available and "could not fetch" in (found.problem or "") and "HF_HUB_OFFLINE=1" in found.problem
    # For a minute, other ids don't ask again: the panel re-plans on every change.
    assert "the Hub did not answer" in (model_config.load("nobody/other-model").problem or "") and calls == ["HEAD"]


def test_remote_code_configs_are_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "mystery", "auto_map": {"AutoConfig": "configuration_mystery.MysteryConfig"}})
    )
    found = model_config.load(str(tmp_path))
    assert not found.available and "trust_remote_code" in (found.problem or "")


@pytest.mark.parametrize(
    "model",
    ["./no/such/folder", "/definitely/not/here", "~/nope-nbhw", "bad id with spaces", "org/name/extra", "a" * 200],
)
def test_bad_models_are_one_line_user_errors(model: str) -> None:
    with pytest.raises(UserError) as err:
        model_config.load(model)
    assert "\n" not in str(err.value)


def test_folder_without_config(tmp_path: Path) -> None:
    found = model_config.load(str(tmp_path))
    assert not found.available and "no config.json" in (found.problem or "")


def test_reading_an_odd_config_logs_nothing(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # transformers logs about an unknown rope type from whichever thread reads the config: the panel's worker too.
    config = json.loads((tiny_model_path() / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "rope_scaling": {"type": "nbhw-unknown"}}))
    capfd.readouterr()
    assert model_config.load(str(tmp_path)).available
    assert capfd.readouterr() == ("", "")


def test_a_home_folder_of_a_user_that_is_not_here_is_a_one_line_mistake() -> None:
    from nbhw.core.errors import UserError
    from nbhw.core.hf.model_config import kind

    with pytest.raises(UserError, match="no such folder: '~nobody-here-xyz/model'"):
        kind("~nobody-here-xyz/model")
