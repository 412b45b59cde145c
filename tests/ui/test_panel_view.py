"""The panel's widgets without a browser: the worker's ordering and debouncing, the Load tab following its controls,
messages for mistakes, the tabs, %hw and %hw load, and nothing left running afterwards."""

from __future__ import annotations

import hashlib
import html
import json
import logging
import re
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError

import nbhw
from nbhw.core.fit.fit_form import fit_form
from nbhw.core.hf import dryrun, meta_build
from nbhw.core.hf.tiny_model import tiny_model_path
from nbhw.core.plan import codegen, load_form, plan_view
from nbhw.core.plan.load_form import Form
from nbhw.core.plan.outside_tensors import framework_reserve
from nbhw.core.render import size
from nbhw.ui import load as load_ui
from nbhw.ui import memory as memory_ui
from nbhw.ui import panel as panels
from nbhw.ui.codebox import highlight
from nbhw.ui.load import LoadView
from nbhw.ui.worker import LOCK, THREAD_NAME, Worker, last
from tests.support.memcomm import open_widgets

ROOT = Path(__file__).resolve().parents[2]


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
    assert worker.wait(120), "the first plan did not finish"
    yield v
    v.close()


def settle(worker: Worker) -> None:
    assert worker.wait(60)
    assert worker.errors == []


def text_of(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


# ---------------------------------------------------------------- the worker


def test_a_stale_result_never_overwrites_a_newer_one(worker: Worker) -> None:
    applied: list[str] = []
    started = threading.Event()

    def slow() -> str:
        started.set()
        time.sleep(0.3)
        return "old"

    worker.submit("k", slow, applied.append, delay=0)
    assert started.wait(5)
    worker.submit("k", lambda: "new", applied.append)  # while the old one computes
    settle(worker)
    assert applied == ["new"]
    assert worker.dropped == 1


def test_a_burst_of_changes_is_computed_once(worker: Worker) -> None:
    computed: list[int] = []
    applied: list[int] = []
    for i in range(20):
        worker.submit("k", lambda i=i: computed.append(i) or i, applied.append)
    settle(worker)
    assert computed == [19] and applied == [19]


def test_a_staged_job_shows_its_parts_in_order_and_a_stale_one_computes_no_later_part(worker: Worker) -> None:
    applied: list[tuple[str, bool]] = []
    computed: list[str] = []
    closed: list[str] = []

    def staged(job: str) -> Iterator[tuple[str, bool]]:
        try:
            for name in ("code", "checks", "run"):
                computed.append(f"{job} {name}")
                yield f"{job} {name}", name == "run"  # (the part, done)
        finally:
            closed.append(job)

    def apply(part: tuple[str, bool]) -> None:
        applied.append(part)
        if part[0] == "old code":  # a control changes right after the first part shows
            worker.submit_parts("k", lambda: staged("new"), apply, delay=0)

    worker.submit_parts("k", lambda: staged("old"), apply, delay=0)
    settle(worker)
    assert computed == ["old code", "new code", "new checks", "new run"]  # "old checks" never computed
    assert applied == [("old code", False), ("new code", False), ("new checks", False), ("new run", True)]
    assert closed == ["old", "new"] and (worker.applied, worker.dropped) == (1, 1)


def test_a_stale_jobs_dry_run_stops_between_two_ops(worker: Worker) -> None:
    import torch

    applied: list[str] = []
    ops: list[int] = []

    def staged() -> Iterator[str]:
        yield "code"
        x = torch.ones(4, device="meta")
        with dryrun.tracker():
            for i in range(20 * dryrun.CHECK_EVERY):
                if i == dryrun.CHECK_EVERY // 2:  # a control changes while the run is being counted
                    worker.submit("k", lambda: "newer", applied.append, delay=0)
                x = x + 1
                ops.append(i)
        yield "run"

    worker.submit_parts("k", staged, applied.append, delay=0)
    settle(worker)
    assert applied == ["code", "newer"]
    assert len(ops) < dryrun.CHECK_EVERY  # stopped at the tracker's next ask, not at the end of the part


def test_the_load_tabs_parts_come_quickest_first_and_only_the_last_is_done(tiny: str) -> None:
    parts = list(load_ui.parts(Form(tiny)))
    assert [p.done for p in parts] == [False, False, False, True]
    said = ["the dry run and the estimate are coming", "the run at 256 tokens", "max context and max batch"]
    assert [text_of(p.report).startswith(s) for p, s in zip(parts[:3], said, strict=True)] == [True, True, True]
    assert parts[0].message == "<span class='nbhw-note'>checking with transformers…</span>"
    assert all("nbhw-coming" in p.report for p in parts[:3]) and "nbhw-coming" not in parts[-1].report
    final = last(load_ui.parts(Form(tiny)))  # outside the worker: the whole answer
    assert final.done and final.preview.code == parts[-1].preview.code


def test_jobs_of_different_kinds_all_run_and_apply_under_the_widget_lock(worker: Worker) -> None:
    held: list[bool] = []

    def apply(_: Any) -> None:
        # The lock is held by this (the worker's) thread: another thread can't take it now.
        took = threading.Thread(target=lambda: held.append(LOCK.acquire(timeout=0.05)))
        took.start()
        took.join()

    for key in ("a", "b", "c"):
        worker.submit(key, lambda: None, apply)
    settle(worker)
    assert held == [False, False, False]


def test_the_thread_is_named_never_prints_and_stops(worker: Worker, capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> None:
        raise RuntimeError("a bug in a view")

    worker.submit("k", broken, lambda _: None, delay=0)
    assert worker.wait(10)
    assert [t.name for t in threading.enumerate() if t.name == THREAD_NAME] == [THREAD_NAME]
    assert [str(e) for e in worker.errors] == ["a bug in a view"]
    assert capsys.readouterr() == ("", "")
    worker.submit("k", lambda: 1, lambda _: None)  # the thread survived the bug
    settle_ok = worker.wait(10)
    worker.stop()
    worker.stop()  # idempotent
    assert settle_ok and not worker.running
    assert worker.submit("k", lambda: 1, lambda _: None) == 0


# ---------------------------------------------------------------- the Load tab


def test_the_load_tab_starts_on_the_advised_dtype_with_the_machines_choices(view: LoadView, tiny: str) -> None:
    advice = nbhw.attention(tiny)
    assert view.control("dtype").value == advice.precision.dtype == view.form.dtype
    assert (f"{advice.precision.dtype} (advised)", advice.precision.dtype) in view.control("dtype").options
    assert [v for _, v in view.control("device_map").options][:4] == [
        "auto",
        "balanced",
        "balanced_low_0",
        "sequential",
    ]
    labels = {v: label for label, v in view.control("attn_implementation").options}
    assert labels["sdpa"].startswith("✓") and labels["flash_attention_2"].startswith("✗")
    assert view.code.code == nbhw.plan(tiny, dtype=advice.precision.dtype).code.rstrip("\n")
    assert "✓ Dry run" in view.message.value
    assert "Placement: fits on one device (cpu)" in text_of(view.picture.value)
    assert "Estimate" in view.report.value and "parameters" in view.report.value


@pytest.mark.parametrize(
    ("control", "value", "expected"),
    [
        ("dtype", "float16", "dtype=torch.float16"),
        ("attn_implementation", "eager", 'attn_implementation="eager"'),
        ("device_map", "sequential", 'device_map="sequential"'),
        ("use_kernels", "True", "use_kernels=True"),
        ("use_kernels", "False", "use_kernels=False"),
    ],
)
def test_changing_a_control_replans_in_the_background(
    view: LoadView, worker: Worker, control: str, value: Any, expected: str
) -> None:
    before = view.code.code
    view.control(control).value = value  # as the browser's message sets it
    settle(worker)
    assert expected in view.code.code and expected not in before
    assert view.code.code == load_form.make_plan(view.form).code.rstrip("\n")
    assert view.code.html and text_of(view.code.html) == view.code.code


def test_the_padding_dropdown_replans_the_run_with_the_same_code(view: LoadView, worker: Worker) -> None:
    assert view.control("padding").value == "left"
    assert [o[1] for o in view.control("padding").options] == ["left", "none"]
    view.control("batch").value = "4"
    settle(worker)
    padded, code = text_of(view.report.value), view.code.code
    assert "prompts left-padded to the longest" in padded
    view.control("padding").value = "none"  # not a from_pretrained keyword: the cell stays, the run changes
    settle(worker)
    assert view.code.code == code and "prompts left-padded" not in text_of(view.report.value)
    assert load_form.make_plan(view.form).args.padding == "none"


def test_make_it_fit_fills_every_control_with_the_answer(view: LoadView, worker: Worker, tiny: str) -> None:
    view.control("attn_implementation").value = "eager"  # not the answer: the search starts from the fastest
    view.control("context").value = "200"
    settle(worker)
    view.fit_button.click()
    settle(worker)
    answer = nbhw.fit(tiny, context=200)
    assert answer.plan is not None and answer.plan.args.attn_implementation != "eager"
    for name, declared in load_form.CONTROLS.items():
        if declared.control != "sizes":
            shown = view.control(name).value
            wanted = load_form.form_words({name: getattr(answer.plan.args, name)})[name]
            assert shown == (wanted if wanted is not None else shown if declared.control == "dropdown" else ""), name
    assert view.form == fit_form(Form(tiny, context="200"))[0]
    assert view.code.code == answer.code.rstrip("\n")
    assert "options ahead of it rejected" in text_of(view.fit_note.value)


def test_a_flash_attention_that_wont_work_is_marked_with_its_reason(view: LoadView, worker: Worker) -> None:
    view.control("attn_implementation").value = "flash_attention_2"
    settle(worker)
    assert "nbhw-bad" in view.note("attn_implementation").value
    assert "flash-attn" in text_of(view.note("attn_implementation").value)  # the package to install


def test_the_hardware_selector_plans_for_a_catalog_target_and_says_it_is_not_here(
    view: LoadView, worker: Worker
) -> None:
    offered = [v for _, v in view.control("target").options]
    assert offered[:2] == ["", "T4"] and "2x H100 SXM" in offered and "8x MI300X" in offered  # "" is this machine
    view.memory_fields["cpu"].value = "2GiB"  # this machine's budget, then a target: the target's memory wins
    settle(worker)
    view.control("target").value = "T4"
    settle(worker)
    assert view.form.max_memory == () and view.memory_fields == {}
    assert view.form.target == "T4" and view.control("dtype").value == "float16"  # the T4's advised dtype
    assert "planning for 1x T4: hardware that is not here" in text_of(view.message.value)
    assert "cuda:0" in [v for _, v in view.control("device_map").options]  # the target's device strings
    assert "cuda:0" in view.picture.value and "the 1x T4's memory" in text_of(view.report.value)
    reserve = framework_reserve("cuda", capability=(7, 5), total_memory=16 * 1024**3)
    assert f"{size(reserve.bytes)}: CUDA context" in text_of(view.report.value)  # the run counts the T4's reserve
    labels = {v: label for label, v in view.control("quantization").options}
    assert view.choices is not None
    fbgemm = view.choices.option("quantization", "fbgemm_fp8")
    assert labels["fbgemm_fp8"].startswith("✗") and fbgemm is not None and "compute capability >= 9.0" in fbgemm.reason
    view.control("target").value = ""
    settle(worker)
    assert view.form.target is None and "not here" not in text_of(view.message.value)


def test_a_bad_entry_shows_a_message_and_no_code(view: LoadView, worker: Worker) -> None:
    field = view.memory_fields["cpu"]
    field.value = "lots"
    settle(worker)
    assert "✗ max_memory size 'lots' is not valid" in text_of(view.message.value)
    assert view.code.code == "" and view.code.html == ""
    field.value = "2GiB"
    settle(worker)
    assert 'max_memory={"cpu": "2GiB"}' in view.code.code
    view.model.value = "/no/such/folder"
    settle(worker)
    assert "no such folder" in text_of(view.message.value)


def test_background_planning_writes_nothing_to_stdout_or_stderr(
    tiny: str, worker: Worker, capfd: pytest.CaptureFixture[str], recwarn: pytest.WarningsRecorder
) -> None:
    # In a kernel, output from a thread lands in whichever cell runs: the worker must never write any.
    capfd.readouterr()
    v = LoadView(Form("nbhw-test/not-cached-anywhere", offline=True), worker)
    try:
        settle(worker)
        for field, value in (
            ("model", tiny),
            ("attn_implementation", "flash_attention_2"),
            ("dtype", "float16"),
            ("device_map", "sequential"),
        ):
            (v.model if field == "model" else v.control(field)).value = value
            settle(worker)
        v.memory_fields["cpu"].value = "lots"
        settle(worker)
    finally:
        v.close()
    assert capfd.readouterr() == ("", "")
    assert [str(w.message) for w in recwarn] == []  # outside pytest these would be printed to stderr


def test_a_bug_while_planning_is_a_message_in_the_tab_not_a_stuck_one(
    view: LoadView, worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(form: Form) -> Any:
        raise RuntimeError("planner bug")

    monkeypatch.setattr(load_form, "preview", broken)
    view.control("dtype").value = "float16"
    settle(worker)
    assert "nbhw failed here (RuntimeError: planner bug)" in text_of(view.message.value)
    assert view.code.code == ""


def test_values_from_words_that_no_option_holds_are_kept(tiny: str, worker: Worker) -> None:
    v = LoadView(Form(tiny, device_map="cuda:3", dtype="float64", attn_implementation="org/my-kernel"), worker)
    try:
        settle(worker)
        assert (
            v.control("device_map").value == "cuda:3"
            and ("cuda:3 (given)", "cuda:3") in v.control("device_map").options
        )
        assert v.control("dtype").value == "float64" and v.control("attn_implementation").value == "org/my-kernel"
        assert 'device_map="cuda:3"' in v.code.code and "dtype=torch.float64" in v.code.code
        assert "cuda:3, which is not here" in v.report.value  # the dry run says so
    finally:
        v.close()


def test_many_quick_changes_end_on_the_last_one(view: LoadView, worker: Worker) -> None:
    for dtype in ["float16", "bfloat16", "float32", "float16", "auto", "bfloat16"] * 3 + ["float16"]:
        view.control("dtype").value = dtype
    settle(worker)
    assert view.form.dtype == "float16" and "dtype=torch.float16" in view.code.code
    assert worker.applied <= 3  # the first plan, maybe one mid-burst, the last: not one per change


# ---------------------------------------------------------------- the code box


@settings(max_examples=150, deadline=None)
@given(model=st.text(st.characters(exclude_categories=("Cs",)), max_size=40))
def test_the_highlighted_code_reads_exactly_as_the_code(model: str) -> None:
    kwargs = [("dtype", "torch.float16"), ("device_map", codegen.py_literal({model: "cpu"}))]
    code = codegen.cell(model, "AutoModelForCausalLM", codegen.Arguments(kwargs, needs_torch=True)).rstrip("\n")
    assert text_of(highlight(code)) == code


# ---------------------------------------------------------------- the panel


def test_the_panel_is_text_outside_jupyter_and_starts_nothing(tiny: str) -> None:
    p = nbhw.panel(tiny, dtype="float16")
    bundle = p._repr_mimebundle_()
    assert list(bundle) == ["text/plain"]
    text = bundle["text/plain"]
    assert "Accelerators here" in text or "accelerators here" in text
    assert "dtype=torch.float16" in text and "Dry run" in text
    assert not [t for t in threading.enumerate() if t.name.startswith("nbhw")]
    assert panels.open_panels() == []


def test_the_panel_has_four_tabs_and_closing_it_stops_everything(tiny: str) -> None:
    widgets = open_widgets()
    p = nbhw.panel(tiny, tab="Load")
    tabs = p.widget
    try:
        assert tabs.titles == ("Devices", "Memory", "Attention", "Load") and tabs.selected_index == 3
        worker = panels.shared_worker()
        settle(worker)
        assert "from_pretrained" in p.load.code.code
        # Only the opened tab is made: the others wait, each showing the same note, until first selected.
        assert (p.devices, p.attention, p.memory) == (None, None, None)
        waiting = [box.children for box in tabs.children[:3]]
        assert waiting == [(p._waiting,)] * 3 and "first opened" in p._waiting.value
        tabs.selected_index = 0
        settle(worker)
        assert tabs.children[0].children == (p.devices.box,) and "nbhw-backends" in p.devices.html.value
        tabs.selected_index = 2
        settle(worker)
        assert tabs.children[2].children == (p.attention.box,) and "sdpa" in p.attention.html.value
        devices = p.devices
        tabs.selected_index = 0  # selected again: the same view, not a second one
        assert p.devices is devices and tabs.children[0].children == (devices.box,)
        tabs.selected_index = 1
        assert p.memory is not None and p.memory.sampler.running
        assert tabs.children[1].children == (p.memory.box, p.holders.box)
        assert p._waiting.comm is not None  # shown in no tab now, still open: closed with the panel
        p.attention.device.value = "cuda"  # a device that is not here: the advisor's rules still answer
        settle(worker)
        assert "cuda" in text_of(p.attention.html.value)
    finally:
        p.close()
    assert p.memory.closed and not p.memory.sampler.running
    assert not worker.running and panels.open_panels() == []
    assert open_widgets() == widgets  # every widget, layout and style it opened, the replaced ones too
    p.close()  # idempotent


def test_a_new_load_tab_has_its_first_code_with_its_first_display(tiny: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The wait is long here so that a loaded test machine can't make the first part miss it.
    monkeypatch.setattr(load_ui, "FIRST_CODE_WAIT", 60.0)
    p = nbhw.panel(tiny, tab="Load")
    try:
        # Holding the widgets' lock keeps the worker from applying any part: what shows was handed to the display.
        # (Without it, a plan this process already made could show every part before the asserts.)
        with LOCK:
            p.widget  # noqa: B018 (what the first display builds)
            # Before the worker has applied a part: the code is there, and the rest is said to be coming.
            assert p.load.code.code == nbhw.plan(tiny, dtype=p.load.form.dtype).code.rstrip("\n")
            assert "coming" in p.load.report.value
        settle(panels.shared_worker())
        assert "right after the prefill" in p.load.report.value  # the run estimate filled in after it
    finally:
        p.close()


def test_the_load_tabs_widgets_share_their_layouts_and_styles(tiny: str) -> None:
    widgets = open_widgets()
    p = nbhw.panel(tiny, tab="Load", max_memory={"0": "1GiB"})  # a field choices replace (no device 0 here)
    try:
        p.widget  # noqa: B018
        view = p.load
        settle(panels.shared_worker())
        notes = list(view.notes.values())
        assert len({id(n.layout) for n in notes}) == 1 and len({id(n.style) for n in notes}) == 1
        dropdowns = [view.control(n) for n in ("dtype", "device_map", "attn_implementation")]
        assert len({id(d.layout) for d in dropdowns}) == 1 and len({id(d.style) for d in dropdowns}) == 1
        assert view.infer_box.layout not in view._shared.widgets()  # the Train mode hides it: a layout of its own
        assert list(view.memory_fields) == ["cpu", "0"]
        view._set_memory_fields([load_form.MemoryField("cpu", "cpu", None)])  # field "0" closed, the shared kept
        assert [w.comm is not None for w in view._shared.widgets()] == [True] * len(view._shared.widgets())
        assert all(n.layout.comm is not None for n in notes)
    finally:
        p.close()
    assert open_widgets() == widgets


def test_a_panel_that_fails_while_being_built_leaves_no_widget_and_no_thread(
    tiny: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug in the Load tab")

    widgets = open_widgets()
    monkeypatch.setattr(panels, "LoadView", broken)
    p = nbhw.panel(tiny, tab="Load")
    with pytest.raises(RuntimeError, match="a bug in the Load tab"):
        p.widget  # noqa: B018 (building it is the point)
    assert panels.open_panels() == [] and not panels._workers
    assert not [t.name for t in threading.enumerate() if t.name.startswith("nbhw")]
    assert open_widgets() == widgets  # the waiting note and the shared layouts made before it are closed


def test_a_bad_tab_is_a_user_error_naming_the_tabs() -> None:
    with pytest.raises(nbhw.UserError, match="valid: Devices, Memory, Attention, Load"):
        nbhw.panel("org/model", tab="Plots")


# ---------------------------------------------------------------- %hw and %hw load


@pytest.fixture
def kernel_ip(ip: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The IPython shell as if a Jupyter front end were attached (widgets render)."""
    monkeypatch.setattr(ip, "kernel", object(), raising=False)
    return ip


def test_hw_in_a_terminal_prints_the_devices_and_the_plan(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    ip.run_line_magic("hw", "")
    out = capsys.readouterr().out
    assert "Who picks what here" in out and "from_pretrained" in out and "Dry run" in out
    assert panels.open_panels() == []


def test_hw_in_jupyter_shows_the_panel_and_unload_closes_it(kernel_ip: Any) -> None:
    widgets = open_widgets()
    kernel_ip.run_line_magic("load_ext", "nbhw")
    kernel_ip.run_line_magic("hw", "")
    [p] = panels.open_panels()
    assert p.tab == "Devices" and p.widget.selected_index == 0
    settle(panels.shared_worker())
    kernel_ip.run_line_magic("hw", "memory")
    graph = memory_ui.views()[-1]
    kernel_ip.run_line_magic("unload_ext", "nbhw")
    assert p.closed and panels.open_panels() == []
    assert graph.closed and memory_ui.views() == []
    assert not [t.name for t in threading.enumerate() if t.name.startswith("nbhw")]
    assert open_widgets() == widgets


def test_hw_load_opens_the_panel_prefilled_on_the_load_tab(kernel_ip: Any, tiny: str) -> None:
    kernel_ip.run_line_magic("load_ext", "nbhw")
    kernel_ip.run_line_magic(
        "hw", f"load {tiny} --dtype half --attn eager --device-map sequential --max-memory cpu=3GiB"
    )
    [p] = panels.open_panels()
    settle(panels.shared_worker())
    assert p.tab == "Load" and p.widget.selected_index == 3
    form = p.load.form
    assert (form.dtype, form.attn_implementation, form.device_map) == ("float16", "eager", "sequential")
    assert p.load.memory_fields["cpu"].value == "3GiB"
    plan = nbhw.plan(tiny, dtype="float16", attn_implementation="eager", device_map="sequential",
                     max_memory={"cpu": "3GiB"})  # fmt: skip
    assert p.load.code.code == plan.code.rstrip("\n")


def test_hw_load_mistakes_stay_usage_errors_and_emit_still_sets_the_next_input(
    kernel_ip: Any, tiny: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel_ip.run_line_magic("load_ext", "nbhw")
    with pytest.raises(UsageError, match="max_memory size 'lots' is not valid"):
        kernel_ip.run_line_magic("hw", f"load {tiny} --max-memory cpu=lots")
    assert panels.open_panels() == []
    seen: list[str] = []
    monkeypatch.setattr(kernel_ip, "set_next_input", lambda text, replace=False: seen.append(text))
    kernel_ip.run_line_magic("hw", f"load {tiny} --emit")
    assert seen == [nbhw.plan(tiny).code] and panels.open_panels() == []


# ---------------------------------------------------------------- shared settings across threads


def test_quiet_sections_in_two_threads_leave_every_setting_as_it_was() -> None:
    from huggingface_hub import constants
    from transformers.utils import logging as hf_logging

    before = (list(warnings.filters), hf_logging.get_verbosity(), constants.HF_HUB_OFFLINE,
              logging.getLogger("accelerate").level)  # fmt: skip

    def churn() -> None:
        for _ in range(200):
            with meta_build.quiet(), meta_build.forced_offline():
                time.sleep(0)

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = (list(warnings.filters), hf_logging.get_verbosity(), constants.HF_HUB_OFFLINE,
             logging.getLogger("accelerate").level)  # fmt: skip
    assert after == before


# ---------------------------------------------------------------- the front-end extension


def test_the_committed_labextension_is_built_from_the_committed_sources() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_labextension", ROOT / "scripts" / "build_labextension.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    recorded = (ROOT / "js" / "build.sha256").read_text().strip()
    assert build.source_hash() == recorded, "js/ changed since the last build: run scripts/build_labextension.py"
    out = ROOT / "nbhw" / "labextension"
    meta = json.loads((out / "package.json").read_text())
    entry = out / meta["jupyterlab"]["_build"]["load"]
    assert entry.is_file()
    assert json.loads((out / "install.json").read_text())["packageName"] == "nbhw"
    built = "".join(p.read_text() for p in (out / "static").glob("*.js"))
    event = re.search(r"const INSERT_EVENT = '([^']+)'", (ROOT / "js" / "src" / "index.js").read_text())
    widget = re.search(r"const INSERT_EVENT = '([^']+)'", (ROOT / "nbhw" / "ui" / "static" / "codebox.js").read_text())
    assert event and widget and event.group(1) == widget.group(1)  # the widget and the extension agree
    assert event.group(1) in built
    assert hashlib.sha256(entry.read_bytes()).hexdigest()  # readable, not an LFS pointer


def test_the_load_tabs_budget_bars_show_each_devices_headroom_and_say_tight() -> None:
    from types import SimpleNamespace

    from nbhw.core.plan.placement import DeviceShare

    def share(budget: int, margin: int) -> DeviceShare:
        return DeviceShare("cuda:0", 0, 3, 100 * 2**20, budget, peak_bytes=200 * 2**20, reserve_bytes=10 * 2**20,
                           margin_bytes=margin)  # fmt: skip

    roomy = plan_view.budget_html(SimpleNamespace(devices=[share(300 * 2**20, 4 * 2**20)], verdict="fits"))  # type: ignore[arg-type]
    assert "210.0 MiB of 300.0 MiB, 90.0 MiB left" in roomy
    tight = plan_view.budget_html(SimpleNamespace(devices=[share(212 * 2**20, 4 * 2**20)], verdict="tight"))  # type: ignore[arg-type]
    assert "210.0 MiB of 212.0 MiB, tight: 2.0 MiB left, the allocator needs 4.0 MiB" in tight
    over = plan_view.budget_html(SimpleNamespace(devices=[share(200 * 2**20, 4 * 2**20)], verdict="over"))  # type: ignore[arg-type]
    assert "210.0 MiB of 200.0 MiB<" in over and 'class="over"' in over
