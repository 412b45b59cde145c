"""Tiny models and config-only folders saved locally: real transformers checkpoints, no weights downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

from nbhw.core.hf.meta_build import quiet


def saved(config: Any, folder: Path, auto: str = "AutoModelForCausalLM") -> str:
    """A tiny random-weight checkpoint of ``config`` in ``folder``."""
    torch.manual_seed(0)
    with quiet():
        getattr(transformers, auto).from_config(config).save_pretrained(folder)
    return str(folder)


def config_only(config: Any, folder: Path, arch: str, dtype: str = "float32") -> str:
    config.architectures = [arch]
    config.dtype = dtype
    config.save_pretrained(folder)
    return str(folder)
