"""The Load tab's part of ``benchmarks/bench.py``, measured in the browser: JupyterLab in chromium (the tests/browser
harness), a kernel that has already imported torch and transformers.

Per round (a fresh notebook and kernel): ``%hw load MODEL`` opens the panel on the Load tab; the figures are the
seconds from running that cell to the first code in the code box, to the run estimate in the report (the dry run
of generate(), filled in after the code), and to max context / max batch; then per dtype change (the dtype
dropdown, alternating float16 and bfloat16) the seconds to the new code and to the new run estimate. Models: nbhw's
tiny model and a Llama-3.1-70B-sized config (config.json only). Targets (issue 16): first code <= 1.0 s, a dtype
change to new code <= 0.25 s, with the run estimate included (it may fill in after the code).

Every figure is timed inside the page, so neither Playwright's round trips nor the interval it polls at are
counted: the start is ``performance.now()`` in the page, taken right before the page runs the cell (JupyterLab's
``notebook:run-cell`` command, what Shift+Enter runs) or in the ``change`` event the dropdown fires when the user
picks a dtype (a capturing listener: before ipywidgets' own handler sends the change to the kernel); the end is
``performance.now()`` in a MutationObserver on the cell, at the first DOM change after which the code box (or the
report) holds the text looked for. Everything between is counted: the cell's execution and the panel's widgets
sent to the page, or the change's message to the kernel, the kernel's work, every widget message back, and the
page's handling of them up to the DOM change (the paint that shows it follows within a frame, not counted).
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import published

PREPARE = "import torch, transformers\nfrom transformers import AutoModelForCausalLM"
RUN_SHOWN = "right after the prefill"  # the KV cache row once the dry run has answered
SEARCHED = "max context"


@dataclass
class Figures:
    """Seconds per round (opening) and per change (dtype), for one model."""

    model: str
    first_code: list[float] = field(default_factory=list)
    first_run: list[float] = field(default_factory=list)
    first_searches: list[float] = field(default_factory=list)
    change_code: list[float] = field(default_factory=list)
    change_run: list[float] = field(default_factory=list)


# A MutationObserver on a cell: the first time (performance.now()) each condition holds, after a start taken in the
# page; arg = [conditions, on_change]: a condition is [name, selector, texts it holds, texts it must not hold].
WATCH_JS = """(cell, arg) => {
  const [conditions, onChange] = arg;
  const watch = { start: null, found: {} };
  window.__nbhwWatch = watch;
  const check = () => {
    const now = performance.now();
    for (const [name, selector, holds, lacks] of conditions) {
      if (name in watch.found || watch.start === null) continue;
      const node = cell.querySelector(selector);
      const text = node ? node.textContent : '';
      if (text && holds.every(t => text.includes(t)) && lacks.every(t => !text.includes(t))) watch.found[name] = now;
    }
    if (Object.keys(watch.found).length === conditions.length) observer.disconnect();
  };
  const observer = new MutationObserver(check);
  observer.observe(cell, { subtree: true, childList: true, characterData: true, attributes: true });
  if (onChange) {
    cell.addEventListener('change', () => { watch.start = performance.now(); }, { capture: true, once: true });
  }
  return true;
}"""
DONE_JS = "n => { const w = window.__nbhwWatch; return !!w && w.start !== null && Object.keys(w.found).length === n; }"
CODE, REPORT = ".nbhw-codebox-code", ".nbhw-load-report"


def _watch(nb: object, cell: int, conditions: list[list[object]], *, on_change: bool) -> None:
    from tests.browser.harness import NotebookPage

    assert isinstance(nb, NotebookPage)
    nb.cell(cell).evaluate(WATCH_JS, [conditions, on_change])


def _stamps(nb: object, names: list[str], timeout: float = 180.0) -> dict[str, float]:
    """Seconds from the start to each condition, as the page timed them (polled every 100 ms, not counted)."""
    from tests.browser.harness import NotebookPage

    assert isinstance(nb, NotebookPage)
    nb.page.wait_for_function(DONE_JS, arg=len(names), polling=100, timeout=timeout * 1000)
    watch = nb.page.evaluate("() => window.__nbhwWatch")
    return {name: (watch["found"][name] - watch["start"]) / 1000 for name in names}


def _run_cell_stamped(nb: object, cell: int) -> None:
    """Run a cell as Shift+Enter does, the watch's start taken in the page right before."""
    from tests.browser.harness import NotebookPage, _js

    assert isinstance(nb, NotebookPage)
    nb.page.evaluate(
        _js(
            "const app = window.jupyterapp; app.shell.activateById(panel.id);"
            "panel.content.activeCellIndex = arg[1]; panel.content.deselectAll();"
            "window.__nbhwWatch.start = performance.now();"
            "app.commands.execute('notebook:run-cell');"
            "return true;"
        ),
        [nb.path, cell],
    )


def one_round(nb: object, figures: Figures, line: str, dtypes: tuple[str, str], *, changes: int, name: str) -> None:
    from tests.browser.harness import NotebookPage, control, labels

    assert isinstance(nb, NotebookPage)
    nb.open(name, [PREPARE, "%load_ext nbhw", f"%hw load {line}"])
    nb.run_cell(0)
    nb.run_cell(1)
    _watch(nb, 2, [["code", CODE, [], []], ["run", REPORT, [RUN_SHOWN], []],
                   ["searches", REPORT, [RUN_SHOWN], ["searching"]]], on_change=False)  # fmt: skip
    _run_cell_stamped(nb, 2)
    found = _stamps(nb, ["code", "run", "searches"])
    figures.first_code.append(found["code"])
    figures.first_run.append(found["run"])
    figures.first_searches.append(found["searches"])
    dtype = control(nb, 2, "dropdown", "dtype")
    for i in range(changes):
        wanted = dtypes[i % 2]
        _watch(nb, 2, [["code", CODE, [f"dtype=torch.{wanted}"], []], ["run", REPORT, [f"in {wanted}", RUN_SHOWN], []]],
               on_change=True)  # fmt: skip
        dtype.select_option(index=[t.split()[0] for t in labels(dtype)].index(wanted))  # "float32 (advised)" too
        found = _stamps(nb, ["code", "run"])
        figures.change_code.append(found["code"])
        figures.change_run.append(found["run"])
    nb.close()


def measure(rounds: int, changes: int) -> list[Figures]:
    """Open the Load tab ``rounds`` times per model and change its dtype ``changes`` times each."""
    from tests.browser.harness import LAB, JupyterServer, NotebookPage, chromium

    with tempfile.TemporaryDirectory() as root, JupyterServer(LAB) as server, chromium() as browser:
        big = published.folder("Llama-3.1-70B", Path(server.root))
        from nbhw.core.hf.tiny_model import tiny_model_path

        # the words of %hw load, and two dtypes that differ from the config's (so the cell names them)
        models = {
            "tiny model": (str(tiny_model_path()), ("float16", "bfloat16")),
            "Llama-3.1-70B-sized, 32k, 2 x 80 GiB": (f"{big} --context 32k --max-memory 0=80GiB 1=80GiB",
                                                     ("float16", "float32")),
        }  # fmt: skip
        found = []
        for label, (line, dtypes) in models.items():
            figures = Figures(label)
            for i in range(rounds):
                context = browser.new_context(viewport={"width": 1280, "height": 900})
                nb = NotebookPage(context.new_page(), server, Path(root), name=f"bench-{i}")
                try:
                    one_round(nb, figures, line, dtypes, changes=changes, name=f"bench-{label[:4]}-{i}.ipynb")
                finally:
                    context.close()
            found.append(figures)
        return found


HEADERS = ("model", "first code", "run estimate", "max context", "dtype change: code", "dtype change: run")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def rows(found: list[Figures]) -> list[list[str]]:
    return [
        [f.model, f"{median(f.first_code):.2f} s", f"{median(f.first_run):.2f} s", f"{median(f.first_searches):.2f} s",
         f"{median(f.change_code):.3f} s", f"{median(f.change_run):.2f} s"]
        for f in found
    ]  # fmt: skip
