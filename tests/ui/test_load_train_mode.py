"""The Load tab's Train mode without a browser: the mode switch, one control per declared training argument, the
training plan's verdict, breakdown, largest batch and code in the tab, mistakes as one line, each mode keeping its
own values, nbhw.panel(task="train") and %hw load --task train, and nothing left open afterwards."""

from __future__ import annotations

import html
import json
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import nbhw
from nbhw.core import tasks
from nbhw.core.hardware.targets import target_of
from nbhw.core.hf.tiny_model import tiny_model_path
from nbhw.core.plan.load_form import Form
from nbhw.core.tasks import TASKS
from nbhw.core.train import train_form
from nbhw.core.train.arguments import TRAIN_ARGUMENTS, TRAINED_ON
from nbhw.core.train.train_form import TRAIN_CONTROLS, TrainForm
from nbhw.ui import panel as panels
from nbhw.ui.load import LoadView
from nbhw.ui.worker import Worker
from tests.support.memcomm import open_widgets

# A small training plan on this CPU with a known budget: a verdict and a largest batch, in a second or two.
ASKED: dict[str, str] = {"method": "full", "batch": "2", "context": "128", "device_type": "cpu",
                         "device_memory": "4GiB"}  # fmt: skip


@pytest.fixture(scope="module")
def tiny() -> str:
    return str(tiny_model_path())


@pytest.fixture
def worker() -> Iterator[Worker]:
    w = Worker(debounce=0.05)
    yield w
    w.stop()


@pytest.fixture
def view(tiny: str, worker: Worker) -> Iterator[LoadView]:
    v = LoadView(Form(tiny), worker, models=[tiny])
    settle(worker)
    yield v
    v.close()


def settle(worker: Worker) -> None:
    assert worker.wait(120), "the plan did not finish"
    assert worker.errors == []


def text_of(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def nbhw_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("nbhw")]


def train(view: LoadView, worker: Worker, **words: Any) -> Any:
    """Switch the tab to Train, set each control as the browser's messages would, and wait for the plan."""
    view.task.value = "train"
    assert view.train is not None
    for name, word in words.items():
        view.train.control(name).value = word
    settle(worker)
    return view.train


# ---------------------------------------------------------------- the form, without widgets


def test_the_train_form_is_the_declared_training_arguments_as_words(tiny: str) -> None:
    assert list(TRAIN_CONTROLS) == [a.name for a in TRAIN_ARGUMENTS if a.control]
    assert {"method", "batch", "context", "device_memory", "device_type", "target"} <= set(TRAIN_CONTROLS)
    form = TrainForm.of(tiny, method="lora", batch="1", lora_target_modules="q_proj, v_proj", device_memory="8GiB")
    assert form.words == {"lora_target_modules": "q_proj, v_proj", "device_memory": "8GiB"}  # defaults dropped
    assert (form.word("method"), form.word("context"), form.word("offload"), form.word("target")) == (
        "lora", "2048", False, None,
    )  # fmt: skip
    assert form.plan_values() == {"lora_target_modules": ("q_proj", "v_proj"), "device_memory": "8GiB"}
    words = train_form.form_words({"context": 4096, "lora_target_modules": ("q_proj", "v_proj"), "offload": True})
    assert words == {"context": "4096", "lora_target_modules": "q_proj v_proj", "offload": True}
    with pytest.raises(nbhw.UserError, match="valid: method, batch, context"):
        train_form.form_words({"device_map": "auto"})


def test_every_dropdown_offers_its_declared_choices_and_targets_are_gpus_a_plan_trains_on() -> None:
    for name, declared in TRAIN_CONTROLS.items():
        if declared.control == "dropdown":
            offered = [o.value for o in train_form.options(name)]
            assert offered == list(declared.choices or offered) and offered, name
    targets = [o.value for o in train_form.options("target")]
    assert targets[0] is None and "T4" in targets and "8x H100 SXM" in targets
    for target in targets[1:]:
        found = target_of(target)
        assert found is not None and found.accelerator.device in TRAINED_ON, target
    assert [task for _, task in tasks.task_options()] == list(TASKS)  # a mode per task


def test_the_preview_is_the_training_plan_or_one_line(tiny: str) -> None:
    found = train_form.preview(TrainForm.of(tiny, **ASKED))
    plan = nbhw.train_plan(tiny, **ASKED)
    assert found.error is None and found.code == plan.code.rstrip("\n") and found.verdict == plan.verdict
    assert found.largest_batch == plan.max_batch and found.largest_batch
    mistakes = [({"lora_r": "0"}, "lora_r must be a whole number of at least 1"),
                ({"batch": "x"}, "batch 'x' is not a whole number"),
                ({"strategy": "single", "devices": "2"}, "strategy='single' runs on one device")]  # fmt: skip
    for words, message in mistakes:
        bad = train_form.preview(TrainForm.of(tiny, **words))
        assert bad.error is not None and bad.error.startswith(message) and "\n" not in bad.error
        assert bad.code == "" and bad.largest_batch is None
    assert "model: give a Hub id" in str(train_form.preview(TrainForm.of(" ")).error)


# ---------------------------------------------------------------- the widgets


def test_train_mode_shows_the_training_plans_verdict_breakdown_largest_batch_and_code(
    view: LoadView, worker: Worker, tiny: str
) -> None:
    labels = dict(view.task.options)
    assert list(labels.values()) == list(TASKS) and labels["Load / generate"] == "infer" and labels["Train"] == "train"
    assert view.train is None  # no training plan runs until the mode is shown
    shown = train(view, worker, **ASKED)
    assert list(shown.inputs) == list(TRAIN_CONTROLS)
    assert all(shown.control(n).description == n for n in TRAIN_CONTROLS)
    plan = nbhw.train_plan(tiny, **ASKED)
    assert shown.code.code == plan.code.rstrip("\n") and "trainer.train()" in shown.code.code
    assert text_of(shown.code.html) == shown.code.code  # what Insert and Copy take is the code shown
    assert text_of(shown.message.value) == f"✓ {plan.verdict}" and plan.verdict.startswith("fits: ")
    report = text_of(shown.report.value)
    assert f"Largest batch that fits: {plan.max_batch:,} rows per device" in report
    assert plan.text().rstrip() in report  # the per-device breakdown, verdict and launch, as nbhw.train_plan says
    assert view.infer_box.layout.display == "none" and shown.box.layout.display is None
    shown.control("device_memory").value = "1MiB"
    settle(worker)
    small = nbhw.train_plan(tiny, **{**ASKED, "device_memory": "1MiB"})
    assert text_of(shown.message.value) == f"✗ {small.verdict}" and "nbhw-bad" in shown.message.value
    assert "Largest batch that fits: none" in text_of(shown.report.value)


def test_a_mistake_is_one_line_in_the_tab_and_nothing_raised(view: LoadView, worker: Worker, tiny: str) -> None:
    shown = train(view, worker, **ASKED)
    for name, word, message in [("lora_r", "0", "lora_r must be a whole number of at least 1"),
                                ("batch", "x", "batch 'x' is not a whole number")]:  # fmt: skip
        shown.control(name).value = word
        settle(worker)  # no error in the worker: the mistake is a value
        assert text_of(shown.message.value).startswith(f"✗ {message}")
        assert shown.code.code == "" and shown.code.html == "" and shown.report.value == ""
        shown.control(name).value = ASKED.get(name, TrainForm.of(tiny).word(name))
    settle(worker)
    assert shown.code.code == nbhw.train_plan(tiny, **ASKED).code.rstrip("\n")


def test_each_mode_keeps_its_own_values_and_the_model_is_shared(view: LoadView, worker: Worker, tiny: str) -> None:
    view.control("dtype").value = "float16"
    settle(worker)
    infer_code, infer_report = view.code.code, view.report.value
    assert "dtype=torch.float16" in infer_code
    shown = train(view, worker, **ASKED)
    train_code = shown.code.code
    view.task.value = "infer"
    settle(worker)
    assert view.code.code == infer_code and view.report.value == infer_report and view.form.dtype == "float16"
    assert view.control("dtype").value == "float16" and view.infer_box.layout.display is None
    assert shown.box.layout.display == "none"
    view.task.value = "train"
    settle(worker)
    assert view.train is shown and shown.code.code == train_code
    assert {n: shown.control(n).value for n in ASKED} == ASKED
    # A model typed in Train mode is the model of both modes.
    view.model.value = "/no/such/folder"
    settle(worker)
    assert "no such folder" in text_of(shown.message.value) and shown.code.code == ""
    view.task.value = "infer"
    settle(worker)
    assert view.form.model == "/no/such/folder" and "no such folder" in text_of(view.message.value)
    view.model.value = tiny
    settle(worker)
    assert view.code.code == infer_code
    view.task.value = "train"
    settle(worker)
    assert shown.code.code == train_code


def test_background_training_plans_write_nothing_to_stdout_or_stderr(
    view: LoadView, worker: Worker, capfd: pytest.CaptureFixture[str], recwarn: pytest.WarningsRecorder
) -> None:
    capfd.readouterr()
    shown = train(view, worker, **ASKED)
    shown.control("gradient_checkpointing").value = True  # transformers warns about its old name: not in a cell
    settle(worker)
    assert capfd.readouterr() == ("", "")
    assert [str(w.message) for w in recwarn] == []


# ---------------------------------------------------------------- the panel, %hw load --task train


def test_panel_with_task_train_opens_the_load_tab_in_train_mode_and_closes_everything(tiny: str) -> None:
    widgets = open_widgets()
    p = nbhw.panel(tiny, tab="Load", task="train", **ASKED)
    try:
        p.widget  # noqa: B018 (building it starts the views)
        settle(panels.shared_worker())
        assert p.load.task.value == "train" and p.load.train is not None
        assert {n: p.load.train.control(n).value for n in ASKED} == ASKED
        assert p.load.train.code.code == nbhw.train_plan(tiny, **ASKED).code.rstrip("\n")
        assert p.load.result is None  # the inference plan waits until its mode is shown
        p.load.task.value = "infer"
        settle(panels.shared_worker())
        assert "from_pretrained" in p.load.code.code and p.load.result is not None
    finally:
        p.close()
    assert panels.open_panels() == [] and nbhw_threads() == []
    assert open_widgets() == widgets  # the Train mode's controls, notes, code box and rows too


def test_panel_task_train_mistakes_are_user_errors_and_its_text_is_the_training_plan(tiny: str) -> None:
    with pytest.raises(nbhw.UserError, match="device_map is for task='infer'; task='train' takes: batch, "):
        nbhw.panel(tiny, task="train", device_map="auto")
    with pytest.raises(nbhw.UserError, match="lora_r is for task='train'"):
        nbhw.panel(tiny, lora_r=8)
    with pytest.raises(nbhw.UserError, match="valid: infer, train"):
        nbhw.panel(tiny, task="finetune")
    text = nbhw.panel(tiny, task="train", **ASKED).text()
    assert nbhw.train_plan(tiny, **ASKED).text().rstrip() in text and nbhw_threads() == []


@pytest.fixture
def kernel_ip(ip: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The IPython shell as if a Jupyter front end were attached (widgets render)."""
    monkeypatch.setattr(ip, "kernel", object(), raising=False)
    return ip


def test_hw_load_task_train_opens_the_train_mode_prefilled(
    kernel_ip: Any, tiny: str, capsys: pytest.CaptureFixture[str]
) -> None:
    kernel_ip.run_line_magic("load_ext", "nbhw")
    line = f"load {tiny} --task train --method full --batch 2 --context 128 --device-type cpu --device-memory 4GiB"
    kernel_ip.run_line_magic("hw", line + " --gradient-checkpointing")
    [p] = panels.open_panels()
    settle(panels.shared_worker())
    assert p.tab == "Load" and p.widget.selected_index == 3 and p.load.task.value == "train"
    shown = p.load.train
    assert {n: shown.control(n).value for n in ASKED} == ASKED and shown.control("gradient_checkpointing").value
    plan = nbhw.train_plan(tiny, **ASKED, gradient_checkpointing=True)
    assert shown.code.code == plan.code.rstrip("\n") and text_of(shown.message.value) == f"✓ {plan.verdict}"
    kernel_ip.run_line_magic("unload_ext", "nbhw")
    kernel_ip.run_line_magic("load_ext", "nbhw")
    capsys.readouterr()
    kernel_ip.run_line_magic("hw", line + " --json")  # --json and --emit stay as they are: no panel
    assert json.loads(capsys.readouterr().out)["verdict"] == nbhw.train_plan(tiny, **ASKED).verdict
    kernel_ip.run_line_magic("hw", line + " --emit")
    assert kernel_ip.rl_next_input == nbhw.train_plan(tiny, **ASKED).code and panels.open_panels() == []
