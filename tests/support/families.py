"""Tiny configs of the architecture families the tests run for real (small sizes, published layouts)."""

from __future__ import annotations

from typing import Any

import transformers as tf

COMMON = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
}


def llama() -> Any:
    return tf.LlamaConfig(**COMMON, head_dim=16)


def qwen3() -> Any:
    return tf.Qwen3Config(**COMMON, head_dim=16)


def mixtral() -> Any:
    return tf.MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2)


def qwen3_moe() -> Any:
    return tf.Qwen3MoeConfig(**COMMON, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


def mistral(window: int = 64) -> Any:
    return tf.MistralConfig(**COMMON, head_dim=16, sliding_window=window)


def gemma2() -> Any:
    return tf.Gemma2Config(**COMMON, head_dim=16, sliding_window=32)


def gemma3() -> Any:
    return tf.Gemma3TextConfig(
        **{**COMMON, "num_hidden_layers": 3},
        head_dim=16,
        sliding_window=32,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    )


def deepseek_v2() -> Any:
    return tf.DeepseekV2Config(
        **{**COMMON, "num_key_value_heads": 4},
        kv_lora_rank=32,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        first_k_dense_replace=1,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
    )


def deepseek_v3() -> Any:
    return tf.DeepseekV3Config(
        **{**COMMON, "num_key_value_heads": 4},
        kv_lora_rank=32,
        q_lora_rank=48,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        first_k_dense_replace=1,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
    )


def qwen3_next() -> Any:
    return tf.Qwen3NextConfig(
        **{**COMMON, "num_hidden_layers": 4},
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        full_attention_interval=2,
    )


def jamba() -> Any:
    return tf.JambaConfig(
        **{**COMMON, "num_hidden_layers": 4},
        num_experts=2,
        num_experts_per_tok=1,
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        use_mamba_kernels=False,
    )


def mamba() -> Any:
    return tf.MambaConfig(
        vocab_size=256, hidden_size=64, num_hidden_layers=2, state_size=8, conv_kernel=4, expand=2, use_mambapy=False
    )


def gpt2() -> Any:
    return tf.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=2048)


def bert() -> Any:
    return tf.BertConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=2048,
    )


def t5_unequal() -> Any:
    # ByT5-like: a deep encoder and a shallow decoder.
    return tf.T5Config(
        vocab_size=256,
        d_model=64,
        d_kv=16,
        d_ff=96,
        num_layers=3,
        num_decoder_layers=1,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )


def whisper() -> Any:
    return tf.WhisperConfig(
        vocab_size=256,
        d_model=64,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=96,
        decoder_ffn_dim=96,
        num_mel_bins=16,
        max_source_positions=64,
        max_target_positions=512,
        decoder_start_token_id=1,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=1,
        begin_suppress_tokens=None,
        suppress_tokens=None,
    )


def qwen2_vl() -> Any:
    text = {
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    }
    vision = {
        "depth": 1,
        "embed_dim": 32,
        "hidden_size": 64,
        "num_heads": 2,
        "in_chans": 3,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    return tf.Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=250,
        video_token_id=251,
        vision_start_token_id=252,
        vision_end_token_id=253,
    )


def llava() -> Any:
    text = tf.LlamaConfig(**COMMON, head_dim=16)
    vision = tf.CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    return tf.LlavaConfig(text_config=text, vision_config=vision, image_token_id=250)


# (name, config factory, Auto class)
FAMILIES: list[tuple[str, Any, str]] = [
    ("llama", llama, "AutoModelForCausalLM"),
    ("qwen3", qwen3, "AutoModelForCausalLM"),
    ("mixtral", mixtral, "AutoModelForCausalLM"),
    ("qwen3_moe", qwen3_moe, "AutoModelForCausalLM"),
    ("mistral", mistral, "AutoModelForCausalLM"),
    ("gemma2", gemma2, "AutoModelForCausalLM"),
    ("gemma3", gemma3, "AutoModelForCausalLM"),
    ("deepseek_v2", deepseek_v2, "AutoModelForCausalLM"),
    ("deepseek_v3", deepseek_v3, "AutoModelForCausalLM"),
    ("qwen3_next", qwen3_next, "AutoModelForCausalLM"),
    ("jamba", jamba, "AutoModelForCausalLM"),
    ("mamba", mamba, "AutoModelForCausalLM"),
    ("gpt2", gpt2, "AutoModelForCausalLM"),
    ("bert", bert, "AutoModelForMaskedLM"),
    ("t5", t5_unequal, "AutoModelForSeq2SeqLM"),
    ("whisper", whisper, "AutoModelForSpeechSeq2Seq"),
    ("qwen2_vl", qwen2_vl, "AutoModelForImageTextToText"),
    ("llava", llava, "AutoModelForImageTextToText"),
]
