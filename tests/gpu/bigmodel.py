"""A ~1B-parameter Qwen3 built locally with random weights: a real checkpoint the planner's code must load on a GPU.

Its tokenizer is the one of nbhw's tiny model (built offline), so the emitted cell's tokenizer line and generation run
too. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Llama-3.2-1B-like widths with Qwen3's layout (q/k norms, grouped KV heads, untied head): about 1.0B parameters.
HIDDEN = 2048
INTERMEDIATE = 6144
LAYERS = 20
HEADS = 16
KV_HEADS = 8
HEAD_DIM = 128


def billion_config(vocab_size: int, eos_token_id: int, **overrides: Any) -> Any:
    """The ~1B config (in memory); ``overrides`` change any field (the CPU tests build a one-layer copy)."""
    from transformers import Qwen3Config

    fields: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": 4096,
        "eos_token_id": eos_token_id,
        "pad_token_id": eos_token_id,
        "bos_token_id": eos_token_id,
        "tie_word_embeddings": False,
        "architectures": ["Qwen3ForCausalLM"],
        "dtype": "bfloat16",
    }
    fields.update(overrides)
    return Qwen3Config(**fields)


def parameter_count(config: Any) -> int:
    """Qwen3ForCausalLM's parameters, by arithmetic on the config (no bias, untied head)."""
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    attention = h * q + 2 * h * kv + q * h + 2 * d  # q, k, v, o projections; q_norm and k_norm
    layer = attention + 3 * h * i + 2 * h  # gate, up, down; two RMSNorms
    head = config.vocab_size * h * (1 if config.tie_word_embeddings else 2)
    return config.num_hidden_layers * layer + head + h  # + the final norm


def build(path: Path, seed: int = 0, **overrides: Any) -> Path:
    """Write the ~1B model (bfloat16 random weights, safetensors) and the tiny model's tokenizer into ``path``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nbhw.core.hf.tiny_model import tiny_model_path

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    config = billion_config(len(tokenizer), int(tokenizer.eos_token_id), **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
