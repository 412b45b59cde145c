"""The Load tab's state without a browser: choices from this machine and the advisor, form -> plan -> preview."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers.integrations.accelerate import expand_device_map

import nbhw
from nbhw.core.advice.quantization_methods import method_key, plan_words
from nbhw.core.advice.status import Status
from nbhw.core.hf.tiny_model import tiny_model_path
from nbhw.core.plan import load_form
from nbhw.core.plan.arguments import NO_DEVICE_MAP, device_map_word, strategy_names
from nbhw.core.plan.load_form import Form
from nbhw.core.plan.placement import live_memory
from tests.support.fakes import GIB, FakeGpu, FakeHardware


@pytest.fixture(scope="module")
def tiny() -> str:
    return str(tiny_model_path())


def values(options: Any) -> list[Any]:
    return [o.value for o in options]


# ---------------------------------------------------------------- choices


def test_choices_on_this_cpu_machine_come_from_detection_and_the_advisor(tiny: str, fake_hw: FakeHardware) -> None:
    fake_hw.linux_cpu_machine()
    choices = load_form.choices(tiny)
    advice = nbhw.attention(tiny)
    usable = [d.device for d in nbhw.detect().devices]
    assert values(choices.options["device_map"]) == [*strategy_names(), *usable, NO_DEVICE_MAP]
    assert choices.target == advice.device == "cpu"
    assert choices.advised_dtype == advice.precision.dtype
    assert [o.label for o in choices.options["dtype"] if o.value == advice.precision.dtype] == [
        f"{advice.precision.dtype} (advised)"
    ]
    # One entry per advisor row (the deprecated paged| aliases left out), after the default.
    rows = [r for r in advice.rows if r.kind != "paged"]
    assert values(choices.options["attn_implementation"]) == [None, *(r.key for r in rows)]
    for option, row in zip(choices.options["attn_implementation"][1:], rows, strict=True):
        assert option.ok == (row.status == Status.WORKS)
        assert option.label.startswith({Status.WORKS: "✓", Status.WONT: "✗"}.get(row.status, "?"))
        assert row.reason in option.reason
    sdpa = choices.option("attn_implementation", "sdpa")
    assert sdpa is not None and sdpa.ok
    assert [(f.key, f.device) for f in choices.memory] == [(str(k), str(k)) for k in live_memory().max_memory]


def test_the_quantization_dropdown_is_fed_by_the_quantization_rows(tiny: str) -> None:
    here = nbhw.quantization()
    offered = load_form.choices(tiny).options["quantization"]
    assert values(offered) == [None, *plan_words()]  # every method transformers quantizes on load
    for option in offered[1:]:
        row = here.row(method_key(option.value))
        assert option.ok == (row.here.status is Status.WORKS), option
        assert option.label.startswith(row.here.status.mark) and row.here.why in option.reason


def test_on_a_target_the_quantization_dropdown_follows_the_targets_gates(tiny: str) -> None:
    t4 = load_form.choices(tiny, target="T4").option("quantization", "fbgemm_fp8")
    h100 = load_form.choices(tiny, target="H100").option("quantization", "fbgemm_fp8")
    assert t4 is not None and not t4.ok and "compute capability >= 9.0" in t4.reason
    # transformers' capability check passes on Hopper: what is left is a package to install there
    assert h100 is not None and h100.ok and h100.reason.startswith(str(Status.PACKAGE))


def test_choices_with_two_gpus_list_them_and_advise_for_the_one_device_map_names(
    fake_hw: FakeHardware, tiny: str
) -> None:
    fake_hw.nvidia(
        FakeGpu(total=80 * GIB, used=2 * GIB),
        FakeGpu(name="Tesla T4", total=16 * GIB, used=1 * GIB, cc=(7, 5), bf16=False),
    )
    auto = load_form.choices(tiny)
    assert values(auto.options["device_map"]) == [*strategy_names(), "cpu", "cuda:0", "cuda:1", NO_DEVICE_MAP]
    assert [(f.key, f.device) for f in auto.memory] == [("0", "cuda:0"), ("1", "cuda:1"), ("cpu", "cpu")]
    assert auto.memory[0].free == 78 * GIB and auto.memory[1].free == 15 * GIB
    assert auto.target == nbhw.attention(tiny).device == "cuda:0"
    assert auto.advised_dtype == "bfloat16"  # the A100
    t4 = load_form.choices(tiny, device_map="cuda:1")
    assert t4.target == "cuda:1"
    assert t4.advised_dtype == nbhw.attention(tiny, device="cuda:1").precision.dtype == "float16"
    assert "older than Ampere" in t4.notes["dtype"]
    assert load_form.choices(tiny, device_map="cpu").target == "cpu"
    assert load_form.choices(tiny, device_map=NO_DEVICE_MAP).target == "cpu"  # from_pretrained's default


def test_a_model_whose_config_cant_be_read_still_gets_hardware_choices() -> None:
    choices = load_form.choices("nbhw-test/not-cached-anywhere", offline=True)
    assert choices.problem is not None and "not-cached-anywhere" in choices.problem
    assert choices.advised_dtype == nbhw.attention().precision.dtype
    assert values(choices.options["attn_implementation"])[:3] == [None, "eager", "sdpa"]


# ---------------------------------------------------------------- preview


FORMS = [
    {},
    {"dtype": "float16"},
    {"dtype": "bfloat16", "attn_implementation": "eager"},
    {"device_map": "sequential", "max_memory": (("cpu", "1GiB"),)},
    {"device_map": "cpu"},
    {"device_map": NO_DEVICE_MAP},
    {"device_map": '{"": "cpu"}', "dtype": "float32"},
    {"use_kernels": True},
    {"attn_implementation": "flash_attention_2"},
]


@pytest.mark.parametrize("fields", FORMS)
def test_the_preview_is_the_plans_code_and_dry_run(tiny: str, fields: dict[str, Any]) -> None:
    form = Form(tiny, **fields)
    preview = load_form.preview(form)
    assert preview.ok, preview.error
    plan = load_form.make_plan(form)
    assert preview.code == plan.code.rstrip("\n")
    assert preview.problems == plan.check()
    assert plan.placement is not None
    assert preview.verdict == plan.placement.verdict


def test_each_control_changes_the_code(tiny: str) -> None:
    base = load_form.preview(Form(tiny, dtype="float32")).code
    changed = {
        "dtype": (Form(tiny, dtype="float16"), "dtype=torch.float16"),
        "attn_implementation": (
            Form(tiny, dtype="float32", attn_implementation="eager"),
            'attn_implementation="eager"',
        ),
        "device_map": (Form(tiny, dtype="float32", device_map="sequential"), 'device_map="sequential"'),
        "use_kernels": (Form(tiny, dtype="float32", use_kernels=True), "use_kernels=True"),
        "max_memory": (Form(tiny, dtype="float32", max_memory=(("cpu", "2GiB"),)), 'max_memory={"cpu": "2GiB"}'),
    }
    for name, (form, text) in changed.items():
        code = load_form.preview(form).code
        assert code != base, name
        assert text in code and text not in base, name


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": ""}, "model: give a Hub id"),
        ({"model": "/no/such/folder"}, "no such folder"),
        ({"device_map": "bogus"}, "valid: auto, balanced"),
        ({"dtype": "int8"}, "valid: auto, float32, float16, bfloat16"),
        ({"attn_implementation": "bogus"}, "valid: eager"),
        ({"max_memory": (("cpu", "lots"),)}, "max_memory size 'lots' is not valid"),
        ({"max_memory": (("gpu", "1GiB"),)}, "max_memory device 'gpu' is not valid"),
        ({"quantization": "3bit"}, "valid: 4bit, 8bit"),
    ],
)
def test_a_mistake_in_an_entry_is_a_one_line_message_not_an_exception(
    tiny: str, fields: dict[str, Any], message: str
) -> None:
    preview = load_form.preview(Form(**{"model": tiny, **fields}))
    assert not preview.ok and preview.error is not None
    assert message in preview.error and "\n" not in preview.error
    assert preview.code == "" and preview.plan is None


def test_form_words_round_trip_into_the_plan(tiny: str) -> None:
    form = Form(
        tiny,
        device_map=device_map_word({"": "cpu"}),
        max_memory=load_form.memory_pairs({0: "1GiB", "cpu": 10**9}),
    )
    assert form.device_map == '{"": "cpu"}'
    assert form.memory_budget() == {"0": "1GiB", "cpu": 10**9}
    assert load_form.memory_pairs(["0=1GiB", "cpu=2GiB"]) == (("0", "1GiB"), ("cpu", "2GiB"))
    assert device_map_word(None) == NO_DEVICE_MAP and device_map_word(0) == "0"
    plan = load_form.make_plan(form)
    assert plan.args.device_map == {"": "cpu"} and plan.args.max_memory == {0: "1GiB", "cpu": 10**9}


def test_placement_blocks_sit_where_transformers_expands_the_device_map(fake_hw: FakeHardware, tiny: str) -> None:
    fake_hw.nvidia(FakeGpu(total=80 * GIB, used=2 * GIB), FakeGpu(total=80 * GIB, used=2 * GIB))
    form = Form(tiny, dtype="float32", max_memory=(("0", "150KB"), ("1", "200KB"), ("cpu", "1GB")))
    preview = load_form.preview(form)
    assert preview.plan is not None and preview.plan.placement is not None
    model = preview.plan.meta_model
    names = [n for n, _ in model.named_parameters()]
    where = expand_device_map(preview.plan.placement.device_map, names)
    layers = [u for u in preview.units if u.layer]
    assert [u.name for u in layers] == [f"model.layers.{i}" for i in range(model.config.num_hidden_layers)]
    assert {u.name for u in preview.units} >= {"model.embed_tokens", "model.norm", "lm_head"}
    for unit in preview.units:
        devices = {where[n] for n in names if n == unit.name or n.startswith(unit.name + ".")}
        shown = {f"cuda:{d}" if isinstance(d, int) else d for d in devices}
        assert shown == {unit.device}, unit
    assert len({u.device for u in preview.units}) > 1  # the budget split it
    assert sum(u.bytes for u in preview.units) == preview.plan.estimate.parameter_bytes  # type: ignore[union-attr]


def test_the_default_model_is_the_tiny_one_when_nothing_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    assert load_form.cached_models() == []
    assert load_form.default_model() == str(tiny_model_path())
    # A cached Hub model with a config.json becomes the default.
    repo = tmp_path / "cache" / "models--org--cached-model"
    for folder in ("blobs", "refs", "snapshots/abc123"):
        (repo / folder).mkdir(parents=True)
    (repo / "blobs" / "c0ffee").write_text("{}")
    (repo / "snapshots" / "abc123" / "config.json").symlink_to("../../blobs/c0ffee")
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    assert load_form.cached_models() == ["org/cached-model"]
    assert load_form.default_model() == "org/cached-model"


def test_building_the_tiny_model_shows_no_progress_bar_and_leaves_the_settings(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from transformers.utils import logging as hf_logging

    from tests.support.memcomm import open_widgets

    widgets, bars = open_widgets(), hf_logging.is_progress_bar_enabled()
    path = tiny_model_path(tmp_path / "tiny")
    assert (path / "model.safetensors").is_file()
    # In a kernel, transformers' "Writing model shards" bar was a set of widgets left open in the %hw cell.
    assert "Writing model shards" not in capfd.readouterr().err
    assert open_widgets() == widgets and hf_logging.is_progress_bar_enabled() == bars
