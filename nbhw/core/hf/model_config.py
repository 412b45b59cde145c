"""A model's config from a local folder, the local HF cache, or (when online and allowed) the Hub's config.json.

Nothing else is ever fetched: no weights, no code. Configs that need remote code are refused, not run.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from nbhw.core.errors import UserError
from nbhw.core.hf.meta_build import quiet

LOCAL = "local folder"
CACHE = "HF cache"
HUB = "Hub config.json"


@dataclass
class ModelConfig:
    """Where a model's config came from, the config itself (None when unavailable), and why not."""

    model: str
    config: Any | None
    source: str | None
    problem: str | None = None

    @property
    def available(self) -> bool:
        """Whether a config was found."""
        return self.config is not None

    @cached_property
    def key(self) -> str:
        """The config as a cache key, its class and every value: plans of the same config share their meta builds.
        Read once (a config's JSON costs about a millisecond, and a search makes hundreds of plans of one config,
        which nbhw never changes once read)."""
        if self.config is None:
            raise ValueError(f"no config for {self.model!r}: {self.problem}")
        return f"{type(self.config).__name__}:{self.config.to_json_string(use_diff=False)}"


def offline_by_environment() -> bool:
    """Whether huggingface_hub is in offline mode (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return True
    return False


def _looks_like_path(model: str) -> bool:
    return (
        model.startswith(("/", "./", "../", "~", "\\"))
        or os.sep in model.strip("/").replace("/", "", 1)
        or (len(model) > 1 and model[1] == ":")
    )


def _is_repo_id(model: str) -> bool:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils._validators import validate_repo_id

    try:
        validate_repo_id(model)
    except HFValidationError:
        return False
    return True


def kind(model: str) -> str:
    """'local' for an existing folder, 'hub' for a valid Hub id; a UserError for anything else."""
    try:
        path = Path(model).expanduser()
    except RuntimeError:  # "~name" for a user this machine doesn't have
        user = model[1:].split("/", maxsplit=1)[0]
        raise UserError(f"no such folder: {model!r} (no user {user!r} here); pass an existing model folder or a Hub "
                        "id like 'org/name'") from None  # fmt: skip
    if path.is_dir():
        return "local"
    if path.exists():
        raise UserError(f"{model!r} is a file; pass the model's folder (the one holding config.json)")
    if not _looks_like_path(model) and _is_repo_id(model):
        return "hub"
    if _looks_like_path(model):
        raise UserError(f"no such folder: {model!r}; pass an existing model folder or a Hub id like 'org/name'")
    raise UserError(f"{model!r} is neither a local folder nor a Hub model id ('org/name', letters, digits, -_.)")


def _from_pretrained(where: str, **kwargs: Any) -> Any:
    from transformers import AutoConfig  # lazy: import nbhw and %load_ext nbhw stay free of transformers

    # Quiet: transformers logs about odd configs (an unknown rope type) from whichever thread reads them, the
    # panel's worker included; what matters comes back as the problem or the dry run.
    with quiet():
        return AutoConfig.from_pretrained(where, trust_remote_code=False, **kwargs)


def _explain(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    if "trust_remote_code" in text:
        return "this model's config needs trust_remote_code=True; nbhw never runs a model's own code"
    return f"{type(exc).__name__}: {text[:300]}"


def load(model: str, *, offline: bool = False) -> ModelConfig:
    """Find ``model``'s config without downloading weights; the Hub is asked only when online and not ``offline``."""
    if kind(model) == "local":
        folder = Path(model).expanduser()
        if not (folder / "config.json").is_file():
            return ModelConfig(model, None, None, f"{model!r} has no config.json")
        try:
            return ModelConfig(model, _from_pretrained(str(folder)), LOCAL)
        except Exception as exc:
            return ModelConfig(model, None, None, _explain(exc))
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(model, "config.json")
    if isinstance(cached, str):
        try:
            return ModelConfig(model, _from_pretrained(model, local_files_only=True), CACHE)
        except Exception as exc:
            return ModelConfig(model, None, None, _explain(exc))
    if offline or offline_by_environment():
        return ModelConfig(model, None, None, f"config not available offline: {model} is not in the local HF cache")
    return _from_hub(model)


def _from_hub(model: str) -> ModelConfig:
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError

    endpoint = constants.ENDPOINT
    down = _unreachable.get(endpoint)
    if down is not None and time.monotonic() - down[0] < HUB_RETRY_AFTER:
        return ModelConfig(model, None, None, _unreachable_problem(model, down[1]))
    try:
        # One HEAD request without retries first: when the network is down, hf_hub_download retries the
        # connection with back-off for about 23 s before giving up.
        get_hf_file_metadata(hf_hub_url(model, "config.json"), timeout=5)
        path = hf_hub_download(model, "config.json", etag_timeout=5)
        return ModelConfig(model, _from_pretrained(str(Path(str(path)).parent)), HUB)
    except HfHubHTTPError as exc:  # the Hub answered: no such repo, gated, ...
        return ModelConfig(
            model, None, None, f"config not available: could not fetch {model}'s config.json ({_explain(exc)})"
        )
    except Exception as exc:  # no answer at all: don't ask again for a while (the panel re-plans on every change)
        _unreachable[endpoint] = (time.monotonic(), _explain(exc))
        return ModelConfig(model, None, None, _unreachable_problem(model, _explain(exc)))


# Endpoint -> (monotonic time, why) of the last attempt that got no answer from the Hub.
_unreachable: dict[str, tuple[float, str]] = {}
HUB_RETRY_AFTER = 60.0


def _unreachable_problem(model: str, why: str) -> str:
    return (
        f"config not available: could not fetch {model}'s config.json: the Hub did not answer ({why}); "
        "working offline, set HF_HUB_OFFLINE=1 or pass --offline"
    )
