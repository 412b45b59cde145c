"""Training cases planned as transformers, peft and accelerate really run them: a config with a pad token, a float32
MoE under FSDP2, FSDP2 on CPU processes (accelerate trains DDP there), and FSDP2's first step (the whole model held
while it is sharded). Each is checked against real CPU runs: one step, or 2 ranks over gloo under torchrun /
``accelerate launch`` with tests/support/train_rank.py measuring each rank.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest

from nbhw.core.train import launch as L
from nbhw.core.train import strategies
from nbhw.core.train.train_plan import train_plan
from tests.support import families
from tests.support.train_realrun import real_peak, save_tiny
from tests.support.training import TOLERANCE, args_for, run_ranks

CPU_FSDP2 = {"batch": 2, "context": 32, "dtype": "float32", "device_type": "cpu", "strategy": "fsdp2", "devices": 2}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """nbhw's tiny Qwen3 with its tokenizer (the emitted script loads one)."""
    from nbhw.core.hf.tiny_model import tiny_model_path

    return tiny_model_path(tmp_path_factory.mktemp("tok") / "qwen3")


def with_tokenizer(config: Any, path: Path, tiny: Path) -> Path:
    """A random checkpoint of ``config`` beside the tiny model's tokenizer (its vocabulary sized to match)."""
    import transformers as tf

    config.vocab_size = len(tf.AutoTokenizer.from_pretrained(tiny))
    save_tiny(config, str(path))
    for name in tiny.iterdir():
        if "token" in name.name or name.name == "special_tokens_map.json":
            shutil.copy(name, path / name.name)
    return path


def write_launch(plan: Any, work: Path) -> Path:
    plan.launch.write(work)
    return work


# ------------------------------------------------------------------ a pad token in the config


def test_a_config_with_a_pad_token_plans_as_the_real_step_runs(tmp_path: Path) -> None:
    """GPT-2 with ``pad_token_id`` asks whether the ids hold padding (a ``.item()``, for a warning only, and only
    without an attention mask): the plan answers as the emitted cell's rows do, and the figure is the real step's."""
    config = families.gpt2()
    config.pad_token_id = 0
    path = save_tiny(config, str(tmp_path / "gpt2"))
    plan = train_plan(path, method="full", batch=2, context=64, dtype="float32", device_type="cpu")
    assert plan.recommended.ok, plan.verdict
    real = real_peak(path, args_for("full", False), config.vocab_size, profiler=False)
    assert plan.estimate is not None
    assert abs(plan.estimate.peak - real.tracker) <= 128, (plan.estimate.peak, real)


# ------------------------------------------------------------------ FSDP2 on CPU processes, for real


@pytest.mark.slow
def test_fsdp2_on_cpu_launches_a_run_that_really_shards_and_peaks_as_planned(tiny: Path, tmp_path: Path) -> None:
    """accelerate turns FSDP on only for accelerator types: on CPU processes Trainer(fsdp=...) and `accelerate launch`
    with an FSDP config train DDP. The plan's script shards at load with transformers' own FSDP2 instead, and both
    its launches run it: here `accelerate launch` with the emitted config, no fake. Each rank holds half the
    parameters as DTensors, and its whole run (the first step too) peaks at the plan's figure (LoRA: the loaded
    tensors the shards view are most of it)."""
    plan = train_plan(tiny, method="lora", lora_r=4, **CPU_FSDP2)
    code, ranks, err = run_ranks(write_launch(plan, tmp_path), accelerate=True)
    assert code == 0 and len(ranks) == 2, err
    assert plan.estimate is not None
    whole = 4 * plan.estimate.parameters  # float32
    for rank in ranks:
        assert rank["model"]["sharded"] > 0, rank["model"]  # DTensor parameters: FSDP2, not DDP
        assert rank["model"]["params"] < 0.55 * whole  # this rank's shards (the LoRA adapters replicated)
        print(f"fsdp2 lora on cpu: plan {plan.recommended.device_bytes:,} B, rank peak {rank['peak']:,} B")
        assert abs(plan.recommended.device_bytes - rank["peak"]) <= TOLERANCE * rank["peak"], (plan.recommended, rank)
    assert plan.launch.command.startswith("torchrun") and "DistributedConfig(fsdp_size=2)" in plan.launch.script
    assert "fsdp=True" not in plan.launch.script and "(not MULTI_CPU)" in plan.launch.notes[0]


@pytest.mark.slow
def test_a_float32_moe_under_fsdp2_plans_and_runs_as_planned(tiny: Path, tmp_path: Path) -> None:
    """grouped_mm's meta registration takes bfloat16 only; the CPU kernel (and CUDA's fallback) take float32, and a
    real 2-rank step runs: so does the plan, sized as transformers' fallback under grouped_mm's own autograd rule."""
    path = with_tokenizer(families.mixtral(), tmp_path / "mixtral", tiny)
    plan = train_plan(path, method="full", **CPU_FSDP2)
    assert plan.recommended.ok, plan.verdict
    code, ranks, err = run_ranks(write_launch(plan, tmp_path / "run"))
    assert code == 0 and len(ranks) == 2, err
    memory = plan.recommended.memory
    assert memory is not None
    for rank in ranks:
        # The sharded step against the step less what the CPU loading keeps; the plan's figure is at most that much
        # more (the experts are built by conversion at load, not kept as views: the bound is not reached).
        real = rank["peak"] - rank["model"]["storage_excess"]
        print(f"moe fsdp2: step {memory.peak:,} B vs {real:,} B; plan {plan.recommended.device_bytes:,} B")
        assert abs(memory.peak - real) <= TOLERANCE * real, (memory.peak, rank)
        assert rank["peak"] <= plan.recommended.device_bytes


# ------------------------------------------------------------------ FSDP2's first step through accelerate


@pytest.mark.slow
def test_fsdp2_first_step_holds_the_whole_model_as_accelerate_shards_it(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trainer.train() runs accelerate's fsdp2_prepare_model before step 1: the whole loaded model stays
    (``original_sd``) while each unit's shard is made, so with LoRA (a small steady state) the first step peaks
    above the rest. The dry run measures that preparation on accelerate's own code; a real 2-rank run of the
    accelerate path (train_rank.py's fake only lets accelerate take CPU processes for accelerators) peaks there."""
    import transformers as tf

    config = tf.AutoConfig.from_pretrained(tiny)
    config.hidden_size, config.intermediate_size, config.head_dim = 256, 512, 64  # weights outweigh activations
    config.num_hidden_layers, config.layer_types = 4, ["full_attention"] * 4
    path = with_tokenizer(config, tmp_path / "wide", tiny)
    args = dataclasses.replace(args_for("lora", False, lora_r=4, batch=1, context=8), strategy="fsdp2", devices=2)
    memory = strategies.cached_dry_run(tf.AutoConfig.from_pretrained(path), args, "fsdp2", 2)
    assert memory.first_step_peak > 1.1 * memory.peak and memory.preparation_peak > memory.whole_model
    unit = memory.whole_model // config.num_hidden_layers  # about one decoder layer's parameters, whole
    monkeypatch.setattr(L, "shards_at_load", lambda device_type: False)  # the script a GPU plan writes
    L.launch_files(str(path), args).write(tmp_path / "run")
    code, ranks, err = run_ranks(tmp_path / "run", fake_accelerator_types=True)
    assert code == 0 and len(ranks) == 2, err
    for rank in ranks:
        first, steady = rank["steps"]["1"], rank["step_peaks"]["2"]
        print(f"first step: plan {memory.first_step_peak:,} B, real {first:,} B; then {memory.peak:,} vs {steady:,}")
        assert abs(memory.first_step_peak - first) <= 0.02 * first, (memory, rank)
        # FSDP2 may all-gather the next unit before the last one is freed, by the ranks' timing (seen once in CI:
        # 14,854,824 B against 12,589,280 B): the steady step holds at most one unit's whole parameters more, and
        # never more than the first step the plan reports.
        assert -0.02 * steady <= steady - memory.peak <= 0.02 * steady + unit, (memory, rank)
        assert steady <= memory.first_step_peak, (memory, rank)
    monkeypatch.undo()
    gpu = train_plan(path, method="lora", lora_r=4, batch=1, context=8, dtype="float32", strategy="fsdp2",
                     target="2x A100-80GB")  # fmt: skip
    r = gpu.recommended
    assert r.first_step_host_bytes == r.memory.whole_model > 0  # type: ignore[union-attr]
    assert "each loads the whole model and accelerate shards it" in gpu.text()


def test_planning_a_lora_step_says_nothing_the_users_run_would_not() -> None:
    # peft reads transformers' deprecated is_gradient_checkpointing and MemTracker warns on modules without a
    # forward: both come from the dry step alone, and they showed under every training plan's cell.
    import warnings

    import nbhw

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = nbhw.train_plan(method="lora", device_memory="2GiB", context=64, batch=2, gradient_checkpointing=True)
        assert plan.max_batch is not None
    assert [str(w.message) for w in caught] == []
