"""The run planner through nbhw.plan, %hw load and the CLI: the issue's wrong answers, bad input, the searches,
the per-device placement, the reserve and the host's peak while loading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from IPython.core.error import UsageError

import nbhw
from nbhw.__main__ import main
from nbhw.core.hf.dryrun import storage_bytes
from nbhw.core.hf.meta_build import quiet
from nbhw.core.plan import outside_tensors, run, run_figures, run_parts, run_search
from tests.support import families, published
from tests.support.models import config_only, saved
from tests.support.realrun import real_generate

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GIB = 2**30


def meta(make: Any, dtype: str = "float32", auto: str = "AutoModelForCausalLM") -> Any:
    return run_parts.build(make(), dtype=dtype, auto_name=auto, attn_implementation=None).model


# ---------------------------------------------------------------- the wrong answers


def test_mla_caches_the_compressed_latent(tmp_path: Path) -> None:
    """DeepSeek-V3: transformers caches kv_lora_rank + qk_rope_head_dim per token and layer, not per-head K/V."""
    config = families.deepseek_v3()
    plan = nbhw.plan(config_only(config, tmp_path, "DeepseekV3ForCausalLM"), context=1000, device_map="cpu")
    est = plan.estimate
    assert est is not None and est.cache_decode_bytes is not None
    with quiet():
        real = transformers.AutoModelForCausalLM.from_config(families.deepseek_v3()).eval()
        truth = real_generate(real, batch=1, prompt=999, new_tokens=2)
    assert est.cache_decode_bytes == truth.cache_bytes
    latent = config.num_hidden_layers * (config.kv_lora_rank + config.qk_rope_head_dim) * 4 * 1000
    per_head = config.num_hidden_layers * config.num_attention_heads * (
        config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim
    ) * 4 * 1000  # fmt: skip
    assert est.cache_decode_bytes == latent and per_head == 4 * latent  # what a per-head formula says
    assert est.kv_cache_per_1k_tokens == latent


@pytest.mark.slow
def test_mla_at_full_size_is_67_mib_per_1000_tokens_not_4_65_gib(tmp_path: Path) -> None:
    plan = nbhw.plan(published.folder("DeepSeek-V3", tmp_path), max_memory={0: "80GiB"}, context=1000)
    assert plan.estimate is not None and plan.estimate.cache_decode_bytes is not None
    assert round(plan.estimate.cache_decode_bytes / 2**20) == 67


def test_t5_float16_keeps_wo_in_float32_like_from_pretrained(tmp_path: Path) -> None:
    folder = saved(families.t5_unequal(), tmp_path, "AutoModelForSeq2SeqLM")
    plan = nbhw.plan(folder, dtype="float16")
    model = plan.meta_model
    assert run_parts.dtype_plan(model, "float16") == {"wo": torch.float32}
    assert run_parts.dtype_plan(model, "bfloat16") == {}  # _keep_in_fp32_modules applies to float16 only
    assert {p.dtype for n, p in model.named_parameters() if ".wo." in n} == {torch.float32}
    with quiet():
        loaded = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=torch.float16)
    assert plan.estimate is not None
    assert plan.estimate.total_bytes == storage_bytes([*loaded.parameters(), *loaded.buffers()])
    everything_fp16 = sum(p.numel() * 2 for p in loaded.parameters()) + sum(b.nbytes for b in loaded.buffers())
    assert everything_fp16 < plan.estimate.total_bytes  # what nbhw planned before the dtype plan


def test_t5_11b_float16_is_27_gib_not_21(tmp_path: Path) -> None:
    plan = nbhw.plan(published.folder("T5-11B", tmp_path), dtype="float16", max_memory={0: "24GiB"}, device_map=0)
    assert plan.weight_estimate is not None and round(plan.weight_estimate.total_bytes / GIB, 1) == 27.1
    assert plan.weight_placement is not None and plan.weight_placement.kind == "too_big"  # not "fits on one device"


def test_byt5_decoder_cache_uses_the_decoder_depth(tmp_path: Path) -> None:
    config = families.t5_unequal()  # 3 encoder layers, 1 decoder layer
    folder = saved(config, tmp_path, "AutoModelForSeq2SeqLM")
    plan = nbhw.plan(folder, context=200, encoder_length=300, device_map="cpu")
    with quiet():
        real = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
        truth = real_generate(real, batch=1, prompt=199, new_tokens=2, encoder_tokens=300)
    est = plan.estimate
    assert est is not None and est.cache_decode_bytes == truth.cache_bytes
    per_token_layer = 2 * config.num_heads * config.d_kv * 4
    # one decoder layer: 200 self-attention + 300 cross-attention tokens (not 3 layers of the encoder's depth)
    assert est.cache_decode_bytes == per_token_layer * (200 + 300)
    assert est.cross_cache_bytes == per_token_layer * 300 and est.encoder_length == 300


def test_sliding_window_holds_the_whole_prompt_until_the_first_decode_step() -> None:
    model = meta(lambda: families.mistral(window=64))
    est = run.run_estimate(model, batch=1, context=1001, target="cpu")  # a 1,000-token prompt
    with quiet():
        real = transformers.AutoModelForCausalLM.from_config(families.mistral(window=64)).eval()
        prefill = real_generate(real, batch=1, prompt=1000, new_tokens=1)
        decoded = real_generate(real, batch=1, prompt=1000, new_tokens=2)
    assert prefill.kv_bytes == 512_000 and decoded.kv_bytes == 32_768
    assert est.cache_bytes == prefill.cache_bytes  # 512,000 B of keys/values + two 8-byte window scalars
    assert est.cache_decode_bytes == decoded.cache_bytes
    assert est.layer_classes == {"DynamicSlidingWindowLayer": 2}


def test_a_state_space_model_sizes_its_fixed_state(tmp_path: Path) -> None:
    folder = config_only(families.mamba(), tmp_path, "MambaForCausalLM")
    short, long = (nbhw.plan(folder, context=n, device_map="cpu").estimate for n in (50, 200))
    assert short is not None and long is not None and short.run_problem is None
    with quiet():
        real = transformers.MambaForCausalLM(families.mamba()).eval()
        truth = real_generate(real, batch=1, prompt=49, new_tokens=2)
        out = real.generate(input_ids=torch.randint(3, 50, (1, 49)), max_new_tokens=2, return_dict_in_generate=True)
    # The whole cache is fixed: the same at 50 and 200 tokens, what a real generate() leaves, no keys or values.
    assert short.cache_bytes == long.cache_bytes == truth.cache_bytes and truth.kv_bytes == 0
    assert short.state_bytes == long.state_bytes == truth.state_bytes
    assert short.state_bytes is not None and short.state_bytes > 0
    # Beside its conv / recurrent states a layer holds only scalars, as the installed transformers keeps them
    # (5.25: a position counter per linear-attention layer; 5.24: none, the cache was the states alone).
    layers = out.get("cache").layers
    scalars = [t for layer in layers for t in vars(layer).values() if isinstance(t, torch.Tensor) and t.dim() == 0]
    assert short.cache_bytes == short.state_bytes + storage_bytes(scalars)
    assert "state" in nbhw.plan(folder, context=50, device_map="cpu").text()


def test_a_cpu_load_that_casts_says_it_peaks_at_the_checkpoint_plus_the_copy(tmp_path: Path) -> None:
    folder = saved(families.llama(), tmp_path)  # float32 on disk
    cast = nbhw.plan(folder, dtype="bfloat16", device_map="cpu")
    same = nbhw.plan(folder, dtype="float32", device_map="cpu")
    assert cast.ran.load_peak is not None and same.ran.load_peak is not None
    checkpoint = (tmp_path / "model.safetensors").stat().st_size
    assert cast.ran.load_peak.private_bytes == cast.weight_estimate.total_bytes  # type: ignore[union-attr]
    assert cast.ran.load_peak.file_bytes == checkpoint and same.ran.load_peak.private_bytes == 0
    assert "private" in cast.text() and cast.estimate.load_peak_bytes == cast.ran.load_peak.rss_bytes  # type: ignore[union-attr]


CHILD = r"""
import json, sys, threading, time
import torch, transformers
transformers.logging.set_verbosity_error()
path, dtype, tiny = sys.argv[1], sys.argv[2], sys.argv[3]
# Warm-up: a tiny checkpoint of the same class pulls in every lazy import from_pretrained makes.
transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=getattr(torch, dtype), device_map="cpu")
def status():
    out = {}
    for line in open("/proc/self/status"):
        if line.startswith(("RssAnon", "RssFile", "VmRSS")):
            k, v = line.split(":")
            out[k] = int(v.split()[0]) * 1024
    return out
base = status(); peak = dict(base); stop = False
def sample():
    while not stop:
        for k, v in status().items():
            peak[k] = max(peak[k], v)
        time.sleep(0.002)
t = threading.Thread(target=sample); t.start()
model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), device_map="cpu")
stop = True; t.join()
# The loaded model is still alive: one last reading, so a sampler starved of CPU cannot miss the load's end.
for k, v in status().items():
    peak[k] = max(peak[k], v)
print(json.dumps({"base": base, "peak": peak}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc/self/status")
def test_host_load_peak_matches_a_real_cpu_load_with_a_cast(tmp_path: Path) -> None:
    big = transformers.LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=1408, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=8)  # fmt: skip
    tiny = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    folder = saved(big, tmp_path / "fp32")
    saved(tiny, tmp_path / "tiny")
    argv = [sys.executable, "-c", CHILD, folder, "bfloat16", str(tmp_path / "tiny")]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env=dict(os.environ), timeout=300)
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    planned = nbhw.plan(folder, dtype="bfloat16", device_map="cpu").ran.load_peak
    assert planned is not None
    private = measured["peak"]["RssAnon"] - measured["base"]["RssAnon"]
    rss = measured["peak"]["VmRSS"] - measured["base"]["VmRSS"]
    assert abs(private - planned.private_bytes) <= 0.1 * planned.private_bytes
    assert abs(rss - planned.rss_bytes) <= 0.1 * planned.rss_bytes


# ---------------------------------------------------------------- the plan's words and verdicts


def test_the_default_context_is_4096_or_the_models_maximum() -> None:
    plan = nbhw.plan()  # the tiny model: 256 positions
    assert plan.context == 256 and plan.estimate is not None and plan.estimate.context == 256
    assert "the default: 4,096 or the model's maximum when smaller" in plan.text()


def test_context_words_are_token_counts(tmp_path: Path) -> None:
    folder = config_only(families.llama(), tmp_path, "LlamaForCausalLM")  # 2,048 positions
    for word, tokens in (("1k", 1024), ("1K", 1024), ("2048", 2048), ("2k", 2048)):
        assert nbhw.plan(folder, context=word).context == tokens
    big = published.folder("Llama-3.1-8B", tmp_path)
    assert nbhw.plan(big, context="32k").context == 32768
    assert nbhw.plan(big, context="128k").context == 131072


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("load --context 0", "valid: 2 to 16,777,216"),
        ("load --context -5", "valid: 2 to 16,777,216"),
        ("load --context 1e9", "not a token count"),
        ("load --context 99999999999", "valid: 2 to 16,777,216"),
        ("load --context 32k", "at most 256 tokens (max_position_embeddings)"),
        ("load --batch 0", "valid: 1 to 65,536"),
        ("load --batch -2", "valid: 1 to 65,536"),
        ("load --batch many", "not a whole number"),
        ("load --encoder-length 512", "for encoder-decoder models"),
        ("load --reserve lots", "reserve 'lots' is not valid"),
    ],
)
def test_bad_sizes_are_one_line_usage_errors(ip: Any, line: str, words: str) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    with pytest.raises(UsageError) as err:
        ip.run_line_magic("hw", line)
    assert "\n" not in str(err.value) and words in str(err.value), str(err.value)


def test_bad_sizes_exit_2_in_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["load", "--context", "0"]) == 2
    assert main(["load", "--context", "32k"]) == 2  # past the tiny model's 256 positions: needs its config
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "valid: 2 to 16,777,216" in err[0] and "at most 256 tokens" in err[1]


def test_whisper_encoder_length_is_fixed_and_says_so(tmp_path: Path) -> None:
    folder = config_only(families.whisper(), tmp_path, "WhisperForConditionalGeneration")
    plan = nbhw.plan(folder, context=20, device_map="cpu")
    assert plan.run is not None and plan.run.encoder_tokens == 64
    with pytest.raises(nbhw.UserError, match="this encoder takes exactly 64 positions; valid: 64"):
        nbhw.plan(folder, context=20, encoder_length=32)
    assert any("generate() pre-processes" in n for n in plan.notes)


def test_the_magic_and_the_cli_take_context_and_batch(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["load", "--context", "200", "--batch", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["context"], data["batch"], data["estimate"]["context"], data["estimate"]["batch"]) == (200, 3, 200, 3)
    assert data["arguments"]["context"] == 200 and data["run"]["batch"] == 3
    ip.run_line_magic("load_ext", "nbhw")
    ip.run_line_magic("hw", "load --context 200 --batch 3 --emit")
    assert "200 tokens per sequence" in capsys.readouterr().out


def test_a_run_that_does_not_fit_says_how_far_and_up_to_which_context(tmp_path: Path) -> None:
    folder = config_only(families.llama(), tmp_path, "LlamaForCausalLM")
    roomy = nbhw.plan(folder, device_map=0, max_memory={0: "2GiB"}, context=2000, reserve=0)
    assert roomy.placement is not None and roomy.placement.verdict == "fits on one device (accelerator 0)"
    share = roomy.placement.devices[0]
    assert share.needed_bytes == share.peak_bytes and share.peak_bytes == roomy.run.devices[0].peak_bytes  # type: ignore[union-attr]
    tight = nbhw.plan(folder, device_map=0, max_memory={0: share.peak_bytes // 2}, context=2000, reserve=0)
    assert tight.placement is not None and tight.placement.run_kind == "fits_shorter"
    limit = tight.max_context
    assert limit is not None and 2 < limit < 2000
    assert tight.placement.verdict == f"fits on one device (accelerator 0) up to {limit:,} tokens, not 2,000 tokens"
    at_limit = nbhw.plan(folder, device_map=0, max_memory={0: share.peak_bytes // 2}, context=limit, reserve=0)
    above = nbhw.plan(folder, device_map=0, max_memory={0: share.peak_bytes // 2}, context=limit + 1, reserve=0)
    # the largest context leaves the allocator its margin; one token more does not (tight, or over)
    assert at_limit.placement.run_kind == "fits" and above.placement.run_kind in ("tight", "fits_shorter")  # type: ignore[union-attr]
    weights = tight.weight_estimate.total_bytes  # type: ignore[union-attr]
    none = nbhw.plan(folder, device_map=0, max_memory={0: weights + 1000}, context=2000, reserve=0)
    assert none.placement is not None and none.placement.run_kind == "does_not_fit" and none.max_context == 0
    assert "does not fit on one device (accelerator 0) at 2,000 tokens (needs " in none.placement.verdict


def test_a_run_with_less_room_than_the_allocator_needs_is_tight_not_fits(tmp_path: Path) -> None:
    folder = config_only(families.llama(), tmp_path, "LlamaForCausalLM")
    roomy = nbhw.plan(folder, device_map=0, max_memory={0: "2GiB"}, context=2000, reserve=0)
    share = roomy.placement.devices[0]  # type: ignore[union-attr]
    largest = roomy.run.devices[0].largest_block_bytes  # type: ignore[union-attr]
    # the run's largest block is the score matrix of the prefill's attention (SDPA's math path here): batch x heads
    # x prompt x prompt (1,999 tokens, one generated) in float32; its segment rounded to 2 MiB, plus one 2 MiB
    # small-pool segment
    assert largest == families.llama().num_attention_heads * 1999 * 1999 * 4
    assert share.margin_bytes == -(-largest // (2 * 2**20)) * 2 * 2**20 + 2 * 2**20
    assert share.headroom_bytes == share.budget - share.needed_bytes  # type: ignore[operator]
    needs = share.needed_bytes + share.margin_bytes  # type: ignore[operator]
    tight = nbhw.plan(folder, device_map=0, max_memory={0: needs - 1}, context=2000, reserve=0)
    room = nbhw.plan(folder, device_map=0, max_memory={0: needs}, context=2000, reserve=0)
    assert (tight.placement.run_kind, room.placement.run_kind) == ("tight", "fits")  # type: ignore[union-attr]
    assert tight.placement.verdict.startswith("tight on one device (accelerator 0) at 2,000 tokens: ")  # type: ignore[union-attr]
    assert "headroom" in tight.text() and " tight " in tight.text()
    assert "allocator margin on accelerator 0: one more segment for the run's largest block" in tight.text()
    cpu = nbhw.plan(folder, device_map="cpu", max_memory={"cpu": needs - 1}, context=2000, reserve=0)
    assert cpu.placement.devices[0].margin_bytes == 0 and cpu.placement.run_kind == "fits"  # type: ignore[union-attr]


def test_the_reserve_is_stated_with_its_source_and_overridable(tmp_path: Path) -> None:
    hopper = outside_tensors.framework_reserve("cuda", capability=(9, 0), total_memory=80 * GIB)
    ampere = outside_tensors.framework_reserve("cuda", capability=(8, 0), total_memory=40 * GIB)
    # the context measured on an H200 (686 MiB) vs the published 400 MiB; workspaces: cuBLAS 32 MiB vs 8 MiB +
    # 128 KiB, cuBLASLt 32 MiB vs 4 MiB
    assert hopper.bytes - ampere.bytes == (686 - 400 + 32 + 32 - 8 - 4) * 2**20 - 128 * 1024
    assert "measured by nbhw's GPU suite on an H200" in hopper.source and "pytorch#86509" in ampere.source
    assert outside_tensors.framework_reserve("mps").bytes == 0
    folder = config_only(families.llama(), tmp_path, "LlamaForCausalLM")
    stated = nbhw.plan(folder, device_map=0, max_memory={0: "2GiB"})
    mine = nbhw.plan(folder, device_map=0, max_memory={0: "2GiB"}, reserve="600MiB")
    assert stated.ran.reserves[0].bytes == outside_tensors.framework_reserve("cuda").bytes
    assert "pytorch#86509" in stated.text()
    assert mine.ran.reserves[0].bytes == 600 * 2**20 and mine.ran.reserves[0].source == "override"
    assert mine.placement.devices[0].reserve_bytes == 600 * 2**20  # type: ignore[union-attr]


def test_each_device_holds_the_cache_of_its_own_layers(tmp_path: Path) -> None:
    config = families.llama()
    folder = saved(config, tmp_path)
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.layers.1": 1,
                  "model.norm": 1, "lm_head": 1}  # fmt: skip
    plan = nbhw.plan(folder, device_map=device_map, max_memory={0: "1GiB", 1: "1GiB"}, context=300, reserve=0)
    with quiet():
        real = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
        truth = real_generate(real, batch=1, prompt=299, new_tokens=2)
    devices = plan.run.devices  # type: ignore[union-attr]
    assert [devices[0].cache_decode_bytes, devices[1].cache_decode_bytes] == list(truth.layer_bytes)
    assert devices[0].weight_bytes + devices[1].weight_bytes == plan.estimate.total_bytes  # type: ignore[union-attr]
    # accelerate copies the hidden states and position embeddings to device 1 for its layer: the split run's peak
    # is the one-device run's plus those copies.
    one = nbhw.plan(folder, device_map=0, max_memory={0: "1GiB"}, context=300, reserve=0)
    assert plan.run.peak_bytes > one.run.peak_bytes  # type: ignore[union-attr]
    shares = {s.key: s for s in plan.placement.devices}  # type: ignore[union-attr]
    assert shares[1].cache_bytes == devices[1].held_cache_bytes and shares[1].activation_bytes is not None


def test_offloaded_layers_run_on_the_first_accelerator(tmp_path: Path) -> None:
    folder = config_only(families.llama(), tmp_path, "LlamaForCausalLM")
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.layers.1": "cpu",
                  "model.norm": "cpu", "lm_head": "cpu"}  # fmt: skip
    plan = nbhw.plan(folder, device_map=device_map, max_memory={0: "1GiB", "cpu": "1GiB"}, context=300)
    devices = plan.run.devices  # type: ignore[union-attr]
    # every cache layer on device 0, where accelerate runs the CPU-held layers; the CPU holds weights only
    assert devices["cpu"].cache_bytes == 0 and devices["cpu"].peak_bytes == devices["cpu"].weight_bytes
    assert devices[0].cache_decode_bytes == plan.estimate.cache_decode_bytes  # type: ignore[union-attr]
    assert "offloads" in plan.placement.verdict  # type: ignore[union-attr]


def test_a_loop_over_tokens_is_reported_not_run_for_minutes(tmp_path: Path) -> None:
    folder = config_only(families.mamba(), tmp_path, "MambaForCausalLM")
    plan = nbhw.plan(folder, context="20k", device_map="cpu")
    assert plan.estimate is not None and plan.estimate.cache_bytes is None
    assert "runs a Python loop over tokens or chunks" in (plan.estimate.run_problem or "")
    assert "the run is not covered" in plan.placement.verdict  # type: ignore[union-attr]
    assert "not covered: " in plan.text()


def test_qwen2_vl_images_are_not_covered_and_the_error_says_where() -> None:
    model = meta(families.qwen2_vl, auto="AutoModelForImageTextToText")
    with pytest.raises(run_figures.DryRunError, match="the multimodal encoder failed on the meta device"):
        run.run_estimate(model, batch=1, context=100, target="cpu",
                         inputs={"pixel_values": (16, 1176), "image_grid_thw": ((1, 3), torch.long)})  # fmt: skip


# ---------------------------------------------------------------- kernels and searches


def test_meta_sdpa_is_sized_as_the_targets_kernel() -> None:
    model = meta(families.llama)
    math = run.run_estimate(model, batch=1, context=1000, target="math")
    cpu = run.run_estimate(model, batch=1, context=1000, target="cpu")
    assert cpu.kernels == {"cpu_flash": 4} and cpu.logits_to_keep == 1
    assert math.activation_bytes > 5 * cpu.activation_bytes  # scores B x H x T x T exist only on the math path
    # CUDA: bfloat16 GQA without a mask goes to flash; float32 GQA can't (flash needs 16-bit, memory-efficient
    # needs equal head counts), so torch falls back to math there and the scores are materialised.
    assert run.run_estimate(model, batch=1, context=1000, target="cuda").kernels == {"math": 4}
    assert run.run_estimate(meta(families.llama, "bfloat16"), batch=1, context=1000).kernels == {"cuda_flash": 4}
    sliding = meta(families.mistral, "bfloat16")  # a mask: transformers repeats K/V, no enable_gqa
    assert run.run_estimate(sliding, batch=1, context=1000).kernels == {"cuda_efficient": 4}


@pytest.mark.parametrize("make", [families.llama, families.mistral, families.gemma3, families.qwen3_next])
def test_max_context_is_the_exact_boundary(make: Any) -> None:
    model = meta(make)
    budget = run.run_estimate(model, batch=2, context=300, target="cpu").peak_bytes + 50_000
    fit = run_search.max_context(model, {"cpu": budget}, batch=2, target="cpu", start=256)
    below = run.run_estimate(model, batch=2, context=fit.value, target="cpu").peak_bytes
    above = run.run_estimate(model, batch=2, context=fit.value + 1, target="cpu").peak_bytes
    assert below <= budget < above
    # A model whose op sequence grows with the context (Qwen3-Next's chunked delta rule) can't use the timeline fit.
    assert fit.dry_runs <= (5 if fit.method.startswith("timeline") else 8), fit


def test_max_batch_is_the_exact_boundary() -> None:
    model = meta(families.mixtral)
    fit = run_search.max_batch(model, {"cpu": 6_000_000}, context=200, target="cpu")
    assert fit.value >= 1 and fit.dry_runs <= 4
    assert run.run_estimate(model, batch=fit.value, context=200, target="cpu").peak_bytes <= 6_000_000
    assert run.run_estimate(model, batch=fit.value + 1, context=200, target="cpu").peak_bytes > 6_000_000
    assert run_search.max_batch(model, {"cpu": 1000}, context=100, target="cpu").value == 0


def test_a_plan_asked_again_reuses_its_dry_runs(tmp_path: Path) -> None:
    folder = config_only(families.llama(), tmp_path, "LlamaForCausalLM")
    first = nbhw.plan(folder, context=500)
    assert first.run is not None
    again = nbhw.plan(folder, context=500)
    assert again.run is first.run  # the same model object (cached build), the same sizes: remembered


def test_in_a_kernel_a_word_the_load_tab_has_no_control_for_shows_the_report(ip: Any, monkeypatch: Any) -> None:
    """--reserve has no Load-tab control: in a kernel the line shows the plan's report instead of refusing it."""
    from nbhw import magics
    from nbhw.core.plan.load_plan import LoadPlan

    shown: list[Any] = []
    monkeypatch.setattr(magics, "in_kernel", lambda shell: True)
    monkeypatch.setattr(magics, "display", shown.append)
    ip.run_line_magic("load_ext", "nbhw")
    ip.run_line_magic("hw", "load --context 200 --reserve 600MiB --device-map cpu")
    [plan] = shown
    assert isinstance(plan, LoadPlan) and plan.args.reserve == "600MiB" and plan.context == 200
