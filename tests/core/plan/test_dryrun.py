"""The dry run against the real thing: emitted cells load and generate, and the dry run refuses exactly what
transformers refuses (from_pretrained is called for real on nbhw's tiny model, on this CPU machine)."""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

import nbhw
from nbhw.core.errors import UserError
from nbhw.core.hf import meta_build
from nbhw.core.hf.tiny_model import tiny_model_path

CPU_MAPS: list[Any] = ["cpu", "auto", "sequential", {"": "cpu"}]
DTYPES = ["float32", "bfloat16"]


def _attentions() -> list[str]:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return [a for a in ("eager", "sdpa", "flex_attention") if a == "eager" or a in ALL_ATTENTION_FUNCTIONS.valid_keys()]


def run_cell(code: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    with contextlib.redirect_stdout(io.StringIO()) as out, meta_build.quiet():
        exec(compile(code, "<nbhw cell>", "exec"), namespace)
    namespace["printed"] = out.getvalue()
    return namespace


@pytest.mark.slow
@pytest.mark.parametrize(("device_map", "dtype", "attn"), list(itertools.product(CPU_MAPS, DTYPES, _attentions())))
def test_emitted_cell_loads_and_generates_for_every_cpu_combination(device_map: Any, dtype: str, attn: str) -> None:
    plan = nbhw.plan(device_map=device_map, dtype=dtype, attn_implementation=attn)
    assert plan.check() == [], plan.check()
    ns = run_cell(plan.code)
    model = ns["model"]
    assert model.dtype == getattr(torch, dtype)
    assert model.config._attn_implementation == attn
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert ns["outputs"].shape[1] > ns["inputs"]["input_ids"].shape[1]
    assert ns["printed"].strip()


# Valid and invalid on this CPU-only machine: devices it lacks, attention it can't run, packages it lacks.
MAPS: list[Any] = ["cpu", "auto", "balanced_low_0", {"": "cpu"}, "meta", "cuda", "cuda:1", 0, "mps", "xpu", "npu", -1]
ATTNS = [
    "eager",
    "sdpa",
    "flex_attention",
    "flash_attention_2",
    "flash_attention_3",
    "kernels-community/flash-attn2",
    "bogus",
]
EXTRAS: list[dict[str, Any]] = [
    {},
    {"quantization": "4bit"},
    {"use_kernels": True},
    {"max_memory": {0: "1GiB", "cpu": "1GiB"}},
]


def _cases() -> list[tuple[Any, str, str, dict[str, Any]]]:
    cases = [(m, "float32", a, {}) for m in MAPS for a in ATTNS]
    cases += [(m, "bfloat16", "sdpa", {}) for m in ("cpu", "auto", "cuda:0")]
    cases += [("auto", "float32", "sdpa", extra) for extra in EXTRAS[1:]]
    cases += [("cpu", "float32", "eager", extra) for extra in EXTRAS[1:]]
    return cases


def transformers_accepts(device_map: Any, dtype: str, attn: str, extra: dict[str, Any]) -> bool:
    kwargs = copy.deepcopy(extra)  # accelerate converts max_memory sizes in place
    if "quantization" in kwargs:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=kwargs.pop("quantization") == "4bit")
    try:
        with meta_build.quiet():
            AutoModelForCausalLM.from_pretrained(
                str(tiny_model_path()), device_map=device_map, dtype=dtype, attn_implementation=attn, **kwargs
            )
    except Exception:
        return False
    return True


def nbhw_accepts(device_map: Any, dtype: str, attn: str, extra: dict[str, Any]) -> tuple[bool, list[str]]:
    try:
        plan = nbhw.plan(device_map=device_map, dtype=dtype, attn_implementation=attn, **extra)
    except UserError as exc:
        return False, [str(exc)]
    problems = plan.check()
    return not problems, problems


@pytest.mark.slow
def test_dry_run_refuses_exactly_what_transformers_refuses() -> None:
    hf_logging.set_verbosity_error()
    disagreements = []
    for case in _cases():
        theirs = transformers_accepts(*case)
        ours, why = nbhw_accepts(*case)
        if theirs != ours:
            disagreements.append((case, theirs, why))
    assert not disagreements, disagreements
    # Every refusal is one line that names what was wrong.
    _, problems = nbhw_accepts("cuda:1", "float32", "flash_attention_2", {})
    assert all("\n" not in p for p in problems) and any("cuda:1" in p and "not here" in p for p in problems)
    # cuda:1 is not here: a GPU nbhw can't see, so whether FA2 runs on it depends on which GPU it is (sdpa is
    # advised); without the kernels package FA2's own package check refuses it first.
    said = "nbhw advises sdpa" if meta_build.kernels_status()[0] else "FlashAttention2"
    assert len(problems) == 2 and any(said in p for p in problems), problems


def test_an_uncached_hub_model_offline_is_one_problem_and_still_valid_code(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("nbhw tried the network")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", no_network)
    plan = nbhw.plan("nobody/not-cached-anywhere", dtype="bfloat16", offline=True)
    assert len(plan.check()) == 1 and "not available offline" in plan.check()[0]
    assert plan.estimate is None and plan.placement is None
    assert "AutoModelForCausalLM.from_pretrained(" in plan.code and any("assumes a causal LM" in n for n in plan.notes)


def test_attention_that_would_download_a_kernel_is_not_built(monkeypatch: pytest.MonkeyPatch) -> None:
    # kernels "installed and in range" while flash-attn is not: transformers would fetch kernels-community/flash-attn2.
    monkeypatch.setattr(meta_build, "kernels_status", lambda: (True, "faked"))
    built: list[Any] = []
    real_build = meta_build.build
    monkeypatch.setattr(meta_build, "build", lambda *a, **k: built.append(k) or real_build(*a, **k))
    from nbhw.core.plan import stages as plan_module

    plan_module.clear_cache()
    plan = nbhw.plan(attn_implementation="flash_attention_2")
    # Not built, and not "[]" either: check() gives the attention advice's answer for the CPU, as nbhw.attention()
    # does (the Hub kernel has no CPU build); once it said [] while from_pretrained raised.
    problems = plan.check()
    assert not any("needs a Hub kernel download" in n for n in plan.notes)
    assert plan.estimate is not None and all(k.get("attn_implementation") is None for k in built)
    row = nbhw.attention(device="cpu").row("flash_attention_2")
    assert len(problems) == 1 and row.reason in problems[0] and "kernels-community/flash-attn2" in problems[0]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"device_map": "bogus"}, ["auto", "balanced_low_0", "sequential"]),
        ({"device_map": -1}, ["negative"]),
        ({"device_map": "disk"}, ["dict"]),
        ({"dtype": "int8"}, ["float32", "bfloat16"]),
        ({"dtype": "float99"}, ["auto", "bfloat16"]),
        ({"quantization": "2bit"}, ["4bit", "8bit"]),
        ({"attn_implementation": "bogus"}, ["eager", "sdpa", "flash_attention_2"]),
        ({"max_memory": {"cuda:0": "1GiB"}}, ["cpu", "disk", "mps"]),
        ({"max_memory": {0: "80GB!"}}, ["70GiB"]),
        ({"max_memory": {0: "80"}}, ["GiB"]),
        ({"max_memory": {0: "infGB"}}, ["GiB"]),
        ({"max_memory": {-1: "1GiB"}}, ["negative"]),
    ],
)
def test_mistakes_are_one_line_user_errors_naming_the_valid_values(kwargs: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(UserError) as err:
        nbhw.plan(**kwargs)
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_a_device_that_is_well_formed_but_absent_is_a_problem_not_a_mistake() -> None:
    plan = nbhw.plan(device_map="cuda:3")
    assert any("cuda:3" in p for p in plan.check())


def test_a_pre_quantized_checkpoint_is_checked_like_transformers_does(tmp_path: Path) -> None:
    import json
    import shutil

    folder = tmp_path / "prequantized"
    shutil.copytree(tiny_model_path(), folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (folder / "config.json").write_text(json.dumps(config))
    try:
        with meta_build.quiet():
            AutoModelForCausalLM.from_pretrained(str(folder))
        refused = None
    except ImportError as exc:  # bitsandbytes is not installed
        refused = exc
    problems = nbhw.plan(str(folder)).check()
    if refused is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].startswith("this pre-quantized checkpoint: ImportError")
