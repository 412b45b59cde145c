"""The Load tab's Serve mode without a browser: the mode switch's third mode, one control per declared serving
argument, the serving plan's figures, message and cell in the tab (the same as nbhw.plan(task="serve") for the same
words), mistakes as one line, the model shared with the other modes, nbhw.panel(task="serve") and
%hw load --task serve, and nothing left open afterwards."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

import nbhw
from nbhw.core.hardware.targets import target_of
from nbhw.core.plan.load_form import Form
from nbhw.core.serve import serve_form
from nbhw.core.serve.arguments import SERVE_ARGUMENTS, SERVED_ON
from nbhw.core.serve.serve_form import SERVE_CONTROLS, ServeForm
from nbhw.core.serve.serve_plan import ServePlan
from nbhw.core.tasks import TASKS
from nbhw.ui import panel as panels
from nbhw.ui.load import LoadView
from nbhw.ui.worker import Worker
from tests.support.memcomm import open_widgets
from tests.ui.test_load_train_mode import kernel_ip, nbhw_threads, settle, text_of, tiny, worker

__all__ = ["kernel_ip", "tiny", "worker"]  # the Train mode's fixtures, shared

# A small serving plan with a known memory (this machine's RAM moves between two plans; nbhw's tiny model and the
# CPU's reserve hold about 520 MiB of it): hundreds of pages, and a typical request's split, so the scheduler's line
# shows.
ASKED: dict[str, str] = {"context": "64", "device_memory": "600MiB", "page_size": "16", "max_batch_tokens": "128",
                         "memory_percent": "1.0", "prompt": "56", "answer": "8"}  # fmt: skip
VALUES: dict[str, Any] = {"context": 64, "device_memory": "600MiB", "page_size": 16, "max_batch_tokens": 128,
                          "memory_percent": 1.0, "prompt": 56, "answer": 8}  # fmt: skip


@pytest.fixture
def view(tiny: str, worker: Worker) -> Iterator[LoadView]:
    v = LoadView(Form(tiny), worker, models=[tiny])
    settle(worker)
    yield v
    v.close()


def serving(tiny: str, **values: Any) -> ServePlan:
    plan = nbhw.plan(tiny, task="serve", **{**VALUES, **values})
    assert isinstance(plan, ServePlan)
    return plan


def serve(view: LoadView, worker: Worker, **words: Any) -> Any:
    """Switch the tab to Serve, set each control as the browser's messages would, and wait for the plan."""
    view.task.value = "serve"
    assert view.serve is not None
    for name, word in words.items():
        view.serve.control(name).value = word
    settle(worker)
    return view.serve


def assert_shows(shown: Any, plan: ServePlan) -> None:
    """The mode shows the plan: its cell in the code box, its headline as the message, every figure of its text."""
    assert shown.code.code == plan.code.rstrip("\n") and "init_continuous_batching" in shown.code.code
    assert text_of(shown.code.html) == shown.code.code  # what Insert and Copy take is the code shown
    assert text_of(shown.message.value) == "✓ " + plan.headline().removeprefix("nbhw serve: ")
    report = text_of(shown.report.value)
    for name, figure in plan.rows():
        assert name + figure in report, name
    assert plan.command in report


# ---------------------------------------------------------------- the form, without widgets


def test_the_serve_form_is_the_declared_serving_arguments_as_words(tiny: str) -> None:
    assert list(SERVE_CONTROLS) == [a.name for a in SERVE_ARGUMENTS if a.control]
    assert set(SERVE_CONTROLS) == {a.name for a in SERVE_ARGUMENTS} - {"reserve"}
    form = ServeForm.of(tiny, context="8k", dtype="auto", prompt="512", answer="256", compile_level="2")
    assert form.words == {"context": "8k", "prompt": "512", "answer": "256", "compile_level": "2"}  # defaults dropped
    assert (form.word("dtype"), form.word("target"), form.word("memory_percent")) == ("auto", None, None)
    assert form.plan_values() == form.words
    words = ServeForm.form_words({"context": 4096, "memory_percent": 0.9, "compile_level": 2, "target": "T4"})
    assert words == {"context": "4096", "memory_percent": "0.9", "compile_level": "2", "target": "T4"}
    with pytest.raises(nbhw.UserError, match="valid: target, tp_size, dtype, attn_implementation"):
        ServeForm.form_words({"batch": 4})
    with pytest.raises(TypeError, match="the Serve mode has no control 'reserve'"):
        ServeForm.of(tiny, reserve="0")


def test_every_dropdown_offers_what_a_serving_plan_takes() -> None:
    for name, declared in SERVE_CONTROLS.items():
        if declared.control == "dropdown":
            assert ServeForm.options(name), name
    assert [o.value for o in ServeForm.options("dtype")] == ["auto", "float32", "float16", "bfloat16"]
    assert [o.value for o in ServeForm.options("compile_level")] == [None, "0", "1", "2", "3"]
    assert [o.value for o in ServeForm.options("tp_size")] == [None, "1", "2", "4", "8"]
    assert [o.value for o in ServeForm.options("attn_implementation")][:3] == [None, "sdpa", "eager"]
    targets = [o.value for o in ServeForm.options("target")]
    assert targets[0] is None and "T4" in targets and "8x H100 SXM" in targets
    for target in targets[1:]:
        found = target_of(target)
        assert found is not None and found.accelerator.device in SERVED_ON, target


def test_the_preview_is_the_serving_plan_or_one_line(tiny: str) -> None:
    found = serve_form.preview(ServeForm.of(tiny, **ASKED))
    plan = serving(tiny)
    assert found.error is None and found.plan is not None and found.code == plan.code.rstrip("\n")
    assert found.plan.text() == plan.text()
    mistakes = [({"memory_percent": "1.5"}, "memory_percent 1.5 is out of range; valid: a fraction in (0, 1]"),
                ({"prompt": "10", "answer": None}, "prompt and answer describe a typical request together"),
                ({"compile_level": "x"}, "compile_level 'x' is not valid; valid: 0, 1, 2, 3"),
                ({"tp_size": "two"}, "tp_size 'two' is not a number of devices; valid: a whole number"),
                ({"tp_size": "2", "device_memory": None, "target": "T4"},
                 "tp_size 2 needs 2 devices; target='T4' has 1; valid: 1 to 1")]  # fmt: skip
    for words, message in mistakes:
        bad = serve_form.preview(ServeForm.of(tiny, **{**ASKED, **words}))
        assert bad.error is not None and bad.error.startswith(message) and "\n" not in bad.error, bad.error
        assert bad.code == "" and bad.plan is None
    assert "model: give a Hub id" in str(serve_form.preview(ServeForm.of(" ")).error)


# ---------------------------------------------------------------- the widgets


def test_serve_mode_shows_the_serving_plans_figures_and_cell(view: LoadView, worker: Worker, tiny: str) -> None:
    labels = dict(view.task.options)
    assert list(labels.values()) == list(TASKS) and labels["Serve"] == "serve"  # three modes
    assert view.serve is None  # no serving plan runs until the mode is shown
    shown = serve(view, worker, **ASKED)
    assert list(shown.inputs) == list(SERVE_CONTROLS)
    assert all(shown.control(n).description == n for n in SERVE_CONTROLS)
    plan = serving(tiny)
    assert plan.full is not None and plan.typical is not None and plan.longest is not None
    assert_shows(shown, plan)
    report = text_of(shown.report.value)
    for figure in ("paged cache", "requests", "scheduled together", "longest request", "graphs"):
        assert figure in report
    assert view.infer_box.layout.display == "none" and shown.box.layout.display is None
    shown.control("compile_level").value = "2"
    shown.control("attn_implementation").value = "eager"
    settle(worker)
    assert_shows(shown, serving(tiny, compile_level=2, attn_implementation="eager"))
    shown.control("tp_size").value = "2"  # two ranks of the device_memory: the model's own TP plan, each its share
    settle(worker)
    assert_shows(shown, serving(tiny, compile_level=2, attn_implementation="eager", tp_size=2))
    assert "tensor parallel" in text_of(shown.report.value) and "torchrun --nproc_per_node=2" in shown.code.code
    shown.control("tp_size").value = None
    shown.control("device_memory").value = "400MiB"  # less than the weights and the reserve: no cache, said
    settle(worker)
    small = serving(tiny, compile_level=2, attn_implementation="eager", device_memory="400MiB")
    assert small.full is None and text_of(shown.message.value).startswith("✗ ") and "nbhw-bad" in shown.message.value
    assert "no paged cache (transformers can't make the cache" in text_of(shown.message.value)
    assert shown.code.code == small.code.rstrip("\n") and "none: " in text_of(shown.report.value)


def test_a_mistake_is_one_line_in_the_tab_and_nothing_raised(view: LoadView, worker: Worker, tiny: str) -> None:
    shown = serve(view, worker, **ASKED)
    for name, word, message in [("memory_percent", "1.5", "memory_percent 1.5 is out of range"),
                                ("context", "100000", "context 100,000 is more than"),
                                ("answer", "", "prompt and answer describe a typical request together")]:  # fmt: skip
        shown.control(name).value = word
        settle(worker)  # no error in the worker: the mistake is a value
        found = text_of(shown.message.value)
        assert found.startswith("✗ ") and message in found and "\n" not in found, found
        assert shown.code.code == "" and shown.code.html == "" and shown.report.value == ""
        shown.control(name).value = ASKED[name]
    settle(worker)
    assert shown.code.code == serving(tiny).code.rstrip("\n")


def test_switching_modes_keeps_each_ones_values_and_the_model(view: LoadView, worker: Worker, tiny: str) -> None:
    view.control("dtype").value = "float16"
    settle(worker)
    infer_code = view.code.code
    shown = serve(view, worker, **ASKED)
    serve_code = shown.code.code
    view.task.value = "train"
    settle(worker)
    assert view.train is not None and view.train.box.layout.display is None
    assert shown.box.layout.display == "none" and view.infer_box.layout.display == "none"
    view.task.value = "infer"
    settle(worker)
    assert view.code.code == infer_code and view.control("dtype").value == "float16"
    assert shown.box.layout.display == "none" and view.train.box.layout.display == "none"
    view.task.value = "serve"
    settle(worker)
    assert view.serve is shown and shown.code.code == serve_code
    assert {n: shown.control(n).value for n in ASKED} == ASKED
    # A model typed in Serve mode is the model of every mode.
    view.model.value = "/no/such/folder"
    settle(worker)
    assert "no such folder" in text_of(shown.message.value) and shown.code.code == ""
    view.task.value = "train"
    settle(worker)
    assert view.train.form.model == "/no/such/folder"
    view.task.value = "infer"
    settle(worker)
    assert view.form.model == "/no/such/folder"
    view.model.value = tiny
    settle(worker)
    assert view.code.code == infer_code
    view.task.value = "serve"
    settle(worker)
    assert shown.code.code == serve_code


# ---------------------------------------------------------------- the panel, %hw load --task serve


def test_panel_with_task_serve_opens_the_load_tab_in_serve_mode_and_closes_everything(tiny: str) -> None:
    widgets = open_widgets()
    p = nbhw.panel(tiny, tab="Load", task="serve", **VALUES)
    try:
        p.widget  # noqa: B018 (building it starts the views)
        settle(panels.shared_worker())
        assert p.load.task.value == "serve" and p.load.serve is not None and p.load.train is None
        assert {n: p.load.serve.control(n).value for n in ASKED} == ASKED
        assert_shows(p.load.serve, serving(tiny))
        assert p.load.result is None  # the inference plan waits until its mode is shown
        p.load.task.value = "infer"
        settle(panels.shared_worker())
        assert "from_pretrained" in p.load.code.code and p.load.result is not None
    finally:
        p.close()
    assert panels.open_panels() == [] and nbhw_threads() == []
    assert open_widgets() == widgets  # the Serve mode's controls, notes, code box and rows too


def test_panel_task_serve_mistakes_are_one_line_user_errors_and_its_text_is_the_serving_plan(tiny: str) -> None:
    for words, message in [({"batch": 4}, "batch is not for task='serve'; it takes: answer, attn_implementation, "),
                           ({"method": "lora"}, "method is not for task='serve'; it takes: ")]:  # fmt: skip
        with pytest.raises(nbhw.UserError) as err:
            nbhw.panel(tiny, task="serve", **words)
        assert str(err.value).startswith(message) and "\n" not in str(err.value)
    with pytest.raises(nbhw.UserError, match="valid: target, tp_size, dtype"):
        nbhw.panel(tiny, task="serve", reserve=0)  # a serving word without a control: the answer, not the panel
    with pytest.raises(nbhw.UserError, match="memory_percent is for task='serve'"):
        nbhw.panel(tiny, memory_percent=0.9)
    text = nbhw.panel(tiny, task="serve", **VALUES).text()
    assert serving(tiny).text().rstrip() in text and nbhw_threads() == []


def test_hw_load_task_serve_opens_the_serve_mode_prefilled(
    kernel_ip: Any, tiny: str, capsys: pytest.CaptureFixture[str]
) -> None:
    kernel_ip.run_line_magic("load_ext", "nbhw")
    line = (f"load {tiny} --task serve --context 64 --device-memory 600MiB --page-size 16 --max-batch-tokens 128 "
            "--memory-percent 1.0 --prompt 56 --answer 8")  # fmt: skip
    kernel_ip.run_line_magic("hw", line + " --attn eager")
    [p] = panels.open_panels()
    settle(panels.shared_worker())
    assert p.tab == "Load" and p.widget.selected_index == 3 and p.load.task.value == "serve"
    shown = p.load.serve
    assert {n: shown.control(n).value for n in ASKED} == ASKED
    assert shown.control("attn_implementation").value == "eager"
    assert_shows(shown, serving(tiny, attn_implementation="eager"))
    kernel_ip.run_line_magic("unload_ext", "nbhw")
    kernel_ip.run_line_magic("load_ext", "nbhw")
    capsys.readouterr()
    kernel_ip.run_line_magic("hw", line + " --json")  # --json, --emit and a word without a control: no panel
    assert json.loads(capsys.readouterr().out)["cache"]["sectors"] == serving(tiny).paged.sectors  # type: ignore[union-attr]
    kernel_ip.run_line_magic("hw", line + " --emit")
    assert kernel_ip.rl_next_input == serving(tiny).code and panels.open_panels() == []
    kernel_ip.run_line_magic("hw", line + " --reserve 0")
    assert panels.open_panels() == []
