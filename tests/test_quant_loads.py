"""Real loads on this CPU with the quantization packages of the test extra: what from_pretrained really holds equals
nbhw's estimate within 5 %, both the quantization row's weight bytes and the plan's estimate."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

import nbhw
from nbhw.core.advice.quantization_methods import build_config
from nbhw.core.advice.quantization_sizes import SizingQuantizer, loaded_weight_bytes, weight_bytes
from nbhw.core.hf import meta_build, model_config

TOLERANCE = 0.05


def _needs(module: str) -> Any:
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"{module} is not installed")


def _config(method: str, **arguments: Any) -> Any:
    import transformers

    if method == "torchao":
        config, problem = build_config("torchao", "bfloat16")  # the one nbhw's cell writes
        assert config is not None, problem
        return config
    name = "QuantoConfig" if method == "quanto" else "BitsAndBytesConfig"
    return getattr(transformers, name)(**arguments)


CASES = [
    pytest.param("torchao", {}, "torchao", marks=_needs("torchao"), id="torchao-int8-weight-only"),
    pytest.param("quanto", {"weights": "int8"}, "quanto", marks=_needs("optimum"), id="quanto-int8"),
    pytest.param("quanto", {"weights": "int4"}, None, marks=_needs("optimum"), id="quanto-int4"),
    pytest.param(
        "bitsandbytes_4bit", {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "4bit", marks=_needs("bitsandbytes"),
        id="bitsandbytes-nf4",
    ),
    pytest.param(
        "bitsandbytes_4bit", {"load_in_4bit": True, "bnb_4bit_use_double_quant": True}, None,
        marks=_needs("bitsandbytes"), id="bitsandbytes-double-quant",
    ),
    pytest.param(
        "bitsandbytes_8bit", {"load_in_8bit": True}, "8bit", marks=_needs("bitsandbytes"), id="bitsandbytes-8bit"
    ),
]  # fmt: skip


def _load(folder: str, config: Any) -> Any:
    with meta_build.quiet():
        return AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.bfloat16, quantization_config=config, device_map="cpu"
        )


@pytest.mark.slow
@pytest.mark.parametrize(("method", "arguments", "word"), CASES)
def test_loaded_bytes_match_the_estimate(
    tiny_llama: str, method: str, arguments: dict[str, Any], word: str | None
) -> None:
    config = _config(method, **arguments)
    real = loaded_weight_bytes(_load(tiny_llama, config))
    of_model = model_config.load(tiny_llama, offline=True).config
    row = weight_bytes(method, of_model, config, "bfloat16")
    assert row.bytes is not None and abs(row.bytes - real) / real < TOLERANCE, (row, real)
    print(f"{method} {arguments}: loaded {real:,} B, nbhw {row.bytes:,} B ({(row.bytes - real) / real:+.2%})")
    if word is not None:  # the plan's estimate for the same method, through its quantization= word
        estimate = nbhw.plan(tiny_llama, quantization=word, dtype="bfloat16", device_map="cpu").estimate
        assert estimate is not None and abs(estimate.total_bytes - real) / real < TOLERANCE, (estimate, real)


@pytest.mark.slow
@_needs("bitsandbytes")
def test_transformers_sizes_alone_miss_bitsandbytes_absmax(tiny_llama: str) -> None:
    from transformers import BitsAndBytesConfig
    from transformers.integrations.accelerate import compute_module_sizes

    config = BitsAndBytesConfig(load_in_4bit=True)
    model = _load(tiny_llama, config)
    real = loaded_weight_bytes(model)
    built = meta_build.build(model_config.load(tiny_llama, offline=True).config, dtype="bfloat16")
    sizer = SizingQuantizer("bitsandbytes_4bit", config)
    assert built.model is not None and sizer.element == 0.5  # transformers' quantized_element_size
    without_scales = sum(
        p.numel() * sizer.element if sizer.param_needs_quantization(built.model, n) else p.numel() * 2
        for n, p in built.model.named_parameters()
    )
    assert (real - without_scales) / real > TOLERANCE  # quantized_element_size=0.5 leaves out the absmax
    assert model.get_memory_footprint() < real  # transformers' own footprint leaves it out too
    sizes, _ = compute_module_sizes(built.model, sizer)
    assert abs(sizes[""] - real) / real < TOLERANCE


@pytest.mark.slow
@_needs("torchao")
def test_packed_storage_is_counted_as_stored_not_at_the_logical_dtype(tiny_llama: str) -> None:
    model = _load(tiny_llama, _config("torchao"))
    logical = sum(p.numel() * 2 for p in model.parameters())
    assert loaded_weight_bytes(model) < logical
    assert model.get_memory_footprint() > loaded_weight_bytes(model)  # transformers counts the bf16 shape
