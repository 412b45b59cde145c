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


def saved_quickly(config: Any, folder: Path, auto: str = "AutoModelForCausalLM") -> str:
    """As ``saved``, for checkpoints big enough that building them takes seconds: the model is built on the meta
    device and its parameters drawn once, from the distributions transformers' own init uses for these layers
    (matrices normal(0, initializer_range), 1-D weights one, biases zero), not drawn twice (torch's default init,
    then transformers' own). 221 MiB: 0.3 s instead of 1.7 s on an idle 2-core machine."""
    torch.manual_seed(0)
    with quiet(), torch.device("meta"):
        model = getattr(transformers, auto).from_config(config)
    model = model.to_empty(device="cpu")
    std = getattr(config, "initializer_range", 0.02)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, std)
            else:
                p.zero_() if name.endswith("bias") else p.fill_(1.0)
    with quiet():
        model.save_pretrained(folder)
    return str(folder)


def config_only(config: Any, folder: Path, arch: str, dtype: str = "float32") -> str:
    config.architectures = [arch]
    config.dtype = dtype
    config.save_pretrained(folder)
    return str(folder)
