"""A model's repeated decoder layers, and what makes two of them do the same work.

Shared by the planners that record a few layers and repeat the middle ones' period up to the model's depth (the
training step, :mod:`nbhw.core.train.step`, and the run, :mod:`nbhw.core.plan.run_depth`).
"""

from __future__ import annotations

from typing import Any


def decoder_stack(model: Any) -> tuple[str, list[Any]]:
    """The model's repeated decoder layers and the ModuleList's name: the longest ModuleList of one class named in
    _no_split_modules ("", [] when there is none)."""
    import torch  # lazy: import nbhw stays free of torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    no_split = set(getattr(base, "_no_split_modules", None) or [])
    best: tuple[str, list[Any]] = ("", [])
    for name, module in base.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > len(best[1]):
            kinds = {type(m) for m in module}
            # FSDP2 swaps in a subclass (FSDPLlamaDecoderLayer): look through it to the model's own class.
            names = {c.__name__ for k in kinds for c in k.__mro__}
            if len(kinds) == 1 and (not no_split or names & no_split):
                best = (name, list(module))
    return best


def decoder_layers(model: Any) -> list[Any]:
    """The model's repeated decoder layers: the longest ModuleList of one class named in _no_split_modules."""
    return decoder_stack(model)[1]


def layer_signature(layer: Any) -> tuple[Any, ...]:
    """What makes two decoder layers do the same work: their modules' classes and parameters (shape, dtype,
    trainable) in order."""
    modules = tuple((n, type(m).__name__) for n, m in layer.named_modules())
    params = tuple((n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in layer.named_parameters())
    return modules, params
