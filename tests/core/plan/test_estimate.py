"""Estimates: exact bytes from the meta model, published parameter counts, the loaded model, real KV caches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    MixtralConfig,
    Qwen3Config,
)

import nbhw
from nbhw.core.hf import meta_build
from nbhw.core.hf.dryrun import storage_bytes, tensors_of
from nbhw.core.hf.tiny_model import tiny_model_path
from nbhw.core.plan import run, run_parts


def config_folder(tmp_path: Path, config: Any, arch: str, dtype: str = "bfloat16") -> str:
    """A folder holding only config.json, as a model card's hyperparameters give it (no weights)."""
    config.architectures = [arch]
    config.dtype = dtype
    folder = tmp_path / arch
    config.save_pretrained(folder)
    return str(folder)


def llama3_8b() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )


def qwen3_06b() -> Qwen3Config:
    return Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
    )


def mixtral_8x7b() -> MixtralConfig:
    return MixtralConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=32768,
        rope_theta=1e6,
        tie_word_embeddings=False,
    )


@pytest.mark.parametrize(
    ("make", "arch", "published"),
    [
        (llama3_8b, "LlamaForCausalLM", {"parameters": (8.03, 2)}),
        # Qwen3-0.6B's card: 0.6B parameters, 0.44B non-embedding.
        (qwen3_06b, "Qwen3ForCausalLM", {"parameters": (0.6, 1), "non_embedding_parameters": (0.44, 2)}),
        (mixtral_8x7b, "MixtralForCausalLM", {"parameters": (46.7, 1)}),
    ],
)
def test_parameter_counts_match_the_published_figures(
    tmp_path: Path, make: Any, arch: str, published: dict[str, tuple[float, int]]
) -> None:
    est = nbhw.plan(config_folder(tmp_path, make(), arch)).estimate
    assert est is not None and est.dtype == "bfloat16"
    for field, (billions, digits) in published.items():
        assert round(getattr(est, field) / 1e9, digits) == billions, (field, getattr(est, field))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_parameter_bytes_equal_an_independent_meta_models(tmp_path: Path, dtype: str) -> None:
    folder = config_folder(tmp_path, llama3_8b(), "LlamaForCausalLM")
    est = nbhw.plan(folder, dtype=dtype).estimate
    with torch.device("meta"), meta_build.quiet():
        model = AutoModelForCausalLM.from_config(llama3_8b(), dtype=getattr(torch, dtype))
    assert est is not None
    assert est.parameter_bytes == sum(p.numel() * p.element_size() for p in model.parameters())
    assert est.parameters == sum(p.numel() for p in model.parameters())
    from accelerate.utils import calculate_maximum_sizes

    total, (largest, names) = calculate_maximum_sizes(model)
    assert (est.total_bytes, est.largest_layer_bytes, est.largest_layer) == (total, largest, names)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_loaded_tiny_model_is_within_5_percent_of_the_estimate(dtype: str) -> None:
    est = nbhw.plan(dtype=dtype).estimate
    with meta_build.quiet():
        model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path()), dtype=dtype)
    loaded = model.get_memory_footprint()
    assert est is not None and abs(loaded - est.total_bytes) <= 0.05 * loaded, (loaded, est.total_bytes)


def test_kv_cache_of_llama3_8b_is_128_kib_per_token(tmp_path: Path) -> None:
    est = nbhw.plan(config_folder(tmp_path, llama3_8b(), "LlamaForCausalLM")).estimate
    # 32 layers x 8 KV heads x 128 head dim x (key + value) x 2 bytes.
    assert est is not None and est.kv_cache_per_1k_tokens == 1000 * 32 * 8 * 128 * 2 * 2


def real_cache_bytes(config: Any, dtype: torch.dtype, tokens: int) -> int:
    """Run a randomly initialised model on ``tokens`` tokens and add up the cache transformers keeps (every storage
    the cache object holds: keys, values, and a sliding layer's window scalar)."""
    torch.manual_seed(0)
    with meta_build.quiet():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    ids = torch.randint(0, config.vocab_size, (1, tokens))
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    return storage_bytes(tensors_of(cache))


def tiny_qwen3(**extra: Any) -> Qwen3Config:
    small = {"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    return Qwen3Config(vocab_size=300, num_key_value_heads=2, head_dim=16, **small, **extra)


@pytest.mark.parametrize(
    ("config", "tokens"),
    [
        # head_dim given, grouped-query attention
        (tiny_qwen3(), 40),
        # a sliding window shorter than the prompt on one layer of two
        (
            tiny_qwen3(sliding_window=8, use_sliding_window=True, layer_types=["sliding_attention", "full_attention"]),
            40,
        ),
        # no head_dim and no num_key_value_heads in the config (GPT-2 names)
        (GPT2Config(vocab_size=300, n_embd=48, n_layer=3, n_head=4, n_positions=128), 30),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_cache_estimate_equals_the_cache_transformers_fills(config: Any, tokens: int, dtype: torch.dtype) -> None:
    # The dry run of generate(): the cache right after a prefill of `tokens` tokens (the plan's run at tokens + 1).
    built = run_parts.build(config, dtype=str(dtype).removeprefix("torch."), auto_name="AutoModelForCausalLM",
                      attn_implementation=None)  # fmt: skip
    estimated = run.run_estimate(built.model, batch=1, context=tokens + 1, target="cpu").cache_bytes
    assert estimated == real_cache_bytes(config, dtype, tokens)


def test_training_estimate_is_accelerates(tmp_path: Path) -> None:
    from accelerate.commands.estimate import estimate_training_usage

    est = nbhw.plan(config_folder(tmp_path, qwen3_06b(), "Qwen3ForCausalLM")).estimate
    assert est is not None
    assert est.training == estimate_training_usage(est.parameters * 4, "bfloat16")
    assert est.training_peak == max(est.training.values())
    # Mixed-precision Adam: float32 weights (4 B), gradients (4 + 2 B) and two float32 states (8 B) per parameter.
    assert est.training_total == 18 * est.parameters


def test_quantized_weights_are_sized_at_bitsandbytes_element_size_plus_its_scales() -> None:
    from transformers.quantizers.base import get_keys_to_not_convert

    plain_plan = nbhw.plan(dtype="float16")
    plain = plain_plan.estimate
    four = nbhw.plan(dtype="float16", quantization="4bit").estimate
    eight = nbhw.plan(dtype="float16", quantization="8bit").estimate
    assert plain is not None and four is not None and eight is not None
    # Linear weights go to 4 / 8 bits, plus what bitsandbytes stores beside them: a float32 absmax per 64 weights
    # and 16 float32 of quant_map per layer (4-bit), a float32 scale per output row (8-bit). Embeddings, norms and
    # lm_head (skipped by transformers) keep float16.
    skip = get_keys_to_not_convert(plain_plan.meta_model)
    linear = [
        m.weight
        for name, m in plain_plan.meta_model.named_modules()
        if type(m) is torch.nn.Linear and not any(name == k or name.endswith("." + k) for k in skip)
    ]
    assert linear
    kept = plain.total_bytes - sum(w.numel() * 2 for w in linear)
    assert four.total_bytes == kept + sum(w.numel() // 2 + w.numel() // 64 * 4 + 64 for w in linear)
    assert eight.total_bytes == kept + sum(w.numel() + 4 * w.shape[0] for w in linear)


def test_auto_dtype_without_one_in_the_config_is_read_from_the_weights_like_transformers(tmp_path: Path) -> None:
    import json

    with meta_build.quiet():
        model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path()), dtype=torch.bfloat16)
        model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("dtype", None)
    config.pop("torch_dtype", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with meta_build.quiet():
        loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path))  # dtype="auto"
    plan = nbhw.plan(str(tmp_path))
    assert plan.inputs.config_dtype is None and plan.dtype == str(loaded.dtype).removeprefix("torch.") == "bfloat16"
    assert any("dtype of the local weights" in n for n in plan.notes)
    assert plan.estimate is not None and plan.estimate.total_bytes == loaded.get_memory_footprint()
