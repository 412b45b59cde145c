"""Who picks what: nbhw's answer against what transformers and accelerate really do."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from nbhw.core.hardware import detect, who_picks
from nbhw.core.hf import library_source
from nbhw.core.hf.tiny_model import tiny_model_path
from tests.support.fakes import FakeGpu, FakeHardware

# accelerate >= 1.16 asks torch.accelerator for its device first (get_torch_accelerator_backend); older versions
# test each backend in a chain. The tests below hold for the version installed.
_IMPORTS = library_source.library_file("accelerate", "utils/imports.py")
ACCELERATE_ASKS_TORCH = _IMPORTS is not None and "def get_torch_accelerator_backend(" in _IMPORTS.read_text()


def picks() -> dict[str, str]:
    return {c.who: c.device for c in detect.detect().choices}


@pytest.fixture(scope="module")
def tiny() -> Path:
    return tiny_model_path()


def _fresh_trainer_device(tmp_path: Path) -> torch.device:
    from accelerate.state import AcceleratorState, PartialState
    from transformers import TrainingArguments

    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState._reset_state()
    device = TrainingArguments(output_dir=str(tmp_path), report_to=[]).device
    AcceleratorState._reset_state(reset_partial_state=True)
    return device


def fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, files: dict[str, str]) -> None:
    """An importable package ``name`` on sys.path with these files (its source is what library_source reads)."""
    for relative, text in {"__init__.py": "", **files}.items():
        path = tmp_path / name / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_orders_are_read_from_the_installed_libraries() -> None:
    trainer = library_source.trainer_order()
    pipe = library_source.pipeline_order()
    auto = library_source.auto_memory_order()
    acc = library_source.accelerate_default_order()
    assert trainer and pipe and auto and acc
    assert [s.probe for s in trainer.steps] == [
        "mps",
        "xpu",
        "mlu",
        "musa",
        "npu",
        "hpu",
        "neuron",
        "tpu",
        "cuda",
        "env",
    ]
    assert trainer.steps[1].device == "xpu:0" and trainer.steps[-1].device == "ACCELERATE_TORCH_DEVICE"
    assert [s.probe for s in pipe.steps] == ["mlu", "musa", "cuda", "npu", "hpu", "xpu", "mps", "else"]
    assert "PartialState.default_device" in acc.source and "get_max_memory" in auto.source
    if ACCELERATE_ASKS_TORCH:  # accelerate >= 1.16: torch's accelerator, then hpu, then neuron, else none
        for order in (auto, acc):
            assert [(s.probe, s.device) for s in order.steps] == [
                ("accelerator", None), ("hpu", "hpu"), ("neuron", "neuron"), ("else", None)
            ]  # fmt: skip
            assert order.source.endswith("via accelerate/utils/imports.py:get_torch_accelerator_backend")
        assert auto.one_device == ("tpu",) and acc.one_device == ()
    else:  # accelerate <= 1.15: a chain of availability checks in each function
        assert [s.device for s in auto.steps] == ["npu", "mlu", "sdaa", "musa", "xpu", "hpu", "cuda"]
        assert [s.probe for s in acc.steps][:3] == ["mps", "mlu", "sdaa"]


def test_a_pick_handed_to_torchs_accelerator_is_read_through_the_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """accelerate 1.16's shape: the function calls a helper that asks torch first, then checks one backend at a time."""
    fake_package(tmp_path, monkeypatch, "fakeacc", {
        "utils/modeling.py":
        "def get_max_memory(max_memory=None):\n"
        "    device_type, module = get_torch_accelerator_backend()\n"
        "    devices = list(range(module.device_count()))\n"
        "    if device_type == 'tpu':\n        devices = [torch.accelerator.current_device_index()]\n"
        "    return devices\n",
        "utils/imports.py":
        "def get_torch_accelerator_backend(check_available=True):\n"
        "    try:\n        device = torch.accelerator.current_accelerator()\n"
        "    except RuntimeError:\n        device = None\n"
        "    if device is not None and is_available(device):\n        return device.type, torch.accelerator\n"
        "    if is_neuron_available():\n        return 'neuron', torch.neuron\n"
        "    if is_hpu_available():\n        return 'hpu', torch.hpu\n"
        "    return None, None\n",
    })  # fmt: skip
    order = library_source.read_order("fakeacc", "utils/modeling.py", "get_max_memory")
    assert order is not None and order.one_device == ("tpu",)
    assert [(s.probe, s.device) for s in order.steps] == [
        ("accelerator", None), ("neuron", "neuron"), ("hpu", "hpu"), ("else", None)
    ]  # fmt: skip


def test_a_changed_library_order_changes_the_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_package(tmp_path, monkeypatch, "fakelib", {
        "training_args.py":
        "class TrainingArguments:\n"
        "    def _setup_devices(self):\n"
        "        if self.use_cpu:\n            device = torch.device('cpu')\n"
        "        elif is_torch_cuda_available():\n            device = torch.device('cuda:0')\n"
        "        elif is_torch_xpu_available():\n            device = torch.device('xpu:0')\n"
        "        else:\n            device = torch.device('cpu')\n"
        "        return device\n",
    })  # fmt: skip
    order = library_source.read_order("fakelib", "training_args.py", "TrainingArguments._setup_devices")
    assert order is not None
    assert [(s.probe, s.device) for s in order.steps] == [("cuda", "cuda:0"), ("xpu", "xpu:0"), ("else", "cpu")]


def test_an_unreadable_order_is_reported_not_guessed() -> None:
    c = who_picks.trainer([], None)
    assert c.device == "unknown" and "does not guess" in c.why


def test_on_this_cpu_machine_trainer_and_pipeline_really_pick_what_nbhw_says(tmp_path: Path, tiny: Path) -> None:
    from transformers import pipeline

    said = picks()
    assert said["from_pretrained(model)"] == "cpu"
    assert said['from_pretrained(model, device_map="auto")'] == "cpu"
    assert torch.device(said["TrainingArguments(...).device"]) == _fresh_trainer_device(tmp_path)
    pipe = pipeline("text-generation", model=str(tiny))
    assert torch.device(said["pipeline(task, model=...)"]) == pipe.device
    from accelerate import PartialState

    assert torch.device(said["Accelerator().device"]) == PartialState().default_device


def test_accelerate_torch_device_is_the_trainer_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "meta")
    said = picks()
    assert said["TrainingArguments(...).device"] == "meta"
    assert said["Accelerator().device"] == "meta"
    assert _fresh_trainer_device(tmp_path) == torch.device("meta")


def test_device_map_auto_with_no_accelerator_really_lands_on_cpu(tiny: Path) -> None:
    from transformers import AutoModelForCausalLM

    said = picks()['from_pretrained(model, device_map="auto")']
    model = AutoModelForCausalLM.from_pretrained(tiny, device_map="auto")
    assert {str(p.device) for p in model.parameters()} == {said}


def _patch_trainer_probes(monkeypatch: pytest.MonkeyPatch, usable: set[str]) -> None:
    """Make transformers' own availability checks agree with the faked hardware."""
    import transformers.training_args as ta

    def answer(value: bool) -> object:
        return lambda *args, **kwargs: value

    for key in ("mps", "xpu", "mlu", "musa", "npu", "hpu", "neuron", "tpu"):
        monkeypatch.setattr(ta, f"is_torch_{key}_available", answer(key in usable))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: "cuda" in usable)

    class TorchWithAnyDevice:
        """torch, except that torch.device accepts device types this build has not registered (mlu, npu, ...)."""

        def __getattr__(self, name: str) -> object:
            return getattr(torch, name)

        @staticmethod
        def device(spec: str) -> str:
            return spec

    monkeypatch.setattr(ta, "torch", TorchWithAnyDevice())


@pytest.mark.parametrize(
    ("usable", "expected"),
    [
        ({"xpu"}, "xpu:0"),
        ({"npu", "mlu"}, "mlu:0"),
        ({"hpu", "neuron"}, "hpu:0"),
        ({"musa", "npu"}, "musa:0"),
    ],
)
def test_trainer_order_matches_the_real_trainer_on_faked_hardware(
    fake_hw: FakeHardware, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, usable: set[str], expected: str
) -> None:
    modules = {
        "npu": "torch_npu",
        "mlu": "torch_mlu",
        "musa": "torch_musa",
        "hpu": "habana_frameworks.torch",
        "neuron": "torch_neuronx",
    }
    for key in usable:
        dev = fake_hw.xpu(FakeGpu()) if key == "xpu" else fake_hw.plugin(key, modules[key], FakeGpu())
        assert dev is not None
        monkeypatch.setattr(dev, "set_device", lambda d: None, raising=False)
    said = picks()["TrainingArguments(...).device"]
    assert said == expected
    _patch_trainer_probes(monkeypatch, usable)
    from accelerate.state import PartialState

    monkeypatch.setattr(PartialState, "default_device", property(lambda self: torch.device("cpu")))
    assert str(_fresh_trainer_device(tmp_path)) == expected


def test_nvidia_gpus_show_in_auto_trainer_pipeline_and_dataparallel_note(fake_hw: FakeHardware) -> None:
    fake_hw.nvidia(FakeGpu(), FakeGpu())
    hw = detect.detect()
    c = {x.who: x for x in hw.choices}
    assert c['from_pretrained(model, device_map="auto")'].device == "cuda:0, cuda:1, cpu"
    assert c["TrainingArguments(...).device"].device == "cuda:0"
    assert any(
        "DataParallel" in n and "torchrun --nproc_per_node=2" in n for n in c["TrainingArguments(...).device"].notes
    )
    assert c["pipeline(task, model=...)"].device == "cuda:0"
    assert c["Accelerator().device"].device == "cuda"


def test_mps_replaces_the_cpu_budget_in_auto(fake_hw: FakeHardware) -> None:
    fake_hw.mps()
    c = {x.who: x.device for x in detect.detect().choices}
    assert c['from_pretrained(model, device_map="auto")'] == "mps"
    assert c["TrainingArguments(...).device"] == "mps"
    assert c["pipeline(task, model=...)"] == "mps:0"


def test_accelerate_memory_probe_still_swaps_cpu_for_mps() -> None:
    path = library_source.library_file("accelerate", "utils/modeling.py")
    source = library_source.function_source(path, "get_max_memory") if path else None
    assert source is not None and 'max_memory["mps"]' in source and 'max_memory["cpu"]' in source


def accelerate_device_type() -> str | None:
    """accelerate's own answer on the faked hardware (>= 1.16), its kept availability answers forgotten first."""
    from accelerate.utils import imports

    for name in dir(imports):
        clear = getattr(getattr(imports, name), "cache_clear", None)
        if name.startswith("is_") and clear is not None:
            clear()
    device_type, _ = imports.get_torch_accelerator_backend()
    return device_type


@pytest.mark.skipif(ACCELERATE_ASKS_TORCH, reason="accelerate <= 1.15: its chains leave out tpu and neuron")
@pytest.mark.parametrize("kind", ["tpu", "neuron"])
def test_neuron_and_tpu_get_the_explicit_device_map_note(fake_hw: FakeHardware, kind: str) -> None:
    if kind == "tpu":
        fake_hw.tpu(count=8)
    else:
        fake_hw.plugin("neuron", "torch_neuronx", FakeGpu(name="Trainium2"))
    c = {x.who: x for x in detect.detect().choices}
    auto = c['from_pretrained(model, device_map="auto")']
    assert auto.device == "cpu" and any(f'device_map="{kind}"' in n for n in auto.notes)
    assert c["TrainingArguments(...).device"].device == f"{kind}:0"
    assert any(f'device="{kind}"' in n for n in c["pipeline(task, model=...)"].notes)


@pytest.mark.skipif(not ACCELERATE_ASKS_TORCH, reason="accelerate >= 1.16 asks torch.accelerator first")
def test_auto_budgets_torchs_accelerator_one_tpu_chip_and_every_neuron_core(fake_hw: FakeHardware) -> None:
    fake_hw.tpu(count=8)
    c = {x.who: x for x in detect.detect().choices}
    auto = c['from_pretrained(model, device_map="auto")']
    assert auto.device == "tpu:0, cpu" and accelerate_device_type() == "tpu"
    assert any("budgets one tpu device" in n for n in auto.notes)
    assert not any('device_map="tpu"' in n for n in auto.notes)
    assert c["Accelerator().device"].device == "tpu" and "torch's accelerator" in c["Accelerator().device"].why
    assert any('device="tpu"' in n for n in c["pipeline(task, model=...)"].notes)  # pipeline's own chain has no tpu


@pytest.mark.skipif(not ACCELERATE_ASKS_TORCH, reason="accelerate >= 1.16 asks torch.accelerator first")
def test_a_registered_plugin_is_torchs_accelerator_and_auto_fills_it(fake_hw: FakeHardware) -> None:
    fake_hw.plugin("npu", "torch_npu", FakeGpu(name="Ascend 910B"), FakeGpu(name="Ascend 910B"))
    c = {x.who: x.device for x in detect.detect().choices}
    assert c['from_pretrained(model, device_map="auto")'] == "npu:0, npu:1, cpu"
    assert c["Accelerator().device"] == "npu"


@pytest.mark.skipif(not ACCELERATE_ASKS_TORCH, reason="accelerate >= 1.16 asks torch.accelerator first")
def test_an_accelerator_without_a_device_falls_through_to_cpu_as_accelerate_does(fake_hw: FakeHardware) -> None:
    fake_hw.xpu()  # an XPU build of torch, no Intel GPU
    c = {x.who: x.device for x in detect.detect().choices}
    assert c['from_pretrained(model, device_map="auto")'] == "cpu"
    assert c["Accelerator().device"] == "cpu"


def test_torch_default_device_changes_from_pretrained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "get_default_device", lambda: torch.device("meta"))
    c = who_picks.from_pretrained_default()
    assert c.device == "meta" and "set_default_device" in c.why


def test_use_cpu_and_distributed_notes(fake_hw: FakeHardware) -> None:
    fake_hw.env(LOCAL_RANK="1", WORLD_SIZE="2")
    c = {x.who: x for x in detect.detect().choices}["TrainingArguments(...).device"]
    assert "use_cpu=True forces cpu" in c.notes
    assert any("LOCAL_RANK" in n for n in c.notes)
    assert os.environ["WORLD_SIZE"] == "2"
