"""The run planner against real runs, family by family: tiny random models, generate() for real on CPU.

For 18 architectures (dense GQA, MoE, sliding window, MLA, hybrid, state-space, GPT-2, encoder-only,
encoder-decoder, vision-language) at two contexts, one past every sliding window: nbhw's cache bytes equal the
bytes the real cache object holds after the prefill and after one decode step, and nbhw's peak is within 5 % of the
peak the CPU allocator saw (torch.profiler's memory events) on the real run.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

from nbhw.core.hf.meta_build import quiet
from nbhw.core.plan import run, run_parts, run_search
from tests.support import families
from tests.support.realrun import real_forward, real_generate

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

BATCH = 2
CONTEXTS = (100, 300)  # 300 is past every sliding window below (32 and 64)
PEAK_TOLERANCE = 0.05


def models(make: Any, auto: str) -> tuple[Any, Any]:
    """The meta model nbhw plans with (dtype plan applied) and a real random-weight model of the same config."""
    config = make()
    torch.manual_seed(0)
    with quiet():
        real = getattr(transformers, auto).from_config(config, dtype=torch.float32).eval()
    meta = run_parts.build(config, dtype="float32", auto_name=auto, attn_implementation=None).model
    return meta, real


GENERATIVE = [f for f in families.FAMILIES if f[0] != "bert"]


@pytest.mark.parametrize(("name", "make", "auto"), GENERATIVE, ids=[f[0] for f in GENERATIVE])
def test_cache_and_peak_match_a_real_generate(name: str, make: Any, auto: str) -> None:
    meta, real = models(make, auto)
    for context in CONTEXTS:
        est = run.run_estimate(meta, batch=BATCH, context=context, target="cpu")
        with quiet():
            prefill = real_generate(real, batch=BATCH, prompt=context - 1, new_tokens=1,
                                    encoder_tokens=est.encoder_tokens)  # fmt: skip
            decoded = real_generate(real, batch=BATCH, prompt=context - 1, new_tokens=2,
                                    encoder_tokens=est.encoder_tokens)  # fmt: skip
        assert est.cache_class == prefill.cache_class
        assert est.cache_bytes == prefill.cache_bytes, f"{name} @ {context}: cache after the prefill"
        assert est.cache_decode_bytes == decoded.cache_bytes, f"{name} @ {context}: cache after one decode step"
        assert est.state_bytes == prefill.state_bytes
        assert est.cross_cache_bytes == prefill.cross_bytes
        profiled = max(prefill.profiler_peak, decoded.profiler_peak)
        tracked = max(prefill.tracker_peak, decoded.tracker_peak)
        assert abs(est.peak_bytes - profiled) <= PEAK_TOLERANCE * profiled, (
            f"{name} @ {context}: dry-run peak {est.peak_bytes} vs allocator peak {profiled}"
        )
        if "math" in est.kernels:
            # The dry run replays _safe_softmax's internal buffers, which a tensor-level tracker cannot see.
            assert est.peak_bytes >= tracked
        else:
            assert abs(est.peak_bytes - tracked) <= PEAK_TOLERANCE * tracked


def test_encoder_only_model_has_no_cache_and_its_forward_peak_matches() -> None:
    meta, real = models(families.bert, "AutoModelForMaskedLM")
    for context in CONTEXTS:
        est = run.run_estimate(meta, batch=BATCH, context=context, target="cpu")
        measured = real_forward(real, batch=BATCH, tokens=context)
        assert est.cache_bytes == est.cache_decode_bytes == 0 and est.cache_class == "none"
        assert abs(est.peak_bytes - measured.profiler_peak) <= PEAK_TOLERANCE * measured.profiler_peak
        assert "does not generate" in est.not_covered[0]


def test_llava_with_an_image_matches_a_real_generate() -> None:
    """The context counts every token the language model sees, the image's placeholder tokens included."""
    from nbhw.core.hf.dryrun import storage_bytes
    from tests.support.realrun import profiled_peak

    config = families.llava()
    meta, real = models(families.llava, "AutoModelForImageTextToText")
    est = run.run_estimate(meta, batch=2, context=100, target="cpu", inputs={"pixel_values": (2, 3, 28, 28)})
    ids = torch.randint(3, 50, (2, 99))
    ids[:, 1:5] = config.image_token_id  # (28 / 14)^2 patches, CLS dropped: 4 image tokens
    pixels = torch.randn(2, 3, 28, 28)
    options = {"input_ids": ids, "pixel_values": pixels, "do_sample": False}
    for new_tokens, expected in ((1, est.cache_bytes), (2, est.cache_decode_bytes)):
        with quiet():
            out = real.generate(**options, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                return_dict_in_generate=True)  # fmt: skip
        assert run_parts.cache_parts(out.get("cache"))[0] == expected
        with (
            quiet(),
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof,
        ):
            real.generate(**options, max_new_tokens=new_tokens)
        measured = storage_bytes([*real.parameters(), *real.buffers(), ids, pixels]) + profiled_peak(
            prof.profiler.kineto_results.events()
        )
        assert abs(est.peak_bytes - measured) <= PEAK_TOLERANCE * measured


def test_static_cache_matches_generate_with_cache_implementation_static() -> None:
    meta, real = models(families.llama, "AutoModelForCausalLM")
    options = {"cache_implementation": "static"}
    est = run.run_estimate(meta, batch=1, context=120, target="cpu", generation=options)
    with quiet():
        truth = real_generate(real, batch=1, prompt=119, new_tokens=2, generation=options)
    assert est.cache_class == "StaticCache" and est.cache_decode_bytes == truth.cache_bytes
    assert est.cache_bytes == est.cache_decode_bytes  # allocated once, at its full length


def test_max_context_agrees_with_a_real_run_at_the_boundary() -> None:
    meta, real = models(families.llama, "AutoModelForCausalLM")
    budget = 2_000_000
    fit = run_search.max_context(meta, {"cpu": budget}, batch=2, target="cpu", start=200)
    with quiet():
        real_peak = max(real_generate(real, batch=2, prompt=fit.value - 1, new_tokens=n).profiler_peak for n in (1, 2))
        over = max(real_generate(real, batch=2, prompt=fit.value + 20, new_tokens=n).profiler_peak for n in (1, 2))
    assert real_peak <= budget * 1.001
    assert over > budget
