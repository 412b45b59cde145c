"""nbhw's embedded default model: a tiny Qwen3 written to a local folder on first use, no download.

It is a real transformers checkpoint (config, safetensors weights, tokenizer) with random weights, so the
code nbhw writes for it loads and generates on any machine, offline.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

from nbhw.core.hf.meta_build import quiet

NAME = "nbhw-tiny-qwen3"
_lock = threading.Lock()


def default_dir() -> Path:
    """Where the tiny model lives: $NBHW_HOME, else ~/.cache/nbhw."""
    home = os.environ.get("NBHW_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "nbhw")
    return Path(home) / NAME


def _corpus() -> list[str]:
    words = [
        "the",
        "model",
        "runs",
        "on",
        "the",
        "device",
        "with",
        "memory",
        "and",
        "attention;",
        "bf16",
        "float16",
        "float32",
        "cuda",
        "cpu",
        "mps",
        "xpu",
        "hello",
        "world",
        "tokens",
        "layers",
        "heads",
        "kernels",
        "notebook",
        "hardware",
        "load",
        "generate",
    ]
    return [" ".join(words[i:] + words[:i]) for i in range(len(words))]


def tiny_config(vocab_size: int = 300, eos: int = 1) -> Any:
    """The tiny Qwen3's config (in memory, nothing written): also the reference class for hardware-only advice."""
    from transformers import Qwen3Config  # lazy: import nbhw and %load_ext nbhw stay free of transformers

    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        eos_token_id=eos,
        pad_token_id=eos,
        bos_token_id=eos,
        tie_word_embeddings=False,
        architectures=["Qwen3ForCausalLM"],
    )


def build(path: Path) -> Path:
    """Write the tiny model (tokenizer + random weights) into ``path``; returns ``path``."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    # lazy: import nbhw and %load_ext nbhw stay free of tokenizers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_corpus(), trainer)
    from tokenizers import decoders  # lazy: import nbhw and %load_ext nbhw stay free of tokenizers

    tok.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    config = tiny_config(len(tokenizer), tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with quiet():  # no "Writing model shards" bar: in a kernel, widgets left open in the cell that asked
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    if path.exists():  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.replace(path)
    return path


def tiny_model_path(path: Path | None = None) -> Path:
    """The tiny model's folder, built on first use (about a second)."""
    target = path or default_dir()
    with _lock:
        if not (target / "config.json").is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            build(target)
    return target
