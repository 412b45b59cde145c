"""``%hw`` / ``nbhw.panel()``: one panel with the tabs Devices · Memory · Attention · Load.

The widgets are made when the panel is first displayed in a kernel, each tab's when the tab is first opened (the
first display sends only the opened tab's widgets); in a terminal the panel is text. Every slow step (detection,
advice, plans) runs on the one ``nbhw-panel`` worker thread shared by all panels; the memory graph starts when its
tab is first opened. :func:`close_all` (``%unload_ext nbhw``) closes every panel and stops the
worker.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import ipywidgets as w

from nbhw.core.argument import signature
from nbhw.core.errors import UserError, one_of
from nbhw.core.hardware.detect import detect
from nbhw.core.plan import load_form
from nbhw.core.plan.load_form import CONTROLS, Form, cached_models, form_words
from nbhw.core.serve import serve_form
from nbhw.core.serve.serve_form import SERVE_CONTROLS, ServeForm
from nbhw.core.tasks import check_names, check_task
from nbhw.core.train import train_form
from nbhw.core.train.train_form import TRAIN_CONTROLS, TrainForm
from nbhw.ui.attention import AttentionView
from nbhw.ui.devices import DevicesView
from nbhw.ui.load import LoadView
from nbhw.ui.memory import LOCK, MemoryView, in_kernel, monitor
from nbhw.ui.tree import Shared, close_tree
from nbhw.ui.worker import Worker

TABS = ("Devices", "Memory", "Attention", "Load")
MEMORY_WIDTH = 780
TAB_WAITING = "<span class='nbhw-note'>This tab fills in once the kernel is free (it is made when first opened).</span>"

_lock = threading.Lock()
_open: list[Panel] = []
_workers: list[Worker] = []  # the one worker while a panel is open


def shared_worker() -> Worker:
    """The worker every open panel uses, started on first use."""
    with _lock:
        if not _workers:
            _workers.append(Worker())
        return _workers[0]


def _stop_worker_if_unused() -> None:
    with _lock:
        unused = [] if _open else list(_workers)
        _workers[:] = [] if unused else _workers
    for worker in unused:
        worker.stop()  # outside every lock: the thread may be waiting for the widgets' lock


def open_panels() -> list[Panel]:
    """The panels whose widgets exist and are not closed."""
    with _lock:
        return list(_open)


def close_all() -> None:
    """Close every panel and stop the worker (``%unload_ext nbhw``)."""
    for panel in open_panels():
        panel.close()
    _stop_worker_if_unused()


class PanelTabs(w.Tab):  # type: ignore[misc]
    """The panel's Tab widget, whose repr names the panel rather than every widget in it: ipywidgets' display of a
    widget starts from its repr (the text/plain the panel replaces anyway), which walked the whole tree (~60 ms)."""

    def __repr__(self) -> str:
        return f"PanelTabs({', '.join(self.titles)})"


class Panel:
    """The tabbed panel. Display it in Jupyter; ``.devices``, ``.attention``, ``.load``: each tab's view once the
    tab has been opened (None before); ``.close()``.

    ``task="train"``: the Load tab opens in its Train mode, on ``train`` (its controls' words); ``task="serve"``:
    in its Serve mode, on ``serve``.
    """

    def __init__(
        self,
        form: Form,
        *,
        tab: str = "Devices",
        task: str = "infer",
        train: TrainForm | None = None,
        serve: ServeForm | None = None,
        interval: float = 0.5,
        window: float = 600.0,
    ) -> None:
        if tab not in TABS:
            raise one_of("tab", tab, list(TABS))
        self.form = form
        self.tab = tab
        self.task = check_task(task)
        self.train = train or TrainForm.of(form.model, offline=form.offline)
        self.serve = serve or ServeForm.of(form.model, offline=form.offline)
        self.interval = interval
        self.window = window
        self.closed = False
        self.devices: Any = None
        self.attention: Any = None
        self.load: Any = None
        self.memory: Any = None
        self.holders: Any = None  # the Memory tab's holders section, made with the graph
        self._tabs: Any = None
        self._memory_box: Any = None
        self._boxes: dict[str, Any] = {}  # per tab: its view's box, or the box its view goes in when first opened
        self._waiting: Any = None
        self._shared = Shared()
        self._worker: Any = None

    def __repr__(self) -> str:
        return f"Panel({self.form.model!r}, tab={self.tab!r})"

    # -- widgets

    @property
    def widget(self) -> Any:
        """The ipywidgets Tab (made on first use, which starts the background work)."""
        if self._tabs is None:
            self._build()
        return self._tabs

    def _build(self) -> None:
        if self.closed:
            raise UserError("this panel was closed; run %hw or nbhw.panel() for a new one")
        worker = shared_worker()
        try:
            # Under the widgets' lock: a view's job applies its next part (the worker's computing goes on meanwhile
            # only as far as that part) once the whole panel is made.
            with LOCK:
                self._make(worker)
        except BaseException:
            # Never half a panel: what was made is closed, and the worker stops unless another panel uses it.
            self._discard()
            raise

    def _discard(self) -> None:
        for view in (self.devices, self.attention, self.load):
            if view is not None:
                view.close()
        close_tree(*self._boxes.values(), self._tabs, self._waiting, *self._shared.widgets())
        self.devices = self.attention = self.load = self._memory_box = self._tabs = self._waiting = None
        self._boxes = {}
        _stop_worker_if_unused()

    def _make(self, worker: Worker) -> None:
        self._worker = worker
        self._shared = Shared()
        # Shown in each tab not opened yet (one widget shown in every such tab): the kernel makes a tab's view when
        # the tab is first selected, so a panel's first display sends only the widgets of the tab it opens on.
        self._waiting = w.HTML(TAB_WAITING, **self._shared.looks(w.HTML))
        opened = self._view(self.tab)
        self._boxes = {name: opened if name == self.tab and opened is not None else self._placeholder()
                       for name in TABS}  # fmt: skip
        self._memory_box = self._boxes["Memory"]
        # Everything in the constructor: each later change would be one more message ahead of the panel's display.
        tabs = PanelTabs(
            children=list(self._boxes.values()),
            titles=TABS,
            selected_index=TABS.index(self.tab),
            layout=w.Layout(overflow="auto"),  # a wide table or graph scrolls inside the tab rather than being cut
            _dom_classes=("nbhw-panel", "nbhw"),
        )
        tabs.observe(self._tab_selected, names="selected_index")
        self._tabs = tabs
        if self.tab == "Memory":
            self._start_memory()
        with _lock:
            _open.append(self)

    def _placeholder(self) -> Any:
        return w.VBox([self._waiting], layout=self._shared.layout())

    def _view(self, tab: str) -> Any:
        """Make a tab's view (Devices, Attention, Load; it starts its first job) and return its box; None for the
        Memory tab (see _start_memory)."""
        if tab == "Devices":
            self.devices = DevicesView(self._worker)
            return self.devices.box
        if tab == "Attention":
            self.attention = AttentionView(self._worker, self.form.model, self.form.offline, self._models())
            return self.attention.box
        if tab == "Load":
            self.load = LoadView(
                self.form, self._worker, self._models(), task=self.task, train=self.train, serve=self.serve
            )
            return self.load.box
        return None

    def _models(self) -> list[str]:
        return list(dict.fromkeys([self.form.model, *cached_models()]))

    def _tab_selected(self, change: Any) -> None:
        with LOCK:
            tab = TABS[change["new"]]
            if self.closed:
                return
            if tab == "Memory":
                self._start_memory()
            elif getattr(self, tab.lower()) is None:  # first opened: its view goes where the waiting note was
                self._boxes[tab].children = [self._view(tab)]

    def _start_memory(self) -> None:
        with LOCK:
            if self.memory is not None or self.closed:
                return
            if self.holders is None:
                # lazy: the holders' walk and nbhw.session load when the Memory tab first opens, not with the panel
                from nbhw.ui.holders import HoldersView

                self.holders = HoldersView()  # walks nothing until its button is pressed
            try:
                mon = monitor(interval=self.interval, window=self.window)
                # Narrower than %hw memory's graph: it sits inside the tab's padding.
                self.memory = MemoryView(mon.sampler, mon.log, width=MEMORY_WIDTH)
            except UserError as exc:
                self._show_in_memory_tab(w.HTML(f"<span class='nbhw-bad'>✗ {exc}</span>"), self.holders.box)
                return
            self._show_in_memory_tab(self.memory.box, self.holders.box)

    def _show_in_memory_tab(self, *widgets: Any) -> None:
        old, self._memory_box.children = self._memory_box.children, list(widgets)
        close_tree(*[o for o in old if o not in widgets], keep=(self._waiting, *self._shared.widgets()))

    def close(self) -> None:
        """Close the widgets and the memory graph; the worker stops when no panel is left."""
        if self.closed:
            return
        self.closed = True
        with _lock:
            if self in _open:
                _open.remove(self)
        if self.memory is not None:
            self.memory.close()  # the last memory view closing stops the sampler
        if self.holders is not None:
            self.holders.close()
        # Under the widgets' lock: a result being applied on the worker's thread (a Load tab's new memory fields)
        # finishes first, then everything it made is closed with the rest; later results see the view closed.
        with LOCK:
            for view in (self.devices, self.attention, self.load):
                if view is not None:
                    view.close()
            close_tree(*self._boxes.values(), self._tabs, self._waiting, *self._shared.widgets())
        _stop_worker_if_unused()

    # -- text and display

    def text(self) -> str:
        """The panel in a terminal: the devices view and the load plan, or the training plan with ``task="train"``,
        or the serving plan with ``task="serve"`` (the graph and tables need Jupyter)."""
        parts = [detect().text().rstrip(), "", self._plan_text()]
        parts += ["", "In Jupyter, %hw shows these as tabs with the memory graph and the attention advice;", (
            "in a terminal: %hw memory, %hw attention, %hw load.")]  # fmt: skip
        return "\n".join(parts) + "\n"

    def _plan_text(self) -> str:
        if self.task == "train":
            trained = train_form.preview(self.train)
            return trained.plan.text().rstrip() if trained.plan is not None else f"nbhw: train plan: {trained.error}"
        if self.task == "serve":
            served = serve_form.preview(self.serve)
            return served.plan.text().rstrip() if served.plan is not None else f"nbhw: serve plan: {served.error}"
        form = self.form
        if form.dtype is None:  # as in Jupyter: the advised dtype
            found = load_form.choices(form.model, device_map=form.device_map, offline=form.offline, target=form.target)
            advised = found.advised_dtype
            form = form.with_dtype(advised)
        preview = load_form.preview(form)
        return preview.plan.text().rstrip() if preview.plan is not None else f"nbhw: load plan: {preview.error}"

    def __str__(self) -> str:
        return self.text()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        if not in_kernel():
            return {"text/plain": self.text()}
        bundle: dict[str, Any] = dict(self.widget._repr_mimebundle_() or {})
        bundle["text/plain"] = f"nbhw panel: {', '.join(TABS)} (needs a Jupyter front end with widgets)"
        return bundle

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text())


def panel(
    model: str | Path | None = None,
    *,
    offline: bool = False,
    tab: str = "Devices",
    task: str = "infer",
    interval: float = 0.5,
    window: float = 600.0,
    **arguments: Any,
) -> Panel:
    """The full panel: Devices · Memory · Attention · Load (``%hw``; ``%hw load MODEL ...`` opens it on Load).

    The Load tab starts from ``arguments``, the same as :func:`nbhw.plan` takes (``dtype`` not given: the advised
    dtype; ``model=None``: the most recently used model in the local HF cache, else nbhw's tiny local model). Its
    controls offer what this machine can use, and every change re-plans in the background: code, dry-run problems,
    estimate and placement. "Insert cell below" puts the code in a new cell directly below the panel's cell
    (JupyterLab 4 and Notebook 7); "Copy" puts it on the clipboard; the code box stays selectable. Mistakes in an
    entry show as a message in the panel. ``interval`` and ``window`` set the memory graph (``%hw memory``).

    ``task="train"``: the Load tab opens in its Train mode and ``arguments`` are those of :func:`nbhw.train_plan`
    (``method``, ``batch``, ``context``, ``lora_r``, ``device_memory``, ...): the preview is the training plan.
    ``task="serve"``: its Serve mode, and ``arguments`` are those of ``nbhw.plan(task="serve")`` (``context``,
    ``prompt``, ``answer``, ``memory_percent``, ``target``, ...): the preview is the serving plan.
    """
    task = check_task(task)
    check_names(task, arguments)  # a word of another task's plan says which task it is for
    name = str(model) if model is not None else load_form.default_model()
    if task == "train":
        train = TrainForm.of(name, offline=offline, **train_form.form_words(arguments))
        return Panel(Form(name, offline=offline), tab=tab, task=task, train=train, interval=interval, window=window)
    if task == "serve":
        serve = ServeForm.of(name, offline=offline, **ServeForm.form_words(arguments))
        return Panel(Form(name, offline=offline), tab=tab, task=task, serve=serve, interval=interval, window=window)
    unknown = [n for n in arguments if n not in CONTROLS]
    if unknown:
        raise one_of("argument", unknown[0], list(CONTROLS))
    form = Form(name, offline=offline, **form_words(arguments))
    return Panel(form, tab=tab, interval=interval, window=window)


panel.__signature__ = signature(  # type: ignore[attr-defined]
    panel, [replace(a, default=None) if a.name == "dtype" else a for a in CONTROLS.values()],
    [a for name, a in TRAIN_CONTROLS.items() if name not in CONTROLS],
    [a for name, a in SERVE_CONTROLS.items() if name not in CONTROLS and name not in TRAIN_CONTROLS],
    keep=("model", "offline", "tab", "task", "interval", "window"),
)  # fmt: skip
