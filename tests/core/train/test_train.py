"""Training plans against real runs: tiny random models stepped on the CPU, the emitted cell run for real, torchrun
over gloo for DDP, FSDP2 and tensor parallelism, and the mistakes a user makes.

QLoRA needs bitsandbytes, which stays out of the test venv (tests/core/hardware/test_doctor.py: installed there it would
change what "this machine" is): its tests run in a child process with the wheel scripts/setup.sh sets up beside the
venv.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError

import nbhw
from nbhw.__main__ import main
from nbhw.core.errors import UserError
from nbhw.core.plan.headroom import segment_for
from nbhw.core.train import launch as L
from nbhw.core.train import step as S
from nbhw.core.train import step_depth, strategies
from nbhw.core.train.arguments import TRAIN_ARGUMENTS, train_args
from nbhw.core.train.train_plan import search_batch, train_plan
from tests.support import families
from tests.support.fakes import FakeGpu, FakeHardware
from tests.support.train_realrun import real_peak, save_tiny
from tests.support.training import TOLERANCE, args_for, run_cell, run_ranks

ROOT = Path(__file__).resolve().parents[3]
FAMILIES = {"llama": families.llama, "qwen3": families.qwen3, "mistral": families.mistral, "gpt2": families.gpt2}
TEST_DISTS = Path(os.environ.get("NBHW_TEST_DISTS") or Path(sys.prefix) / "nbhw-test-dists")
BITSANDBYTES = TEST_DISTS / "bitsandbytes-0.50.2"
needs_bnb = pytest.mark.skipif(not BITSANDBYTES.is_dir(), reason=f"bitsandbytes wheel not set up at {BITSANDBYTES}")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny-train")
    for name, config in FAMILIES.items():
        save_tiny(config(), str(root / name))
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """nbhw's tiny Qwen3 with its tokenizer (the emitted cell loads one), built in this test's own folder."""
    from nbhw.core.hf.tiny_model import tiny_model_path

    return tiny_model_path(tmp_path_factory.mktemp("tok") / "qwen3")


# ------------------------------------------------------------------ the estimate against the real step


@pytest.mark.parametrize("gc", [False, True], ids=["no_gc", "gc"])
@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_meta_step_matches_the_real_cpu_step(checkpoints: Path, family: str, method: str, gc: bool) -> None:
    args = args_for(method, gc)
    config = FAMILIES[family]()
    estimate = S.dry_run(config, args)
    real = real_peak(str(checkpoints / family), args, config.vocab_size)
    assert abs(estimate.peak - real.tracker) <= TOLERANCE * real.tracker
    assert abs(estimate.peak - real.profiler) <= TOLERANCE * real.profiler
    # In fact they agree to a few bytes (MemTracker) and ~1 % (the allocator's events): keep the figures honest.
    # GPT-2 with checkpointing is 14,448 B (0.3 %) under: its attention dropout in the recompute, not chased yet.
    close = 14_448 if (family, method, gc) == ("gpt2", "full", True) else 128
    assert abs(estimate.peak - real.tracker) <= close, (estimate.peak, real)
    assert abs(estimate.peak - real.profiler) <= 0.011 * real.profiler, (estimate.peak, real)


MOE = {"mixtral": families.mixtral, "qwen3_moe": families.qwen3_moe}
# peft has no default targets for MoE types: all-linear reaches the experts' 3-D weights (peft's ParamWrapper, under
# torch.autocast(device_type=...) on meta); attention-only leaves the experts frozen (grouped_mm's autograd rule).
MOE_TARGETS = {"all-linear": "all-linear", "attention": ("q_proj", "v_proj")}


@pytest.mark.slow
@pytest.mark.parametrize("gc", [False, True], ids=["no_gc", "gc"])
@pytest.mark.parametrize("method", ["full", "lora-all-linear", "lora-attention"])
@pytest.mark.parametrize("family", list(MOE))
def test_moe_meta_step_matches_the_real_cpu_step(tmp_path: Path, family: str, method: str, gc: bool) -> None:
    kind, _, targets = method.partition("-")
    args = args_for(kind, gc, lora_target_modules=MOE_TARGETS.get(targets))
    config = MOE[family]()
    estimate = S.dry_run(config, args)
    real = real_peak(save_tiny(config, str(tmp_path / family)), args, config.vocab_size)
    print(family, method, gc, estimate.peak, real)
    assert abs(estimate.peak - real.tracker) <= TOLERANCE * real.tracker
    assert abs(estimate.peak - real.profiler) <= TOLERANCE * real.profiler
    # Seen: within 144 B of MemTracker and 1.3 % of the profiler (frozen experts read 11-13 % over before
    # grouped_mm's own autograd rule was used on meta).
    assert abs(estimate.peak - real.tracker) <= 256, (estimate.peak, real)


QLORA_CHECK = """
import json, sys, warnings
warnings.simplefilter("ignore")
from tests.support import families
from tests.support.training import args_for
from tests.support.train_realrun import real_peak, save_tiny
from nbhw.core.train import step as S
from nbhw.core.train import step_depth
out = {}
targets = json.loads(sys.argv[2])  # null: peft's defaults
for family in sys.argv[3:]:
    config = getattr(families, family)()
    path = save_tiny(config, sys.argv[1] + "/" + family)
    for gc in (False, True):
        args = args_for("qlora", gc, lora_target_modules=targets)
        real = real_peak(path, args, config.vocab_size, profiler=False)  # the profiler: in the dense tests
        out[f"{family}/{gc}"] = [S.dry_run(config, args).peak, real.tracker]
print(json.dumps(out))
"""


def python_path(*more: Path) -> str:
    """This checkout first (the child imports these tests and nbhw from here), then what this process had."""
    return os.pathsep.join([str(ROOT), *map(str, more), *filter(None, [os.environ.get("PYTHONPATH")])])


def run_with_bnb(code: str, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=python_path(BITSANDBYTES), PYTHONWARNINGS="ignore")
    return subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip


@needs_bnb
@pytest.mark.slow
def test_qlora_meta_step_matches_the_real_cpu_step(tmp_path: Path) -> None:
    """bitsandbytes 0.50.2 runs 4-bit training on the CPU: from_pretrained(quantization_config=...) + peft +
    backward + AdamW, measured like the others."""
    done = run_with_bnb(QLORA_CHECK, str(tmp_path), "null", *FAMILIES)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(found) == 2 * len(FAMILIES)
    print(found)
    for key, (estimate, tracker) in found.items():
        assert abs(estimate - tracker) <= TOLERANCE * tracker, (key, estimate, tracker)


@needs_bnb
@pytest.mark.slow
@pytest.mark.parametrize("targets", list(MOE_TARGETS))
def test_moe_qlora_meta_step_matches_the_real_cpu_step(tmp_path: Path, targets: str) -> None:
    """QLoRA on MoE families: the 4-bit base (transformers' quantizer takes the Linear layers; the experts' 3-D
    weights stay in the compute dtype), LoRA on all linear layers and experts, or on attention only."""
    done = run_with_bnb(QLORA_CHECK, str(tmp_path), json.dumps(MOE_TARGETS[targets]), *MOE)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(found) == 2 * len(MOE)
    print(found)
    for key, (estimate, tracker) in found.items():
        assert abs(estimate - tracker) <= TOLERANCE * tracker, (key, estimate, tracker)


def test_parts_add_up_and_say_what_they_are() -> None:
    config = families.llama()
    lora = S.dry_run(config, args_for("lora", True))
    full = S.dry_run(config, args_for("full", True))
    assert lora.trainable_parameters < full.trainable_parameters == full.parameters
    assert full.optimizer_states == 2 * full.trainable_bytes  # AdamW: exp_avg + exp_avg_sq, measured
    assert lora.gradients == lora.trainable_bytes and lora.optimizer_states == 2 * lora.trainable_bytes
    assert lora.peak >= lora.weights + lora.activations
    assert any("the SDPA kernel torch picks on a CPU" in n for n in lora.notes)


def test_repeating_the_middle_layers_equals_running_every_layer() -> None:
    """The depth shortcut (what makes a 70B plan seconds, not minutes) is the recorded step repeated, byte for byte."""
    config = step_depth.with_depth(families.llama(), 12)
    for method in ("full", "lora"):
        for gc in (False, True):
            args = args_for(method, gc)
            full = S.dry_run(config, args, depth="full")
            deep = S.dry_run(config, args, depth="auto")
            assert any("recorded with 5 of the 12" in n for n in deep.notes)
            for name in ("peak", "forward_backward_peak", "weights", "optimizer_states", "gradients"):
                assert getattr(deep, name) == getattr(full, name), (method, gc, name)


def test_fsdp2s_step_from_a_few_layers_equals_running_every_layer() -> None:
    """Under FSDP2's fake world too: its hooks overlap two layers, and the layer an op is tagged with must not
    depend on a set's order (it did: the periods then repeated only under some hash seeds and the plan ran every
    layer of the model)."""
    config = step_depth.with_depth(families.llama(), 13)
    for (method, gc), world in ((("full", False), 2), (("lora", True), 4)):
        args = args_for(method, gc)
        full = S.dry_run(config, args, depth="full", setup=S.Setup("fsdp2", world))
        deep = S.dry_run(config, args, depth="auto", setup=S.Setup("fsdp2", world))
        assert any("recorded with 7 of the 13" in n for n in deep.notes), deep.notes
        for name in ("peak", "forward_backward_peak", "first_step_peak", "weights", "optimizer_states", "gradients"):
            assert getattr(deep, name) == getattr(full, name), (method, world, name)
        assert (deep.whole_model, deep.preparation_peak) == (full.whole_model, full.preparation_peak)


def test_fsdp2s_dry_run_without_dtensor_dispatch_or_device_queries_reads_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two shortcuts make an FSDP2 plan seconds faster: the optimizer step runs on each rank's local shards instead
    of through DTensor's dispatch (AdamW over hundreds of sharded parameters), and the tracker leaves FakeTensor's
    device() queries alone when its peak can't move. Every figure of the row, its step and the model at full depth
    equals the dry run without them: with foreach (a GPU plan) and one tensor at a time (a CPU plan), with shards of
    unequal size (3 ranks), at full depth (backward's gradients) and from a few layers."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from nbhw.core.train import meta_patches, sharded

    shardwise, dispatch = sharded.shardwise_step, meta_patches._Training.__torch_dispatch__
    steps: list[Any] = []
    call = sharded.ShardwiseStep.__call__
    monkeypatch.setattr(sharded.ShardwiseStep, "__call__", lambda self: steps.append(self) or call(self))
    depths: list[Any] = []
    measure = S._measure_full_depth
    monkeypatch.setattr(S, "_measure_full_depth", lambda *a: depths.append(measure(*a)) or depths[-1])

    def both_ways(config: Any, args: Any, world: int) -> tuple[Any, Any]:
        found = []
        for fast in (False, True):
            monkeypatch.setattr(S, "shardwise_step", shardwise if fast else lambda optimizer: None)
            monkeypatch.setattr(
                meta_patches._Training, "__torch_dispatch__", dispatch if fast else MemTracker.__torch_dispatch__
            )
            strategies.clear_cache()
            found.append(strategies.strategy_estimate(config, args, "fsdp2", world, mistakes=True))
        return found[0], found[1]

    # The model at full depth from 7 recorded layers (the optimizer step on gradients made like backward's), and a
    # model of 2 layers run whole (the step on backward's own gradients).
    cases = (("lora", 9, 2, "cuda"), ("full", 2, 3, "cpu"))
    for method, layers, world, device_type in cases:
        config = step_depth.with_depth(families.llama(), layers)
        args = args_for(method, method == "lora", devices=world, device_type=device_type)
        depths.clear()
        slow, fast = both_ways(config, args, world)
        assert fast.ok and fast.memory is not None and fast.memory.optimizer_states > 0, method
        assert {**slow.to_dict(), "seconds": 0} == {**fast.to_dict(), "seconds": 0}, (method, layers)
        assert len(depths) == (2 if layers > 2 else 0) and depths[:1] == depths[1:], (method, layers)  # FullDepth
    assert len(steps) == len(cases)  # the optimizer step ran on the shards each time


def test_a_device_query_updates_the_peak_after_memory_changed_outside_an_op() -> None:
    """The tracker passes over FakeTensor's device() queries only while its peak can't move: a storage FSDP2 grows
    with resize_ (outside any op) and frees again with only a device query between is in the peak, as MemTracker
    counts it."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from nbhw.core.train import meta_patches

    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        held = torch.empty(0)
    tracker = meta_patches.tracker_class()()
    tracker.track_external(held)
    with fake, tracker:
        held.untyped_storage().resize_(4096)
        assert not held.is_cuda  # a device query
        held.untyped_storage().resize_(0)
        assert meta_patches.snapshot(tracker, "peak", "cpu").get("Total") == 4096


def test_a_search_over_rows_builds_the_deep_model_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The weights and the optimizer step at full depth don't depend on the rows: a search over context measures
    them once, and each context's figures equal its own full-depth run."""
    config = step_depth.with_depth(families.llama(), 12)
    S.forget_full_depths()
    measured: list[int] = []
    measure = S._measure_full_depth
    monkeypatch.setattr(S, "_measure_full_depth", lambda *a: measured.append(1) or measure(*a))
    for context in (32, 48, 64):
        args = args_for("lora", True, context=context)
        deep = S.dry_run(config, args)
        full = S.dry_run(config, args, depth="full")
        assert (deep.peak, deep.weights, deep.optimizer_step_peak) == (
            full.peak,
            full.weights,
            full.optimizer_step_peak,
        )
    assert len(measured) == 1


def test_max_batch_is_a_measured_answer() -> None:
    config = families.llama()
    args = args_for("lora", True)

    def peak(batch: int) -> int:
        return strategies.cached_dry_run(config, dataclasses.replace(args, batch=batch)).peak

    budget = peak(1) + 3 * (peak(2) - peak(1)) + 10
    best = search_batch(peak, budget, limit=64)
    assert best >= 1 and peak(best) <= budget < peak(best + 1)
    assert search_batch(peak, peak(1) - 1, limit=64) == 0


# ------------------------------------------------------------------ the plan, on this machine and on a GPU


def test_plan_on_a_fake_gpu_follows_the_hardware(fake_hw: FakeHardware, tiny: Path) -> None:
    fake_hw.nvidia(FakeGpu("NVIDIA A100-SXM4-80GB", total=80 * 2**30))
    plan = train_plan(tiny, method="lora", batch=2, context=64)
    assert plan.args.device_type == "cuda" and plan.args.dtype == "bfloat16"
    assert plan.device.total == 80 * 2**30 and plan.fits is True
    assert "bf16=True" in plan.code and "LoraConfig(" in plan.code
    assert plan.peak_bytes == plan.recommended.device_bytes + plan.reserve.bytes


def test_plan_text_json_and_max_batch(tiny: Path) -> None:
    plan = train_plan(tiny, method="full", batch=2, context=64, device_type="cpu", device_memory="600MiB")
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["args"]["method"] == "full" and data["fits"] is True and data["max_batch"] >= 2
    assert data["estimate"]["peak"] == plan.recommended.device_bytes
    text = plan.text()
    assert "Verdict: fits" in text and "optimizer state" in text and "python train_nbhw.py" in text


def test_a_step_with_less_room_than_the_allocator_needs_is_tight(fake_hw: FakeHardware, tiny: Path) -> None:
    fake_hw.nvidia(FakeGpu("NVIDIA A100-SXM4-80GB", total=80 * 2**30))
    # memory under 24 GiB throughout: the reserve's cuBLASLt workspace is the same for all three plans
    roomy = train_plan(tiny, method="full", batch=2, context=64, device_memory="20GiB")
    assert roomy.estimate is not None and roomy.margin is not None and not roomy.tight
    # the step's largest block (measured): the logits' float32 upcast or a gradient / Adam state of the embedding
    embedding = tiny_embedding_bytes(tiny, roomy.args.dtype)
    assert roomy.estimate.largest_block >= embedding
    assert roomy.margin.bytes == segment_for(roomy.estimate.largest_block) + 2 * 2**20
    edge = roomy.peak_bytes + roomy.margin.bytes
    tight = train_plan(tiny, method="full", batch=2, context=64, device_memory=edge - 1)
    room = train_plan(tiny, method="full", batch=2, context=64, device_memory=edge)
    assert (tight.fits, tight.tight, room.tight) == (True, True, False)
    assert tight.verdict.startswith("tight: ") and "the allocator needs" in tight.verdict
    assert "headroom" in tight.text() and "allocator margin" in tight.text()
    assert tight.to_dict()["tight"] is True and tight.max_batch == 1


def tiny_embedding_bytes(folder: Path, dtype: str) -> int:
    config = json.loads((folder / "config.json").read_text())
    return int(config["vocab_size"]) * int(config["hidden_size"]) * (4 if dtype == "float32" else 2)


def test_strategies_on_two_devices_are_compared_and_one_recommended(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    estimated: list[tuple[str, bool]] = []
    estimate = strategies.strategy_estimate

    def counted(config: Any, args: Any, strategy: str, world: int, **kw: Any) -> Any:
        estimated.append((strategy, kw.get("offload", False)))
        return estimate(config, args, strategy, world, **kw)

    monkeypatch.setattr(strategies, "strategy_estimate", counted)
    plan = train_plan(tiny, method="full", batch=2, context=64, devices=2, device_type="cpu", device_memory="600MiB")
    assert estimated == [("ddp", False)]  # the first in the order fits: no other strategy is dry-run for it
    labels = {(r.strategy, r.offload) for r in plan.rows}  # the table: every other one now, each once
    assert labels == {c for c in strategies.CHOICES if c[0] != "single"}
    assert plan.recommended.strategy == "ddp" and "first that fits" in plan.why
    by = {(r.strategy, r.offload): r for r in plan.rows}
    assert by[("fsdp2", False)].device_bytes < by[("ddp", False)].device_bytes
    assert by[("fsdp2", True)].host_bytes > 0 and "rule" in by[("zero3", False)].source
    assert plan.launch.command == "torchrun --nnodes 1 --nproc_per_node 2 train_nbhw.py"
    assert sorted(estimated) == sorted(labels)


def test_sharded_strategies_in_one_process_for_eight_ranks() -> None:
    import torch.distributed as dist

    config = step_depth.with_depth(families.llama(), 4)
    args = args_for("full", False)
    single = strategies.strategy_estimate(config, args, "single", 1)
    fsdp = strategies.strategy_estimate(config, args, "fsdp2", 8)
    assert fsdp.memory is not None and single.memory is not None
    assert fsdp.memory.weights < single.memory.weights / 6
    assert not dist.is_initialized()  # the fake world is gone again


def test_a_first_sharded_dry_run_reads_what_a_later_one_does() -> None:
    """DTensor works out each new op's output shape on stand-ins of the global shapes, then remembers it per op
    and shapes. Those stand-ins were counted as the rank's memory: a process's first FSDP2 step over a model read
    the unsharded parameters, gradients and AdamW states in its optimizer step (70B over 8 ranks: 476 GiB per
    rank, then 82 GiB). Shapes no other test uses make the first run here a first for DTensor too."""
    config = step_depth.with_depth(families.llama(), 4)
    config.hidden_size, config.intermediate_size, config.head_dim = 72, 88, 18  # 4 heads of 18: unused elsewhere
    args = dataclasses.replace(args_for("full", False), devices=2)
    single = S.dry_run(config, args)
    for strategy in ("fsdp2", "tp"):
        first = S.dry_run(config, args, setup=S.Setup(strategy, 2))
        again = S.dry_run(config, args, setup=S.Setup(strategy, 2))
        assert (first.peak, first.optimizer_step_peak) == (again.peak, again.optimizer_step_peak), strategy
        # Each rank steps its own half of the parameters, gradients and AdamW states: less than one device
        # stepping all of them (the stand-ins made the first read more than that).
        assert first.optimizer_step_peak < single.optimizer_step_peak, (strategy, first, single)


# ------------------------------------------------------------------ the emitted cell, run for real


@pytest.mark.parametrize("method", ["full", "lora"])
def test_emitted_cell_trains_for_real_on_cpu(tiny: Path, tmp_path: Path, method: str) -> None:
    plan = train_plan(tiny, method=method, batch=2, context=32, gradient_checkpointing=True, lora_r=4,
                      device_type="cpu")  # fmt: skip
    assert "activation_checkpointing=True" in plan.code  # transformers 5.24's name (gradient_checkpointing: deprecated)
    losses = run_cell(plan.code, tmp_path)
    assert len(losses) >= 4 and all(math.isfinite(x) for x in losses), losses


QLORA_CELL = """
import sys, warnings
warnings.simplefilter("ignore")
from tests.support.training import run_cell
from nbhw.core.train.train_plan import train_plan
from pathlib import Path
plan = train_plan(sys.argv[1], method="qlora", batch=2, context=32, gradient_checkpointing=True, lora_r=4,
                  device_type="cpu")
print(run_cell(plan.code, Path(sys.argv[2])))
"""


@needs_bnb
@pytest.mark.slow
def test_emitted_qlora_cell_trains_for_real_on_cpu(tiny: Path, tmp_path: Path) -> None:
    done = run_with_bnb(QLORA_CELL, str(tiny), str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    losses = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert len(losses) >= 4 and all(math.isfinite(x) for x in losses), losses


def test_cell_and_script_are_valid_python_for_every_strategy() -> None:
    for strategy in ("single", "ddp", "fsdp2", "zero2", "zero3", "tp"):
        devices = 1 if strategy == "single" else 8
        args = train_args(method="lora", batch=4, context=4096, strategy=strategy, devices=devices)
        files = L.launch_files('org/odd "name"\\', args)
        ast.parse(files.script)
        assert files.command


def test_accelerate_reads_every_emitted_config(tmp_path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    expected = {"ddp": "MULTI_GPU", "fsdp2": "FSDP", "zero2": "DEEPSPEED", "zero3": "DEEPSPEED", "tp": "MULTI_GPU"}
    for strategy, kind in expected.items():
        folder = tmp_path / strategy
        L.launch_files("org/model", train_args(method="lora", strategy=strategy, devices=4)).write(folder)
        assert str(load_config_from_file(str(folder / L.ACCELERATE_CONFIG_NAME)).distributed_type).endswith(kind)


def test_commands_for_one_and_two_nodes() -> None:
    one = train_args(strategy="ddp", devices=8)
    two = train_args(strategy="fsdp2", devices=8, nodes=2)
    assert L.torchrun_command(one) == "torchrun --nnodes 1 --nproc_per_node 8 train_nbhw.py"
    assert "--nnodes 2 --nproc_per_node 8 --node_rank $NODE_RANK" in L.torchrun_command(two)
    assert L.notebook_launcher_cell(one) is not None and L.notebook_launcher_cell(two) is None


DEEPSPEED_CHECK = """
import json, sys
from deepspeed.runtime.config import DeepSpeedConfig
from transformers import TrainingArguments
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig
for path in sys.argv[1:]:
    hf = HfTrainerDeepSpeedConfig(json.load(open(path)))
    hf.trainer_config_process(TrainingArguments(output_dir="/tmp/nbhw-ds", per_device_train_batch_size=4,
                                                gradient_accumulation_steps=2, bf16=True, use_cpu=True))
    ds = DeepSpeedConfig(hf.config)
    print(ds.zero_optimization_stage, ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps,
          bool(ds.zero_config.offload_optimizer))
"""


def deepspeed_python() -> str | None:
    """A Python with DeepSpeed: $NBHW_DEEPSPEED_PYTHON (DeepSpeed pins its own torch: kept out of the test venv),
    else this one if it has DeepSpeed."""
    import importlib.util

    named = os.environ.get("NBHW_DEEPSPEED_PYTHON")
    if named:
        return named
    return sys.executable if importlib.util.find_spec("deepspeed") is not None else None


def test_deepspeed_configs_pass_deepspeeds_own_parser(tmp_path: Path) -> None:
    """The emitted ZeRO configs, their "auto" values filled by transformers' own HfTrainerDeepSpeedConfig, parsed
    by DeepSpeed's own DeepSpeedConfig (no step: DeepSpeed's engine needs a GPU or built ops)."""
    python = deepspeed_python()
    if python is None:
        pytest.skip("no DeepSpeed here; set NBHW_DEEPSPEED_PYTHON to a Python that has it")
    paths = []
    for strategy in ("zero2", "zero3"):
        for offload in (False, True):
            args = train_args(method="lora", batch=4, gradient_accumulation_steps=2, dtype="bfloat16",
                              strategy=strategy, devices=8, nodes=2, offload=offload)  # fmt: skip
            folder = tmp_path / f"{strategy}-{offload}"
            L.launch_files("org/model", args).write(folder)
            paths.append(str(folder / L.DEEPSPEED_CONFIG_NAME))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads(Path(paths[0]).read_text()), "zero_optimization": {"stage": 7}}))
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH="")
    done = subprocess.run([python, "-c", DEEPSPEED_CHECK, *paths], capture_output=True, text=True, timeout=600,
                          env=env, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")[-5:-1]
    assert lines == ["2 4 2 False", "2 4 2 True", "3 4 2 False", "3 4 2 True"], done.stdout
    refused = subprocess.run([python, "-c", DEEPSPEED_CHECK, str(bad)], capture_output=True, text=True,
                             timeout=600, env=env, check=False)  # fmt: skip
    assert refused.returncode != 0  # the parser really validates


# ------------------------------------------------------------------ real distributed runs


def torchrun(strategy: str, model: Path, work: Path, **extra: Any) -> tuple[int, list[dict[str, Any]], str]:
    values = {"method": "full", **extra}
    args = train_args(batch=2, context=32, dtype="float32", device_type="cpu", strategy=strategy, devices=2,
                      **values)  # fmt: skip
    L.launch_files(str(model), args).write(work)
    return run_ranks(work, fake_accelerator_types=strategy == "tp")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2", "tp"])
def test_torchrun_gloo_runs_the_emitted_script_and_each_rank_peaks_as_planned(
    tiny: Path, tmp_path: Path, strategy: str
) -> None:
    code, ranks, err = torchrun(strategy, tiny, tmp_path)
    assert code == 0, err
    assert len(ranks) == 2 and all(len(r["steps"]) >= 2 for r in ranks)
    plan = train_plan(tiny, method="full", batch=2, context=32, dtype="float32", device_type="cpu",
                      strategy=strategy, devices=2)  # fmt: skip
    estimate = plan.recommended.device_bytes
    for rank in ranks:
        if strategy == "fsdp2":
            assert rank["model"]["model"].startswith("FSDP")  # really sharded, not DDP in disguise
        # TP on the CPU only: transformers keeps each loaded shard as a view of the whole tensor (see train_rank.py),
        # seen as 0.87-0.91 of the real peak with it. The plan follows the shards, as a GPU holds them. FSDP2 on CPU
        # shards at load the same way, and its plan counts what the loading keeps (what a CPU plan runs).
        excess = rank["model"]["storage_excess"] if strategy == "tp" else 0
        assert excess == 0 or strategy == "tp"
        real = rank["peak"] - excess
        print(f"{strategy}: estimate {estimate:,} B, rank peak {rank['peak']:,} B, loading excess {excess:,} B")
        assert abs(estimate - real) <= TOLERANCE * real, (estimate, rank["peak"], excess)


@pytest.mark.slow
def test_tp_of_a_model_with_tied_embeddings_plans_and_runs_as_planned(tiny: Path, tmp_path: Path) -> None:
    """Tied input and output embeddings (Gemma, Qwen3-0.6B): the TP plan names the head's own weight, so the model
    is sharded untied and tied after, as from_pretrained does; the plan said "KeyError: 'lm_head.weight'" before.
    A real 2-rank torchrun of the emitted script holds one copy of the tied weight, as the plan does, and peaks within
    10 % of it: +2.7 % steady; -5.7 % in the steps where gloo's thread still holds the last gathered logits (seen in
    about 1 run in 4 under load; CI failed on the copy that was never tied, -12.9 %)."""
    import transformers
    from safetensors import safe_open

    # A checkpoint saved tied (no lm_head.weight of its own): a copy of the untied one with the config's flag set
    # keeps its own head, which from_pretrained then refuses to tie (the two differ), so the run was not tied at all.
    tied = tmp_path / "tied"
    shutil.copytree(tiny, tied)
    config = transformers.AutoConfig.from_pretrained(tied, tie_word_embeddings=True)
    save_tiny(config, str(tied))
    with safe_open(str(tied / "model.safetensors"), framework="pt") as saved:
        saved_names = list(saved.keys())  # safe_open has no membership test of its own
    assert "lm_head.weight" not in saved_names and "model.embed_tokens.weight" in saved_names, saved_names
    plan = train_plan(tied, method="full", batch=2, context=32, dtype="float32", device_type="cpu", strategy="tp",
                      devices=2)  # fmt: skip
    assert plan.recommended.ok, plan.recommended.problems
    memory = plan.recommended.memory
    assert memory is not None
    code, ranks, err = torchrun("tp", tied, tmp_path / "run")
    assert code == 0 and len(ranks) == 2, err
    for rank in ranks:
        # Tied for real: the rank holds one copy of the shared weight, as the plan does.
        assert rank["model"]["params"] == memory.trainable_bytes, (memory.trainable_bytes, rank["model"])
        real = rank["peak"] - rank["model"]["storage_excess"]  # the CPU loading excess, as in the tests above
        assert abs(plan.recommended.device_bytes - real) <= TOLERANCE * real, (plan.recommended.device_bytes, rank)


@pytest.mark.slow
def test_tp_with_lora_on_a_row_wise_layer_fails_for_real_as_the_plan_says(tiny: Path, tmp_path: Path) -> None:
    """peft's adapter on a row-wise sharded o_proj and transformers' row-wise forward disagree on its input width:
    the plan's TP row says so (naming the column-wise layers), a real 2-rank torchrun fails at that layer, and the
    column-wise targets the row names plan and run, the real per-rank peak within 10 % of the estimate."""
    words = {"method": "lora", "lora_r": 4, "dtype": "float32", "device_type": "cpu", "strategy": "tp", "devices": 2}
    row = train_plan(tiny, batch=2, context=32, lora_target_modules=["q_proj", "o_proj"], **words).recommended
    assert row.source == "dry run refused" and "o_proj (" in row.problems[0], row.problems
    column = re.search(r"lora_target_modules=(\[[^]]*\])", row.problems[0])
    assert column is not None and "o_proj" not in column.group(1) and "q_proj" in column.group(1)
    code, _, err = torchrun("tp", tiny, tmp_path / "row", method="lora", lora_r=4, lora_target_modules=("o_proj",))
    assert code != 0 and "is invalid for input of size" in err, err
    targets = tuple(ast.literal_eval(column.group(1)))
    plan = train_plan(tiny, batch=2, context=32, lora_target_modules=list(targets), **words)
    assert plan.recommended.ok, plan.recommended.problems
    code, ranks, err = torchrun("tp", tiny, tmp_path / "column", method="lora", lora_r=4, lora_target_modules=targets)
    assert code == 0 and len(ranks) == 2, err
    for rank in ranks:
        real = rank["peak"] - rank["model"]["storage_excess"]  # the CPU loading excess, as in the test above
        print(f"tp lora {targets}: estimate {plan.recommended.device_bytes:,} B, rank peak {real:,} B")
        assert abs(plan.recommended.device_bytes - real) <= TOLERANCE * real, (plan.recommended.device_bytes, rank)


# ------------------------------------------------------------------ mistakes


def test_lora_without_peft_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(UserError, match=r"method='lora' and 'qlora' need peft: pip install 'peft>=0\.22\.0'"):
        train_args(method="lora")


def test_one_line_errors_name_the_valid_values() -> None:
    with pytest.raises(UserError, match="lora_r must be a whole number of at least 1"):
        train_args(method="lora", lora_r=0)
    with pytest.raises(UserError, match="batch must be a whole number of at least 1"):
        train_args(batch=0)
    with pytest.raises(UserError, match="unknown optimizer 'adamw'; TrainingArguments' optim takes: adamw_torch"):
        train_args(optimizer="adamw")
    with pytest.raises(UserError, match="strategy='single' runs on one device"):
        train_args(strategy="single", devices=2)
    with pytest.raises(UserError, match="within one node"):
        train_args(strategy="tp", devices=8, nodes=2)
    with pytest.raises(UserError, match="unknown method 'qlora4'; valid: full, lora, qlora"):
        train_args(method="qlora4")


def test_unknown_target_modules_list_the_models_linear_layers(tiny: Path) -> None:
    with pytest.raises(UserError) as err:
        train_plan(tiny, method="lora", lora_target_modules=["qproj"], context=16, device_type="cpu")
    message = str(err.value)
    assert "'qproj'" in message and "down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj" in message
    assert "\n" not in message


def test_tp_over_three_devices_names_the_sizes_that_divide_the_heads(tiny: Path) -> None:
    plan = train_plan(tiny, method="full", context=16, strategy="tp", devices=3, device_type="cpu")
    assert not plan.recommended.ok and "does not run" in plan.verdict
    assert "num_attention_heads=4" in plan.verdict and "TP sizes that do: 2\n" in plan.verdict + "\n"  # 4: 2 KV heads


def test_the_magic_and_the_cli_take_the_same_words(ip: Any, tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    with pytest.raises(UsageError, match="lora_r must be a whole number of at least 1"):
        ip.run_line_magic("hw", f"train {tiny} --lora-r 0")
    ip.run_line_magic("hw", f"train {tiny} --method lora --batch 2 --context 32 --device-type cpu --json")
    shown = json.loads(capsys.readouterr().out)
    assert shown["args"]["batch"] == 2 and shown["args"]["method"] == "lora"
    assert main(["train", str(tiny), "--batch", "0"]) == 2
    assert "batch must be a whole number" in capsys.readouterr().err
    code = main(["train", str(tiny), "--method", "full", "--context", "32", "--device-type", "cpu", "--emit"])
    assert code == 0 and "trainer.train()" in capsys.readouterr().out


def test_every_declared_argument_is_a_keyword_and_an_option() -> None:
    import inspect

    from nbhw import commands

    keywords = inspect.signature(train_plan).parameters
    declared = commands.BY_NAME["train"].arguments
    for a in TRAIN_ARGUMENTS:
        assert a.name in keywords and a in declared


def test_plan_with_task_train_is_the_training_plan_in_every_surface(
    ip: Any, tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    words: dict[str, Any] = {"method": "lora", "context": 32, "device_type": "cpu", "device_memory": "8GiB"}
    planned = nbhw.plan(tiny, task="train", **words)
    mine, its = planned.to_dict(), train_plan(tiny, **words).to_dict()
    for data in (mine, its):
        for row in data["strategies"]:
            row.pop("seconds", None)  # how long each dry run took
    assert mine == its
    cases: list[tuple[dict[str, Any], str]] = [
        ({"task": "train", "device_map": "auto"}, "device_map is for task='infer'; task='train' takes: batch, "),
        ({"devices": 2}, "devices is for task='train'; task='infer' takes: attn_implementation, "),
        ({"task": "build"}, "unknown task 'build'; valid: infer, train, serve"),
        ({"task": "serve", "devices": 2}, "devices is not for task='serve'; it takes: "),
    ]
    for values, message in cases:
        with pytest.raises(UserError, match=message):
            nbhw.plan(tiny, **values)
    line = f"load {tiny} --task train --method lora --context 32 --device-type cpu --device-memory 8GiB"
    ip.run_line_magic("load_ext", "nbhw")
    ip.run_line_magic("hw", line + " --emit")
    assert "get_peft_model" in ip.rl_next_input and "trainer.train()" in ip.rl_next_input
    with pytest.raises(UsageError, match="device_map is for task='infer'"):
        ip.run_line_magic("hw", f"load {tiny} --task train --device-map auto")
    capsys.readouterr()
    assert main([*line.split(), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == planned.verdict
    assert main(["load", str(tiny), "--devices", "2"]) == 2
    assert "devices is for task='train'" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["full", "lora"])
def test_fp16_plans_give_weights_torchs_grad_scaler_can_unscale(tiny: Path, method: str) -> None:
    # A T4 trains in fp16 (no bf16 before Ampere). TrainingArguments(fp16=True) steps through torch's GradScaler,
    # which refuses float16 gradients: full fine-tuning must load float32 weights; LoRA's adapters are float32.
    import peft
    import torch
    import transformers as tf

    plan = train_plan(tiny, method=method, target="T4", context=16)
    assert "fp16=True" in plan.code and f"dtype=torch.{plan.args.dtype}" in plan.code
    assert plan.args.dtype == ("float32" if method == "full" else "float16")
    model = tf.AutoModelForCausalLM.from_pretrained(tiny, dtype=getattr(torch, plan.args.dtype))
    if method == "lora":
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, task_type="CAUSAL_LM"))
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer, scaler = torch.optim.AdamW(trained), torch.amp.GradScaler("cpu")
    ids = torch.randint(3, 100, (2, 16))
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(input_ids=ids, labels=ids).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # ValueError("Attempting to unscale FP16 gradients.") on float16 weights
    scaler.step(optimizer)
    assert torch.isfinite(loss)
