"""Batches as they really come (issue 30): left-padded prompts and the tokenizer's attention_mask, planned and run.

A tokenizer pads a batch for generate() on the left; with zeros in the attention_mask transformers can no longer
leave the mask to SDPA's is_causal and builds a batch x 1 x prompt x context mask. The plan's ``padding`` (default
"left") runs transformers' own mask code on a mask that carries its values on the meta device; "none" is a batch of
prompts of one length. Either way the caller's input_ids and attention_mask are held for the whole run. Every figure
here is checked against a real generate() on the CPU, measured at tensor level (tests/support/realrun.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from IPython.core.error import UsageError

import nbhw
from nbhw.__main__ import main
from nbhw.core.hf.meta_build import quiet
from nbhw.core.hf.tiny_model import tiny_model_path
from nbhw.core.plan import run, run_parts, run_search
from tests.support import families
from tests.support.realrun import real_generate

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BUDGET = 64 * 2**20  # a tight budget, as the max_context tests use
GENERATED = (1, 2)  # the prefill alone, then the prefill and one decode step: the run's two peaks
# generate()'s own small tensors the dry run mirrors (special tokens, unfinished_sequences) may differ by a scalar
SCALARS = 16


def models(make: Any) -> tuple[Any, Any]:
    """The meta model nbhw plans with and a real random-weight model of the same config."""
    torch.manual_seed(0)
    with quiet():
        real = transformers.AutoModelForCausalLM.from_config(make(), dtype=torch.float32).eval()
    meta = run_parts.build(make(), dtype="float32", auto_name="AutoModelForCausalLM", attn_implementation=None).model
    return meta, real


def tokenized(batch: int, prompt: int, padding: str) -> dict[str, Any]:
    """A tokenizer's batch for generate(): token ids and the attention_mask, padded as ``padding`` says."""
    mask = run_parts.attention_mask(batch, prompt, padding)
    ids = torch.randint(3, 50, (batch, prompt)).masked_fill(mask == 0, 0)
    return {"input_ids": ids, "attention_mask": mask}


def real_peak(model: Any, inputs: dict[str, Any]) -> int:
    """The real run's tensor-level peak (weights, the caller's inputs and all generate() allocates)."""
    batch, prompt = inputs["input_ids"].shape
    with quiet():
        runs = [real_generate(model, batch=batch, prompt=prompt, new_tokens=n, inputs=inputs, profiled=False)
                for n in GENERATED]  # fmt: skip
    return max(r.tracker_peak for r in runs)


# ---------------------------------------------------------------- the plan against real runs


def test_a_left_padded_batch_from_the_tokenizer_is_planned_at_its_real_peak() -> None:
    path = tiny_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, padding_side="left")
    prompts = ["the model runs on the device with memory and attention; " * n for n in (6, 4, 2, 1)]
    inputs = dict(tokenizer(prompts, return_tensors="pt", padding=True))
    batch, prompt = inputs["input_ids"].shape
    assert (inputs["attention_mask"][1:, 0] == 0).all()  # every prompt but the longest is padded on the left
    plan = nbhw.plan(str(path), device_map="cpu", batch=batch, context=prompt + 1)
    unpadded = nbhw.plan(str(path), device_map="cpu", batch=batch, context=prompt + 1, padding="none")
    with quiet():
        model = transformers.AutoModelForCausalLM.from_pretrained(path, device_map="cpu").eval()
    truth = real_peak(model, inputs)
    assert plan.args.padding == "left" and plan.run is not None and unpadded.run is not None
    assert truth <= plan.run.peak_bytes <= truth + SCALARS
    # What a plan of unpadded prompts (nbhw's only plan before) leaves out: at least the 4-D boolean mask.
    assert unpadded.run.peak_bytes + batch * (prompt - 1) ** 2 <= truth


@pytest.mark.parametrize("make", [families.llama, families.gemma3])
def test_left_and_unpadded_batches_match_their_real_runs(make: Any) -> None:
    meta, real = models(make)
    for padding in ("left", "none"):
        est = run.run_estimate(meta, batch=4, context=120, target="cpu", padding=padding)
        truth = real_peak(real, tokenized(4, 119, padding))
        assert truth - SCALARS <= est.peak_bytes <= truth + SCALARS, (padding, est.peak_bytes, truth)
    # Unpadded real runs without a mask (generate() makes and drops its own) stay under the plan by the mask.
    unpadded = run.run_estimate(meta, batch=4, context=120, target="cpu", padding="none")
    with quiet():
        bare = max(
            real_generate(real, batch=4, prompt=119, new_tokens=n, profiled=False).tracker_peak for n in GENERATED
        )
    assert bare <= unpadded.peak_bytes <= bare + 4 * 119 * 8 + SCALARS


def test_at_batch_1_there_is_nothing_to_pad() -> None:
    meta, _ = models(families.llama)
    left, none = (run.run_estimate(meta, batch=1, context=200, target="cpu", padding=p) for p in ("left", "none"))
    assert left.peak_bytes == none.peak_bytes and left.cache_decode_bytes == none.cache_decode_bytes


@pytest.mark.parametrize("padding", ["left", "none"])
def test_a_real_run_at_the_largest_context_fits_a_tight_budget(padding: str) -> None:
    """The boundary holds for a tokenizer's batch: its attention_mask (held by the caller) and, padded, the 4-D mask."""
    meta, real = models(families.llama)
    batch = 16
    fit = run_search.max_context(meta, {"cpu": BUDGET}, batch=batch, target="cpu", start=512, padding=padding)
    assert 2 < fit.value < fit.limit, fit
    assert real_peak(real, tokenized(batch, fit.value - 1, padding)) <= BUDGET
    assert real_peak(real, tokenized(batch, fit.value, padding)) > BUDGET  # one token more does not fit


def test_the_largest_batch_counts_the_padding() -> None:
    meta, _ = models(families.llama)
    budget = 12_000_000
    left = run_search.max_batch(meta, {"cpu": budget}, context=300, target="cpu", padding="left")
    none = run_search.max_batch(meta, {"cpu": budget}, context=300, target="cpu", padding="none")
    assert 1 <= left.value < none.value
    at = run.run_estimate(meta, batch=left.value, context=300, target="cpu", padding="left")
    above = run.run_estimate(meta, batch=left.value + 1, context=300, target="cpu", padding="left")
    assert at.peak_bytes <= budget < above.peak_bytes


# ---------------------------------------------------------------- the plan says its assumption


def test_the_plan_says_how_the_batch_is_padded(tmp_path: Path) -> None:
    config = families.llama()
    config.architectures, config.dtype = ["LlamaForCausalLM"], "float32"
    config.save_pretrained(tmp_path)
    tight = {"device_map": "cpu", "max_memory": {"cpu": "8MiB"}, "reserve": 0, "context": 300, "batch": 4}
    padded = nbhw.plan(str(tmp_path), **tight)
    same = nbhw.plan(str(tmp_path), **tight, padding="none")
    one = nbhw.plan(str(tmp_path), device_map="cpu", context=300)
    assert "batch 4, prompts left-padded to the longest, as a tokenizer pads a batch for generate() (padding=left, " \
           "the default)" in padded.text()  # fmt: skip
    assert "batch 4, prompts all the same length, unpadded (padding=none)" in same.text()
    assert "Estimate for 300 tokens per sequence (prompt + generated), batch 1\n" in one.text()
    data = padded.to_dict()
    assert data["padding"] == "left" and data["arguments"]["padding"] == "left" and data["run"]["padding"] == "left"
    assert padded.run is not None and same.run is not None and padded.run.peak_bytes > same.run.peak_bytes
    assert padded.max_context is not None and same.max_context is not None and padded.max_context < same.max_context


def test_a_bad_padding_is_a_one_line_mistake(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(nbhw.UserError, match=r"^unknown padding 'right'; valid: left, none$"):
        nbhw.plan(padding="right")
    ip.run_line_magic("load_ext", "nbhw")
    with pytest.raises(UsageError) as err:
        ip.run_line_magic("hw", "load --padding foo")
    assert "\n" not in str(err.value) and "'foo'; valid: left, none" in str(err.value)
    assert main(["load", "--padding", "foo"]) == 2
    assert "valid: left, none" in capsys.readouterr().err
    assert main(["load", "--batch", "2", "--padding", "none", "--context", "100", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run"]["padding"] == "none"
