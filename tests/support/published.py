"""Published models as config-only folders: the hyperparameters of their config.json files, no weights.

Used by the run planner's regression tests, its benchmark (benchmarks/bench_run.py) and the table in
docs/reference/examples.md (benchmarks/run_table.py). Each entry is the config.json a model's Hub repository
publishes (the fields that decide sizes; everything else keeps transformers' defaults), in the checkpoint's own dtype.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# name -> config.json (model_type and architectures say which class transformers builds)
MODELS: dict[str, dict[str, Any]] = {
    "Llama-3.1-8B": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 131072, "rope_theta": 500000.0, "rope_scaling": LLAMA3_ROPE,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "dtype": "bfloat16",
    },
    "Llama-3.1-70B": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 8192,
        "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
        "max_position_embeddings": 131072, "rope_theta": 500000.0, "rope_scaling": LLAMA3_ROPE,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "dtype": "bfloat16",
    },
    "Mistral-7B-v0.3": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 32768, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "sliding_window": None, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "dtype": "bfloat16",
    },
    "Mixtral-8x7B-v0.1": {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 32768,
        "rope_theta": 1000000.0, "sliding_window": None, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "dtype": "bfloat16",
    },
    "Qwen3-8B": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096,
        "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False, "dtype": "bfloat16",
    },
    "Qwen3-30B-A3B": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936,
        "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
        "num_experts_per_tok": 8, "decoder_sparse_step": 1, "norm_topk_prob": True,
        "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False, "dtype": "bfloat16",
    },
    "Gemma-3-27B (text)": {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 262208,
        "hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 62, "num_attention_heads": 32,
        "num_key_value_heads": 16, "head_dim": 128, "query_pre_attn_scalar": 168, "sliding_window": 1024,
        "sliding_window_pattern": 6, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "rms_norm_eps": 1e-6, "dtype": "bfloat16",
    },
    "DeepSeek-V2-Lite": {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "vocab_size": 102400,
        "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
        "num_attention_heads": 16, "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64,
        "num_experts_per_tok": 6, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "kv_lora_rank": 512,
        "q_lora_rank": None, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
        "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "dtype": "bfloat16",
    },
    "DeepSeek-V3": {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
        "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
        "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
        "num_experts_per_tok": 8, "first_k_dense_replace": 3, "n_group": 8, "topk_group": 4, "kv_lora_rank": 512,
        "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
        "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "dtype": "bfloat16",
    },
    # the float16 and depth regressions of issue 16
    "T5-11B": {
        "architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "vocab_size": 32128, "d_model": 1024,
        "d_ff": 65536, "d_kv": 128, "num_heads": 128, "num_layers": 24, "feed_forward_proj": "relu",
        "dtype": "float32",
    },
    "ByT5-small": {
        "architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "vocab_size": 384, "d_model": 1472,
        "d_ff": 3584, "d_kv": 64, "num_heads": 6, "num_layers": 12, "num_decoder_layers": 4,
        "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False, "dtype": "float32",
    },
}  # fmt: skip

TABLE = (
    "Llama-3.1-8B",
    "Llama-3.1-70B",
    "Mistral-7B-v0.3",
    "Mixtral-8x7B-v0.1",
    "Qwen3-8B",
    "Qwen3-30B-A3B",
    "Gemma-3-27B (text)",
    "DeepSeek-V2-Lite",
    "DeepSeek-V3",
)


def folder(name: str, root: Path) -> str:
    """A folder holding only the model's config.json (what a model card's hyperparameters give)."""
    path = root / name.replace(" ", "_").replace("(", "").replace(")", "")
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(MODELS[name], indent=1))
    return str(path)


def config(name: str) -> Any:
    """The transformers config object of a published model."""
    from transformers import AutoConfig

    fields = {k: v for k, v in MODELS[name].items() if k not in ("model_type",)}
    return AutoConfig.for_model(MODELS[name]["model_type"], **fields)
