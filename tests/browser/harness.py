"""Real JupyterLab 4 and Notebook 7 driven in Debian's chromium: the end-to-end harness of the browser tests.

    with JupyterServer(LAB) as server, chromium() as browser:
        nb = NotebookPage(browser.new_page(), server, shots=Path("shots"))
        nb.open("demo.ipynb", ["%load_ext nbhw", "%hw devices"])
        nb.run_all()
        assert "✓ usable" in nb.output_text(1)
        nb.check_widgets()          # AssertionError on "Error displaying widget" or a widget stuck loading
        nb.screenshot("demo", cell=1)
        nb.close()

Where JupyterLab and Notebook 7 differ (command, options, notebook URL) is kept in `Flavor`; the notebook DOM is
the same in both (they share @jupyterlab/notebook), so `NotebookPage` reads it one way.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import nbformat
import psutil
from playwright.sync_api import Browser, Locator, Page, sync_playwright
from playwright.sync_api import Error as PlaywrightError

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
)
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
# The pictures README and the documentation site show (docs/images/), taken again by the tests at every run, each
# after the checks before it passed: the test's picture -> the file in docs/images.
DOCS_IMAGES = {
    "test_hw_devices_renders_the_table_of_every_backend-lab-page": "hw-devices-jupyterlab.png",
    "test_hw_devices_renders_the_table_of_every_backend-notebook7-page": "hw-devices-notebook7.png",
    "test_memory_graph_moves_while_a_cell_sleeps_and_attributes_a_big_cell-lab-graph": "hw-memory-jupyterlab.png",
    "test_the_memory_tab_shows_the_holders_and_frees_the_ticked_variable-lab-freed": "panel-holders-jupyterlab.png",
    "test_insert_cell_below_puts_the_previewed_code_below_its_panel_20_of_20_and_while_a_cell_runs"
    "-notebook7-inserted": "panel-insert-notebook7.png",
    "test_load_tab_controls_change_the_preview-lab-target": "panel-load-jupyterlab.png",
    "test_hw_shows_one_panel_with_all_four_tabs-lab-memory": "panel-memory-jupyterlab.png",
}
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
# Quiet test servers: no news or update toasts, and every cell kept in the DOM (no windowing).
SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
        "doNotDisturbMode": True,
    },
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}

T = TypeVar("T")


@dataclass(frozen=True)
class Flavor:
    """What differs between JupyterLab and Notebook 7: the app, its own options, and where a notebook opens."""

    name: str
    module: str
    app_class: str
    notebook_url: str  # from the server's root, with {path} and {workspace}
    options: tuple[str, ...] = ()


LAB = Flavor(
    "lab",
    "jupyterlab",
    "LabApp",
    # A workspace of its own per page, so JupyterLab doesn't reopen the notebooks of earlier tests with their kernels.
    "lab/workspaces/{workspace}/tree/{path}",
    (
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
    ),
)
NOTEBOOK7 = Flavor("notebook7", "notebook", "JupyterNotebookApp", "notebooks/{path}")
FLAVORS = {f.name: f for f in (LAB, NOTEBOOK7)}


def poll(what: str, check: Callable[[], T | None], timeout: float, interval: float = 0.1) -> T:
    """Call `check` until it returns something other than None/False; AssertionError naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got is not None and got is not False:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PortTaken(AssertionError):
    """The server's port was bound by another process between free_port() and the server's start."""


class JupyterServer:
    """A real `jupyter lab` or `jupyter notebook` on a loopback port with its own temporary dirs; stop() leaves none."""

    def __init__(self, flavor: Flavor, startup_timeout: float = 90) -> None:
        self.flavor = flavor
        self.startup_timeout = startup_timeout
        self.token = secrets.token_hex(16)
        self.port = 0
        self.home = Path(tempfile.mkdtemp(prefix=f"nbhw-{flavor.name}-"))
        self.root = self.home / "root"
        self.log_path = self.home / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> JupyterServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> JupyterServer:
        for _ in range(2):  # a free port may be taken before the server binds it (pytest-xdist's other worker)
            try:
                return self._start()
            except PortTaken:
                continue
        return self._start()  # the third try: its PortTaken goes to the test

    def _start(self) -> JupyterServer:
        self._prepare_dirs()  # again after a stop(): it removes them
        self.port = free_port()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self._command(),
                cwd=self.root,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl+C in pytest reaches pytest only; stop() ends the server
            )
        try:
            poll(f"{self.flavor.name} server at {self.url}", self._ready, self.startup_timeout, 0.25)
        except BaseException:
            self.stop()
            raise
        return self

    def _prepare_dirs(self) -> None:
        for name in ("root", "config", "runtime", "data", "workspaces", "settings", "ipython", "labextensions"):
            (self.home / name).mkdir(parents=True, exist_ok=True)
        # nbhw's front-end extension as built in this checkout, ahead of any copy an install put in the venv.
        (self.home / "labextensions" / "nbhw").symlink_to(ROOT / "nbhw" / "labextension", target_is_directory=True)
        for rel, values in SETTINGS.items():
            path = self.home / "settings" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        # The kernel of the test venv: this very interpreter, whatever `python` on PATH is.
        spec = self.home / "data" / "kernels" / "python3"
        spec.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        kernel = {"argv": argv, "display_name": KERNELSPEC["display_name"], "language": "python"}
        (spec / "kernel.json").write_text(json.dumps(kernel))

    def _command(self) -> list[str]:
        app = self.flavor.app_class
        cmd = [
            sys.executable,
            "-m",
            self.flavor.module,
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={self.root}",
            f"--IdentityProvider.token={self.token}",
            "--ServerApp.open_browser=False",
            "--ServerApp.terminals_enabled=False",
            f"--{app}.expose_app_in_browser=True",
            # LabServerApp: the notebook app lists extensions, but the JupyterLab app in the same server serves them.
            f"--LabServerApp.extra_labextensions_path={self.home / 'labextensions'}",
            *self.flavor.options,
        ]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        return cmd

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # The kernel imports the nbhw of this checkout, whatever the venv has installed.
        paths = [str(ROOT), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
        env.update(
            PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)),
            JUPYTER_CONFIG_DIR=str(self.home / "config"),
            JUPYTER_RUNTIME_DIR=str(self.home / "runtime"),
            JUPYTER_DATA_DIR=str(self.home / "data"),
            JUPYTERLAB_WORKSPACES_DIR=str(self.home / "workspaces"),
            JUPYTERLAB_SETTINGS_DIR=str(self.home / "settings"),
            IPYTHONDIR=str(self.home / "ipython"),
            JUPYTER_PLATFORM_DIRS="0",
        )
        return env

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            tail = self.log_tail()
            if "already in use" in tail:
                raise PortTaken(tail)
            raise AssertionError(f"{self.flavor.name} server exited with {self.proc.returncode}:\n{tail}")
        try:
            self.api("GET", "/api/status")
        except (OSError, urllib.error.URLError):
            return False
        return True

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def api(self, method: str, path: str, body: object = None, timeout: float = 10) -> Any:
        """One call of the server's REST API with the token; the decoded JSON reply (None when empty)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"token {self.token}")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def kernel_state(self, kernel_id: str) -> str:
        """The kernel's execution_state as the server tracks it from the kernel's own status messages."""
        return str(self.api("GET", f"/api/kernels/{kernel_id}")["execution_state"])

    def shutdown_kernels(self) -> None:
        for session in self.api("GET", "/api/sessions"):
            with contextlib.suppress(urllib.error.HTTPError):
                self.api("DELETE", f"/api/sessions/{session['id']}", timeout=30)
        for kernel in self.api("GET", "/api/kernels"):
            with contextlib.suppress(urllib.error.HTTPError):
                self.api("DELETE", f"/api/kernels/{kernel['id']}", timeout=30)

    def write_notebook(self, name: str, sources: Sequence[str]) -> Path:
        """A notebook of code cells with the test venv's kernelspec in its metadata, under the server root."""
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = dict(KERNELSPEC)
        nb.metadata["language_info"] = {"name": "python"}
        nb.cells = [nbformat.v4.new_code_cell(src) for src in sources]
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
        return path

    def stop(self) -> None:
        """Shut the kernels down, then the server (SIGTERM, wait, SIGKILL); fails if any process of it survives."""
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                # The kernels run in sessions of their own: remember them to make sure they are gone at the end.
                started = psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                started = []
            if proc.poll() is None:
                with contextlib.suppress(OSError, urllib.error.URLError, TimeoutError):
                    self.shutdown_kernels()
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
            _gone, alive = psutil.wait_procs(started, timeout=10)
            for p in alive:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
            _gone, alive = psutil.wait_procs(alive, timeout=10)
            assert not alive, f"processes of the {self.flavor.name} server left running: {[p.pid for p in alive]}"
        shutil.rmtree(self.home, ignore_errors=True)


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    """Debian's chromium under Playwright (its own browser download can't work here)."""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))
        try:
            yield browser
        finally:
            browser.close()


# The notebook panel showing `path` among the app's main-area widgets (JupyterLab and Notebook 7 alike).
_PANEL_JS = """
(path) => {
  const app = window.jupyterapp;
  if (!app || !app.shell) return null;
  for (const w of app.shell.widgets('main')) {
    if (w.context && w.context.path === path && w.content && w.content.widgets) return w;
  }
  return null;
}
"""


def _js(body: str) -> str:
    """A page function of `arg` = [path, ...] that finds the panel first (`panel` is null until it exists)."""
    return f"(arg) => {{ const panel = ({_PANEL_JS})(arg[0]); {body} }}"


# Every widget output of one cell (arg[1]) or of all (null), found through the cell models (the output DOM carries no
# mime type), with what its node shows: rendered, pending ("Loading widget..." / empty) or broken.
_WIDGET_VIEWS_JS = """
  const views = [];
  panel.content.widgets.forEach((c, ci) => {
    if ((arg[1] !== null && ci !== arg[1]) || !c.outputArea) return;
    const model = c.outputArea.model;
    for (let k = 0; k < model.length; k++) {
      const data = model.get(k).data[arg[2]];
      if (!data || data.model_id === '') continue;
      const child = c.outputArea.widgets[k];
      const node = child && child.node.querySelector('.jp-OutputArea-output');
      const text = node ? node.innerText : '';
      let state = 'rendered';
      if (!node || text.includes('Loading widget') || node.childElementCount === 0) state = 'pending';
      if (text.includes('Error displaying widget') || (node && node.querySelector('.jupyter-widgets-error-widget')))
        state = 'broken';
      views.push({cell: ci, state: state, text: text || (node ? node.innerHTML.slice(0, 200) : '')});
    }
  });
  return views;
"""

# One look at every cell: its type, the input prompt as shown ('[3]:', '[*]:' while queued or running, '[ ]:' never
# run) and its error outputs as 'ename: evalue' (read from the model: in the DOM an error looks like stderr).
_CELLS_JS = """
  return panel.content.widgets.map(c => {
    const prompt = c.node.querySelector('.jp-InputPrompt');
    const outputs = c.model.type === 'code' ? c.model.outputs.toJSON() : [];
    return {
      type: c.model.type,
      prompt: prompt ? prompt.innerText.trim() : '',
      errors: outputs.filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue),
    };
  });
"""

_PROMPT = re.compile(r"\[(\d+)\]")


@dataclass(frozen=True)
class CellState:
    type: str
    prompt: str
    errors: tuple[str, ...]

    @property
    def count(self) -> int | None:
        """The execution count shown, or None while queued, running or never run."""
        m = _PROMPT.search(self.prompt)
        return int(m.group(1)) if m and "*" not in self.prompt else None


class NotebookPage:
    """One notebook open in JupyterLab or Notebook 7: run cells, wait for the kernel for real, read outputs.

    Cells are numbered from 0. Every failure is an AssertionError that says what was waited for and names a
    screenshot of the page at that moment (<shots>/<name>-failed.png).
    """

    def __init__(self, page: Page, server: JupyterServer, shots: Path, name: str = "notebook") -> None:
        self.page = page
        self.server = server
        self.shots = shots
        self.name = name
        self.path = ""
        self.console_errors: list[str] = []
        page.on("console", lambda m: self.console_errors.append(m.text) if m.type == "error" else None)

    # --- opening -------------------------------------------------------------------------------------------

    def open(self, path: str, sources: Sequence[str], timeout: float = 90) -> NotebookPage:
        """Write a notebook of these code cells under the server root, open it, and wait for its kernel, idle."""
        self.server.write_notebook(path, sources)
        self.path = path
        where = self.server.flavor.notebook_url.format(path=path, workspace=f"nbhw-{secrets.token_hex(4)}")
        url = f"{self.server.url}/{where}?token={self.server.token}"
        self.page.goto(url, wait_until="domcontentloaded")
        ready = (
            "return !!panel && panel.context.isReady && panel.content.widgets.length === arg[1]"
            " && panel.sessionContext.isReady"
            " && panel.sessionContext.session?.kernel?.connectionStatus === 'connected';"
        )
        try:
            self.page.wait_for_function(_js(ready), arg=[path, len(sources)], timeout=timeout * 1000)
        except PlaywrightError as e:
            self.fail(f"{path} did not open with a connected kernel in {self.server.flavor.name}: {e}")
        n = len(sources)
        poll(f"{n} cells of {path} in the DOM", lambda: self.cell_count() == n, timeout)
        self.wait_idle(timeout)
        return self

    # --- reading -------------------------------------------------------------------------------------------

    def _eval(self, body: str, *args: object) -> Any:
        return self.page.evaluate(_js(body), [self.path, *args])

    def _panel(self) -> Locator:
        panel_id = self._eval("return panel ? panel.id : '';")
        return self.page.locator(f"[id='{panel_id}']")

    def cell(self, i: int) -> Locator:
        """The DOM of cell i, for checks the helpers below don't cover."""
        return self._panel().locator(".jp-Notebook .jp-Cell").nth(i)

    def outputs(self, i: int) -> Locator:
        """The rendered outputs of cell i (one element per output, without the output prompt)."""
        return self.cell(i).locator(".jp-OutputArea-output")

    def cells(self) -> list[CellState]:
        return [CellState(c["type"], c["prompt"], tuple(c["errors"])) for c in self._eval(_CELLS_JS)]

    def cell_count(self) -> int:
        return int(self._panel().locator(".jp-Notebook .jp-Cell").count())

    def cell_source(self, i: int) -> str:
        return str(self._eval("return panel.content.widgets[arg[1]].model.sharedModel.getSource();", i))

    def output_text(self, i: int) -> str:
        """The text of the cell's outputs as rendered (HTML too, as the user reads it), one output a line."""
        return "\n".join(str(t) for t in self.outputs(i).all_inner_texts())

    def output_html(self, i: int) -> str:
        """The rendered HTML of the cell's outputs, one output a line."""
        return "\n".join(str(h) for h in self.outputs(i).evaluate_all("(els) => els.map(e => e.innerHTML)"))

    def errors(self, i: int) -> list[str]:
        """The error outputs of cell i (exceptions, UsageError) as 'ename: evalue'."""
        return list(self.cells()[i].errors)

    def kernel_id(self) -> str | None:
        got = self._eval("const k = panel && panel.sessionContext.session?.kernel; return k ? k.id : null;")
        return None if got is None else str(got)

    def kernel_state(self) -> str | None:
        """The kernel's execution_state from the server's REST API (not the page's status text)."""
        kid = self.kernel_id()
        if kid is None:
            return None
        try:
            return self.server.kernel_state(kid)
        except urllib.error.HTTPError:
            return None

    # --- running -------------------------------------------------------------------------------------------

    def run_cell(self, i: int, timeout: float = 120, allow_errors: bool = False) -> None:
        """Run cell i (as Ctrl+Enter does) and wait until it has really finished; fails on an error output."""
        self._run([i], "notebook:run-cell", i, timeout, allow_errors)

    def run_all(self, timeout: float = 180, allow_errors: bool = False) -> None:
        """Run every cell (Run > Run All Cells) and wait until all have really finished, or one raised."""
        code = [i for i, c in enumerate(self.cells()) if c.type == "code"]
        self._run(code, "notebook:run-all-cells", 0, timeout, allow_errors)

    def start_cell(self, i: int) -> list[CellState]:
        """Start running cell i and return at once (the cells' state before, for `wait_done`)."""
        before = self.cells()
        self._execute("notebook:run-cell", i)
        return before

    def _execute(self, command: str, active: int) -> None:
        self._eval(
            "const app = window.jupyterapp; app.shell.activateById(panel.id);"
            "panel.content.activeCellIndex = arg[1]; panel.content.deselectAll();"
            "app.commands.execute(arg[2]).catch(e => console.error('nbhw harness: ' + arg[2] + ': ' + e));"
            "return true;",
            active,
            command,
        )

    def _run(self, cells: list[int], command: str, active: int, timeout: float, allow_errors: bool) -> None:
        before = self.cells()
        self._execute(command, active)
        self.wait_done(cells, before, timeout)
        if not allow_errors:
            errors = [f"cell {i}: {e}" for i, c in enumerate(self.cells()) if i in cells for e in c.errors]
            if errors:
                self.fail(f"error output in {self.path}:\n  " + "\n  ".join(errors))

    def wait_done(self, cells: list[int], before: list[CellState], timeout: float = 120) -> None:
        """Wait until the cells show new execution counts (no '[*]') AND the server sees the kernel idle.

        A count appears only once the kernel's execute_reply and its idle status have both reached the page, so
        every output of the cell has arrived; the REST state makes sure nothing else still runs in the kernel. The REST
        state is not enough alone: it read "idle" while a cell still slept in Notebook 7 (the status message of some
        other request the page sent).
        When a cell raises, the cells queued after it never run: done as soon as nothing is queued any more.
        """

        def done() -> bool:
            now = self.cells()
            if any("*" in now[i].prompt for i in cells):
                return False
            finished = [now[i].count is not None and now[i].prompt != before[i].prompt for i in cells]
            raised = any(now[i].errors and finished[k] for k, i in enumerate(cells))
            return (all(finished) or raised) and self.kernel_state() == "idle"

        try:
            poll(f"cells {cells} of {self.path} to finish", done, timeout, 0.2)
        except AssertionError as e:
            now = self.cells()
            self.fail(f"{e}; prompts now {[now[i].prompt for i in cells]}, kernel {self.kernel_state()}")

    def wait_idle(self, timeout: float = 60) -> None:
        """Wait until no cell is queued or running ('[*]') and the server sees the kernel idle (e.g. after a click)."""

        def idle() -> bool:
            return not any("*" in c.prompt for c in self.cells()) and self.kernel_state() == "idle"

        poll(f"an idle kernel for {self.path}", idle, timeout, 0.2)

    # --- widgets -------------------------------------------------------------------------------------------

    def check_widgets(self, cell: int | None = None, timeout: float = 30) -> int:
        """Wait until every widget output (of one cell, or of all) has rendered; the number of them.

        Fails at once when the front end shows "Error displaying widget" or its error view (a widget whose model or
        view module can't load), and after `timeout` when one is still "Loading widget..." or an empty placeholder.
        """
        deadline = time.monotonic() + timeout
        while True:
            views: list[dict[str, Any]] = self._eval(_WIDGET_VIEWS_JS, cell, WIDGET_MIME)
            broken = [v for v in views if v["state"] == "broken"]
            pending = [v for v in views if v["state"] == "pending"]
            if broken:
                where = ", ".join(f"cell {v['cell']}: {v['text'].strip()[:120]!r}" for v in broken)
                self.fail(f"widget failed to display in {self.path} ({where}){self._console()}")
            if not pending:
                return len(views)
            if time.monotonic() > deadline:
                where = ", ".join(f"cell {v['cell']}" for v in pending)
                self.fail(f"widget still loading after {timeout:.0f} s in {self.path} ({where}){self._console()}")
            time.sleep(0.2)

    def _console(self) -> str:
        if not self.console_errors:
            return ""
        return "\nbrowser console errors:\n  " + "\n  ".join(e.splitlines()[0] for e in self.console_errors[-5:])

    # --- pictures and teardown -----------------------------------------------------------------------------

    def screenshot(self, name: str, cell: int | None = None) -> Path:
        """Save the page, or just cell i's outputs (whole, however tall), as <shots>/<name>.png; its path. A picture
        the documentation shows (DOCS_IMAGES) is copied to docs/images too."""
        path = self._screenshot(name, cell)
        if name in DOCS_IMAGES:
            shutil.copyfile(path, ROOT / "docs" / "images" / DOCS_IMAGES[name])
        return path

    def _screenshot(self, name: str, cell: int | None) -> Path:
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"{name}.png"
        if cell is None:
            self.page.screenshot(path=str(path))
            return path
        area = self.cell(cell).locator(".jp-OutputArea")
        size = self.page.viewport_size
        box = area.bounding_box()
        # The notebook scrolls inside the page: a tall output is only captured whole in a viewport that holds it.
        if size and box and box["height"] + 300 > size["height"]:
            self.page.set_viewport_size({"width": size["width"], "height": int(box["height"]) + 300})
        try:
            area.scroll_into_view_if_needed()
            area.screenshot(path=str(path))
        finally:
            if size:
                self.page.set_viewport_size(size)
        return path

    def fail(self, message: str) -> NoReturn:
        """Raise AssertionError with the message, after saving a screenshot of the page as it is."""
        shot = ""
        with contextlib.suppress(Exception):
            shot = f"\nscreenshot: {self.screenshot(f'{self.name}-failed')}"
        raise AssertionError(message + shot)

    def close(self) -> None:
        """Shut down this notebook's kernel (through the server) so the next test starts from a quiet machine."""
        if not self.path:
            return
        with contextlib.suppress(OSError, urllib.error.URLError):
            for session in self.server.api("GET", "/api/sessions"):
                if session.get("path") == self.path:
                    self.server.api("DELETE", f"/api/sessions/{session['id']}", timeout=30)


def previewed(nb: NotebookPage, cell: int, timeout: float = 60) -> str:
    """The code the panel in `cell` shows, once it shows some."""
    box = code_box(nb, cell)
    return poll(f"the code preview of cell {cell}", lambda: box.inner_text() or None, timeout)


def control(nb: NotebookPage, cell: int, kind: str, label: str, mode: str = "load") -> Locator:
    """An ipywidgets control of the Load tab of the panel in `cell` (``mode``: "train" or "serve", of that mode),
    found by its description."""
    widget = (
        nb.cell(cell)
        .locator(f".nbhw-{mode} .widget-{kind}")
        .filter(has=nb.page.locator("label", has_text=re.compile(f"^{re.escape(label)}$")))
    )
    return widget.locator("select" if kind == "dropdown" else "input")


def labels(select: Locator) -> list[str]:
    """The options of a dropdown as a person reads them now (ipywidgets writes spaces as no-break spaces)."""
    return [t.replace("\xa0", " ") for t in select.locator("option").all_inner_texts()]


def selected(select: Locator) -> str:
    """The label of a dropdown's selected option, as a person reads it now."""
    return str(select.locator("option:checked").inner_text()).replace("\xa0", " ")


def options_when(select: Locator, ready: Callable[[list[str]], bool], what: str, timeout: float = 30) -> list[str]:
    """The options of a dropdown (``labels``) once ``ready(options)`` holds; AssertionError naming `what` and the
    options last seen on timeout.

    A panel's result reaches the page as one message per widget, applied in turn: the Load tab sends the code before
    the dropdowns' choices (nbhw/ui/load.py, LoadView._apply), so the preview can show a change while a dropdown
    still holds its options from before (or its lone "default" of before the choices were known). Read a dropdown
    filled in the background with this, not with ``labels`` right after another control changed.
    """
    seen: list[str] = []

    def check() -> list[str] | None:
        nonlocal seen
        seen = labels(select)
        return seen if ready(seen) else None

    try:
        return poll(what, check, timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}; its options: {seen}") from None


def choose(select: Locator, label: str, timeout: float = 30) -> None:
    """Select the option with this label, once the dropdown offers it."""
    options = options_when(select, lambda now: label in now, f"{label!r} among the dropdown's options", timeout)
    select.select_option(index=options.index(label))


def open_tab(nb: NotebookPage, cell: int, title: str) -> None:
    nb.cell(cell).locator(".lm-TabBar-tab", has_text=title).click()


def code_box(nb: NotebookPage, cell: int) -> Locator:
    return nb.cell(cell).locator(".nbhw-codebox-code")
