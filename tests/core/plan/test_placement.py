"""Placement: the device_map nbhw shows is the one transformers computes for the same inputs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, LlamaConfig
from transformers import modeling_utils as hf_modeling

import nbhw
from nbhw.core import render
from nbhw.core.hf import meta_build
from nbhw.core.hf.tiny_model import tiny_model_path
from nbhw.core.plan import placement
from tests.support import families, published
from tests.support.fakes import GIB, FakeGpu, FakeHardware
from tests.support.models import config_only

BUDGETS: list[dict[Any, str]] = [
    {0: "150KB", 1: "150KB", "cpu": "1GB"},
    {0: "300KB", 1: "300KB", "cpu": "1GB"},
    {0: "400KB", 1: "400KB"},
    {0: "250KB", 1: "250KB", 2: "250KB"},
    {0: "1GB"},
    {0: "100KB", 1: "100KB", 2: "100KB", 3: "100KB", "cpu": "1GB"},
    {"cpu": "200KB", "disk": "1GB"},
    {0: "100KB", "cpu": "150KB", "disk": "1GB"},
    {0: "80GiB", 1: "80GiB", "cpu": "200GiB"},
]


def transformers_device_map(
    monkeypatch: pytest.MonkeyPatch, model: str | None = None, auto: Any = AutoModelForCausalLM, **kwargs: Any
) -> dict[str, Any]:
    """What from_pretrained itself computes (it may then fail to dispatch to GPUs this machine lacks)."""
    seen: list[dict[str, Any]] = []
    real = hf_modeling._get_device_map

    def spy(*args: Any, **kw: Any) -> Any:
        result = real(*args, **kw)
        seen.append(dict(result))
        return result

    monkeypatch.setattr(hf_modeling, "_get_device_map", spy)
    failure = ""
    try:
        with meta_build.quiet():
            auto.from_pretrained(model or str(tiny_model_path()), **kwargs)
    except RuntimeError as exc:
        failure = str(exc)
    monkeypatch.undo()
    assert failure in {"", "Cannot access accelerator device when none is available."}  # GPUs that are not here
    assert len(seen) == 1
    return seen[0]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["auto", "balanced", "balanced_low_0", "sequential"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hypothetical_max_memory_gives_transformers_own_device_map(
    monkeypatch: pytest.MonkeyPatch, strategy: str, dtype: str
) -> None:
    for budget in BUDGETS:
        theirs = transformers_device_map(
            monkeypatch, device_map=strategy, dtype=dtype, max_memory=copy.deepcopy(budget)
        )
        plan = nbhw.plan(device_map=strategy, dtype=dtype, max_memory=budget)
        assert plan.placement is not None
        assert plan.placement.device_map == theirs, budget


def test_live_placement_here_is_transformers_own(monkeypatch: pytest.MonkeyPatch) -> None:
    theirs = transformers_device_map(monkeypatch, device_map="auto")
    plan = nbhw.plan(device_map="auto")
    assert plan.placement is not None and plan.placement.device_map == theirs == {"": "cpu"}
    assert plan.placement.verdict == "fits on one device (cpu)" and plan.placement.kind == "one_device"


@pytest.mark.parametrize(
    ("budget", "kind", "words"),
    [
        ({0: "1GB"}, "one_device", "fits on one device (accelerator 0)"),
        ({0: "400KB", 1: "400KB"}, "split", "split across 2 devices (accelerator 0, accelerator 1)"),
        ({0: "150KB", 1: "150KB", "cpu": "1GB"}, "cpu_offload", "offloads 2 of 2 layers to CPU (slow)"),
        ({"cpu": "200KB", "disk": "1GB"}, "disk", "needs disk"),
    ],
)
def test_verdicts_say_what_the_map_means(budget: dict[Any, str], kind: str, words: str) -> None:
    result = nbhw.plan(max_memory=budget).placement
    assert result is not None and result.kind == kind and words in result.verdict, result.verdict
    values = set(result.device_map.values())
    assert (kind == "split") == (len(values) > 1 and all(isinstance(v, int) for v in values))


def llama3_70b_folder(tmp_path: Path) -> tuple[str, LlamaConfig]:
    config = LlamaConfig(
        vocab_size=128256,
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        tie_word_embeddings=False,
    )
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = "bfloat16"
    config.save_pretrained(tmp_path)
    return str(tmp_path), config


def independent_device_map(config: LlamaConfig, max_memory: dict[Any, Any] | None) -> dict[str, Any]:
    from transformers.integrations.accelerate import _get_device_map

    with torch.device("meta"), meta_build.quiet():
        model = AutoModelForCausalLM.from_config(copy.deepcopy(config), dtype=torch.bfloat16)
    with meta_build.quiet():
        return dict(_get_device_map(model, "auto", copy.deepcopy(max_memory), None))


def test_planning_for_hardware_this_machine_lacks(tmp_path: Path) -> None:
    folder, config = llama3_70b_folder(tmp_path)
    budget = {0: "80GiB", 1: "80GiB", "cpu": "200GiB"}
    plan = nbhw.plan(folder, max_memory=budget)
    assert plan.placement is not None and plan.estimate is not None
    assert plan.placement.device_map == independent_device_map(config, budget)
    assert plan.placement.verdict.startswith("split across 2 devices")
    assert plan.placement.budget_source == "the max_memory you gave"
    # Here (no GPU) from_pretrained would fail, so the dry run says so; the plan is still for the named hardware.
    assert any("not here" in p or "sees none" in p for p in plan.check())


def test_live_budget_comes_from_nvml_without_touching_cuda(fake_hw: FakeHardware, tmp_path: Path) -> None:
    fake_hw.nvidia(FakeGpu(total=80 * GIB, used=2 * GIB), FakeGpu(total=80 * GIB, used=10 * GIB))
    folder, config = llama3_70b_folder(tmp_path)
    plan = nbhw.plan(folder)
    live = plan.placed.live
    assert live.accelerator == "cuda" and live.max_memory[0] == 78 * GIB and live.max_memory[1] == 70 * GIB
    assert plan.placement is not None
    # transformers' own logic, given the same free memory accelerate would have read (minus its 10% CPU margin).
    with placement._budget(live):
        assert plan.placement.device_map == independent_device_map(config, None)
    names = [d.device for d in plan.placement.devices]
    assert names[:2] == ["cuda:0", "cuda:1"] and plan.placement.kind in {"split", "cpu_offload"}
    assert plan.check() == []
    assert not torch.cuda.is_initialized()


def test_an_explicit_device_too_small_for_the_weights_is_a_problem(fake_hw: FakeHardware, tmp_path: Path) -> None:
    fake_hw.nvidia(FakeGpu(total=80 * GIB, used=2 * GIB))
    folder, _ = llama3_70b_folder(tmp_path)
    plan = nbhw.plan(folder, device_map="cuda:0")
    assert plan.placement is not None and plan.placement.kind == "too_big"
    assert plan.placement.verdict == "does not fit: cuda:0 needs 131.4 GiB for the weights, 78.0 GiB free"
    assert plan.check() == ["cuda:0 needs 131.4 GiB for the weights, 78.0 GiB free: loading would run out of memory"]


T5_BUDGET: dict[Any, str] = {0: "320KB", "cpu": "1GB"}  # the tiny T5 fits in float16, not with wo in float32


@pytest.fixture(scope="module")
def t5_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny T5 checkpoint: in float16 from_pretrained keeps every `wo` in float32 (its dtype plan)."""
    folder = tmp_path_factory.mktemp("t5")
    torch.manual_seed(0)
    with meta_build.quiet():
        AutoModelForSeq2SeqLM.from_config(families.t5_unequal()).save_pretrained(folder)
    return str(folder)


def test_a_model_with_a_dtype_plan_is_mapped_as_transformers_maps_it(
    monkeypatch: pytest.MonkeyPatch, t5_folder: str
) -> None:
    theirs = transformers_device_map(
        monkeypatch, t5_folder, AutoModelForSeq2SeqLM, device_map="auto", dtype=torch.float16,
        max_memory=copy.deepcopy(T5_BUDGET),
    )  # fmt: skip
    plan = nbhw.plan(t5_folder, dtype="float16", device_map="auto", max_memory=T5_BUDGET)
    shown = plan.weight_placement
    assert shown is not None and shown.device_map == theirs == {"": 0}
    # The weights as they load, wo in float32, where transformers put them: over GPU 0's budget, and why.
    with meta_build.quiet():
        loaded = AutoModelForSeq2SeqLM.from_pretrained(t5_folder, dtype=torch.float16)
    real = sum(t.nbytes for t in [*loaded.parameters(), *loaded.buffers()])
    assert [(d.device, d.bytes) for d in shown.devices] == [("accelerator 0", real)]
    assert shown.kind == "too_big" and shown.verdict.startswith("does not fit: accelerator 0 needs ")
    more = real - sum(p.numel() * 2 for p in loaded.parameters()) - sum(b.nbytes for b in loaded.buffers())
    assert more > 0 and shown.notes == [
        f"transformers maps before keeping wo in float32; accelerator 0 gets {render.size(more)} more than the map "
        "assumed"
    ]
    assert plan.placement is not None and plan.placement.device_map == theirs


def test_t5_11b_in_float16_on_24_gib_is_all_on_the_gpu_and_over_its_budget(tmp_path: Path) -> None:
    """Not "offloads 6 of 48 layers": transformers sizes every wo in float16 when it maps, so all 27 GiB go to GPU 0."""
    budget: dict[Any, str] = {0: "24GiB", "cpu": "200GiB"}
    plan = nbhw.plan(published.folder("T5-11B", tmp_path), dtype="float16", device_map="auto", max_memory=budget)
    shown = plan.weight_placement
    from transformers.integrations.accelerate import _get_device_map

    with torch.device("meta"), meta_build.quiet():
        model = AutoModelForSeq2SeqLM.from_config(published.config("T5-11B"), dtype=torch.float16)
        theirs = dict(_get_device_map(model, "auto", copy.deepcopy(budget), None))
    assert shown is not None and shown.device_map == theirs == {"": 0}
    assert shown.verdict == "does not fit: accelerator 0 needs 27.1 GiB for the weights, 24.0 GiB free"
    assert shown.notes == [
        "transformers maps before keeping wo in float32; accelerator 0 gets 6.0 GiB more than the map assumed"
    ]


def test_a_device_its_weights_and_reserve_fill_is_refused_without_a_dry_run(
    fake_hw: FakeHardware, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's peak holds its weights: where the placed weights and the framework's reserve are over a device's
    memory, "does the run fit" and the longest context / largest batch are answered without a dry run, and the
    dry run the verdict makes agrees."""
    from nbhw.core.plan import run_plan

    folder = config_only(families.llama(), tmp_path / "llama", "LlamaForCausalLM")
    weights = nbhw.plan(folder, dtype="float32").weight_estimate.total_bytes
    fake_hw.nvidia(FakeGpu(total=weights + 64 * 2**20, used=0))  # the weights and 64 MiB: less than CUDA's reserve
    plan = nbhw.plan(folder, dtype="float32", device_map="cuda:0")
    assert plan.weight_placement is not None and plan.weight_placement.kind == "one_device"
    runs: list[int] = []
    estimate = run_plan.run.run_estimate
    monkeypatch.setattr(run_plan.run, "run_estimate", lambda *a, **k: runs.append(1) or estimate(*a, **k))
    assert plan.run_fits is False and plan.max_context == 0 and plan.max_batch == 0
    assert plan.context_fit is not None and plan.context_fit.dry_runs == 0 and runs == []
    assert plan.placement is not None and plan.placement.run_kind == "does_not_fit" and runs == [1]


def test_max_memory_places_the_weights_and_budget_is_what_the_run_may_use(tmp_path: Path) -> None:
    """from_pretrained fills max_memory with weights and the run then uses the whole device: with ``budget`` the
    same placement is checked against the device's memory, not the weights' bound."""
    config = LlamaConfig(**{**families.COMMON, "num_hidden_layers": 8, "hidden_size": 256, "intermediate_size": 1024,
                            "num_attention_heads": 4, "num_key_value_heads": 2}, head_dim=64)  # fmt: skip
    folder = config_only(config, tmp_path / "llama", "LlamaForCausalLM")
    run = {"context": 512, "reserve": 0, "attn_implementation": "sdpa", "use_kernels": False, "dtype": "float32"}
    whole = nbhw.plan(folder, device_map=0, max_memory={0: 2**40}, **run)
    with meta_build.quiet():
        need = int(whole.placement.devices[0].needed_bytes)  # type: ignore[union-attr]
    device, cpu = int(0.95 * need), 10 * need
    bound = {0: int(0.5 * device), "cpu": cpu}
    alone = nbhw.plan(folder, max_memory=bound, **run)
    given = nbhw.plan(folder, max_memory=bound, budget={0: device}, **run)
    with meta_build.quiet():
        assert alone.weight_placement is not None and alone.weight_placement.kind == "cpu_offload"
        # the weights fill their bound: no room for the run there
        assert alone.run_fits is False and alone.placement is not None and alone.placement.run_kind != "fits"
        # the same device_map, its run on the whole device: it fits, and the table shows the device's memory
        assert (
            given.weight_placement is not None
            and given.weight_placement.device_map == alone.weight_placement.device_map
        )
        assert given.run_fits is True and given.placement is not None and given.placement.run_kind in ("fits", "tight")
        on_device = next(s for s in given.placement.devices if s.key == 0)
        assert on_device.budget == device and on_device.headroom_bytes is not None and on_device.headroom_bytes > 0
    assert given.code == alone.code and str(bound[0]) in given.code and str(device) not in given.code
    assert f"the run is checked against the device's budget 0={device}" in given.text()


def test_module_sizes_are_transformers_own_and_computed_once_per_model_and_sizing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A placement sizes the model in transformers three times and a search places it under many budgets: the sizes
    are transformers' own, computed once per meta model and sizing, and handed out as copies."""
    from transformers.integrations import accelerate as hf_accelerate

    from nbhw.core.hf import module_sizes

    folder = config_only(families.llama(), tmp_path / "llama", "LlamaForCausalLM")
    plan = nbhw.plan(folder, quantization="quanto", max_memory={0: "1GB"}, device_map="auto")
    model, quantizer = plan.meta_model, plan.quantizer
    assert model is not None and quantizer is not None
    for flags in ({}, {"only_modules": False}, {"buffers_only": True}):
        for sizer in (None, quantizer):
            assert module_sizes.module_sizes(model, sizer, **flags) == hf_accelerate.compute_module_sizes(
                model, sizer, **flags
            )
    handed, _ = module_sizes.module_sizes(model, quantizer)
    handed[""] = -1  # a copy: the next caller gets transformers' figure
    assert (
        module_sizes.module_sizes(model, quantizer)[0][""]
        == hf_accelerate.compute_module_sizes(model, quantizer)[0][""]
    )

    calls: list[tuple[bool, ...]] = []
    real = module_sizes._compute()
    monkeypatch.setattr(
        module_sizes,
        "_original",
        [
            lambda m, q, **kw: (
                calls.append((q is None, *kw.values(), id(m), module_sizes._sizing(q))) or real(m, q, **kw)
            )
        ],
    )
    monkeypatch.setattr(module_sizes, "_KEPT", type(module_sizes._KEPT)())
    for strategy in ("auto", "balanced", "sequential"):
        for budget in ("2MB", "3MB", "5MB"):
            placed = nbhw.plan(folder, quantization="quanto", max_memory={0: budget, "cpu": "1GB"}, device_map=strategy)
            assert placed.weight_placement is not None and placed.weight_placement.kind != "none"
    # once per sizing and flags (9 placements: 9 x 3 sizings in transformers and 9 in nbhw's shares before)
    assert len(calls) == len(set(calls)) <= 4, calls
