"""For every catalog entry, the plan and the attention advice for a Llama-3-8B-sized model follow the entry's
compute capability, dtypes and memory, and the run (4,096 tokens) is counted against that memory with the run
planner's reserve for the entry's backend; the table of docs/reference/targets.md is what scripts/target_table.py
prints."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nbhw
from nbhw.core.advice import attention, attention_rules
from nbhw.core.advice.status import Status
from nbhw.core.hardware import who_picks
from nbhw.core.hardware.targets import Accelerator, catalog, parse_target
from nbhw.core.hf import library_source, meta_build
from nbhw.core.plan.outside_tensors import framework_reserve
from nbhw.core.plan.placement import is_accelerator
from tests.support.dists import BITSANDBYTES
from tests.support.pins import skip_unless_pinned

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "target_table.py"
HEADROOM = 0.8  # weights below 80 % of one device's memory fit on it whatever transformers keeps free


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("target_table", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", autouse=True)
def one_meta_build_per_attention_and_dtype() -> Iterator[dict[tuple[str, ...], meta_build.MetaBuild]]:
    """The attention advice's meta builds, each built once for the module: a build is a function of the config,
    the dtype, the attn_implementation and the auto class alone (never of the target), and the advice only reads it;
    nbhw rebuilds the same seven for every target (the plan and the quantization advice keep theirs)."""
    real = attention_rules.build_for
    builds: dict[tuple[str, ...], meta_build.MetaBuild] = {}

    def build_for(key: str | None, env: Any) -> meta_build.MetaBuild:
        config = env.model.config
        found = (str(key), str(env.dtype), str(env.model.auto_class), config.to_json_string(use_diff=False))
        if found not in builds:
            builds[found] = real(key, env)
        return builds[found]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention_rules, "build_for", build_for)
        patch.setattr(attention, "build_for", build_for)
        yield builds


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(_script().llama_3_8b(tmp_path_factory.mktemp("llama") / "llama-3-8b-sized"))


def _entry(key: str) -> Accelerator:
    return next(a for a in catalog() if a.key == key)


def _check_dtype(a: Accelerator, advice: Any) -> None:
    dtype = advice.precision.dtype
    if a.backend == "mps":
        assert dtype == "float16", a.key  # Apple GPUs: float16 on every macOS version
    else:
        assert (dtype == "bfloat16") == a.dtypes["bf16"], (a.key, dtype)
    if a.backend == "cuda":
        assert (advice.precision.tf32 is not None) == a.dtypes["tf32"], a.key


def _check_attention(a: Accelerator, advice: Any) -> None:
    works = {n: advice.row(f"flash_attention_{n}").status is Status.WORKS for n in (2, 3, 4)}
    if a.backend == "cuda":
        cc = a.capability
        assert cc is not None
        assert works == {2: cc >= (8, 0), 3: cc >= (8, 0), 4: cc >= (9, 0)}, (a.key, works)
    elif a.backend == "rocm":
        assert works == {2: True, 3: False, 4: False}, (a.key, works)
    else:
        assert not works[3] and not works[4], a.key
    assert advice.row("sdpa").status is Status.WORKS
    assert advice.kernels.device_key == a.device_type
    assert advice.not_here is not None and "not here" in advice.text().splitlines()[0]


def _check_plan(a: Accelerator, plan: Any) -> None:
    placement, weights = plan.placement, plan.estimate.total_bytes
    assert placement is not None and "catalog" in placement.budget_source
    first = "mps" if a.device == "mps" else 0
    # accelerate <= 1.15's device_map="auto" doesn't budget tpu or neuron (the plan says so); 1.16 budgets them.
    order = library_source.auto_memory_order()
    assert order is not None
    if who_picks.left_out(parse_target(a.name).rows(), order):
        assert any(f"leaves the {a.name} unused" in p for p in plan.check()), a.key
        return
    assert placement.budget[first] == a.memory_bytes, (a.key, placement.budget)
    if weights < HEADROOM * a.memory_bytes:  # on the target's devices only ("auto" balances over a card's two)
        assert placement.kind in {"one_device", "split"}, (a.key, placement.verdict)
        assert all(d.device == "mps" or d.device.startswith(f"{a.device}:") for d in placement.devices), a.key
    if weights > a.memory_bytes * a.devices_per_card:
        assert placement.kind in {"cpu_offload", "disk", "too_big"}, (a.key, placement.verdict)
    assert plan.check() == [], (a.key, plan.check())
    assert plan.target is not None and plan.target.label == parse_target(a.name).label  # what to_dict() says: below
    _check_run(a, placement)


def _check_run(a: Accelerator, placement: Any) -> None:
    """Each of the target's devices counts the run and the reserve the run planner states for its backend."""
    reserve = framework_reserve(a.backend, capability=a.capability, total_memory=a.memory_bytes).bytes
    on_target = [s for s in placement.devices if is_accelerator(s.key)]
    kinds = {"fits", "tight", "fits_shorter", "does_not_fit"}
    assert on_target and placement.run_kind in kinds, (a.key, placement.verdict)
    for share in on_target:
        assert share.reserve_bytes == reserve and share.budget == a.memory_bytes, (a.key, share)
        assert share.needed_bytes is not None and share.needed_bytes > share.bytes + reserve, (a.key, share)
        assert (share.needed_bytes <= share.budget) == (placement.run_kind in ("fits", "tight")), (a.key, share)
    if placement.run_kind == "tight":  # fits by the tensors, with less room than some device's allocator needs
        assert any(0 <= (s.headroom_bytes or 0) < (s.margin_bytes or 0) for s in on_target), (a.key, placement)
    cpu = next((s for s in placement.devices if s.key == "cpu"), None)
    if cpu is not None and cpu.reserve_bytes is not None:  # a target's host: the process's own, not "read now"
        assert cpu.reserve_bytes == framework_reserve("cpu").bytes, (a.key, cpu)


@pytest.mark.slow
@pytest.mark.parametrize("key", [a.key for a in catalog()])
def test_plan_and_attention_follow_the_entrys_capability_and_dtypes(llama: str, key: str) -> None:
    a = _entry(key)
    advice = nbhw.attention(llama, target=a.name, offline=True)
    _check_dtype(a, advice)
    _check_attention(a, advice)
    plan = nbhw.plan(llama, target=a.name, dtype=advice.precision.dtype, offline=True)
    _check_plan(a, plan)
    bf16_notes = [n for n in nbhw.plan(llama, target=a.name, offline=True).notes if "no native bfloat16" in n]
    assert bool(bf16_notes) == (not a.dtypes["bf16"]), a.key  # the config's bfloat16 on a card without it


def _cheapest_per_backend() -> list[str]:
    """Per backend, the entry with the fewest devices per card and the least memory, and the cheapest with two or
    more devices per card (a run split over a card's devices): to_dict()'s batch search is ~20 dry runs, more the
    more room there is."""
    keys: dict[str, str] = {}
    for a in sorted(catalog(), key=lambda a: (a.devices_per_card, a.memory_bytes)):
        keys.setdefault(a.backend, a.key)
        if a.devices_per_card > 1:
            keys.setdefault("split", a.key)
    return list(dict.fromkeys(keys.values()))


@pytest.mark.parametrize("key", _cheapest_per_backend())
def test_the_plans_json_names_the_target_and_counts_its_run(llama: str, key: str) -> None:
    a = _entry(key)
    advice = nbhw.attention(llama, target=a.name, offline=True)
    plan = nbhw.plan(llama, target=a.name, dtype=advice.precision.dtype, offline=True)
    found = json.loads(json.dumps(plan.to_dict()))
    assert found["target"] == parse_target(a.name).label and found["dtype"] == advice.precision.dtype, a.key
    assert found["problems"] == plan.check(), a.key
    if plan.placement is not None and plan.placement.run_kind is not None:  # the entries accelerate budgets
        assert found["run"] is not None and found["context"] == 4096, (a.key, found["run"])
        assert found["max_batch"] == plan.max_batch and found["max_context"] == plan.max_context, a.key


def test_the_emitted_cell_uses_the_targets_device_strings(llama: str) -> None:
    code = nbhw.plan(llama, target="TPU v5e", device_map="tpu:0", offline=True).code
    assert 'device_map="tpu:0"' in code
    ast.parse(code)
    quantized = nbhw.quantization(target="Gaudi 2").row("quanto").code
    assert 'device_map="hpu:0"' in quantized


def test_devices_accelerate_does_not_budget_are_checked_against_the_catalog(llama: str) -> None:
    # device_map="tpu:0": accelerate <= 1.15's get_max_memory has no tpu, so the budget is the catalog's 16 GiB per
    # chip; 1.16 budgets the current chip, from the same catalog.
    plan = nbhw.plan(llama, target="TPU v5e", device_map="tpu:0", dtype="bfloat16", offline=True)
    assert plan.placement is not None and plan.placement.devices[0].budget == _entry("tpu-v5e").memory_bytes
    assert plan.placement.kind == "one_device"
    too_big = nbhw.plan(llama, target="TPU v5e", device_map="tpu:0", dtype="float32", offline=True)
    assert too_big.placement is not None and too_big.placement.kind == "too_big"
    assert any(
        "tpu:0 needs 29.9 GiB for the weights, 16.0 GiB " in p and "loading would run out of memory" in p
        for p in too_big.check()
    )


def test_auto_on_several_tpu_chips_budgets_the_current_one_and_says_so(llama: str) -> None:
    order = library_source.auto_memory_order()
    assert order is not None
    plan = nbhw.plan(llama, target="4x TPU v5e", dtype="bfloat16", offline=True)
    assert plan.placement is not None
    budgeted = [k for k in plan.placement.budget or {} if k != "cpu"]
    if "tpu" in order.one_device:  # accelerate >= 1.16
        assert budgeted == [0] and plan.placement.kind == "cpu_offload"
        assert any("budgets one tpu device, the process's current one, not all 4" in n for n in plan.notes)
    else:
        assert budgeted == [] and any("leaves the TPU v5e unused" in p for p in plan.check())


@pytest.mark.slow
def test_the_targets_page_table_is_what_the_script_prints() -> None:
    # The table is for a machine with bitsandbytes installed (its 4-bit column): the wheel beside the venv.
    # It is the pinned libraries' output (scripts/constraints.txt); the compatibility run's other sets differ.
    skip_unless_pinned("The targets page's table", "transformers", "kernels")
    path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    if importlib.util.find_spec("bitsandbytes") is None:
        if not BITSANDBYTES.is_dir():
            pytest.skip(f"bitsandbytes is not installed here nor in {BITSANDBYTES} (scripts/setup.sh test)")
        path.insert(0, str(BITSANDBYTES))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, cwd=ROOT, timeout=600, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 2 + len(_script().TARGETS)
    assert proc.stdout in (ROOT / "docs" / "reference" / "targets.md").read_text(), proc.stdout
