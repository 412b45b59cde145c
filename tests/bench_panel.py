"""The Load tab's part of ``tests/bench.py``, measured in the browser: JupyterLab in chromium (the tests/browser
harness), a kernel that has already imported torch and transformers.

Per round (a fresh notebook and kernel): ``%hw load MODEL`` opens the panel on the Load tab; the figures are the
seconds from running that cell to the first code in the code box, to the run estimate in the report (the dry run
of generate(), filled in after the code), and to max context / max batch; then per dtype change (the dtype
dropdown, alternating float16 and bfloat16) the seconds to the new code and to the new run estimate. Models: nbhw's
tiny model and a Llama-3.1-70B-sized config (config.json only). Targets (issue 16): first code <= 1.0 s, a dtype
change to new code <= 0.25 s, with the run estimate included (it may fill in after the code).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests import published

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


def _until(check: Callable[[], bool], start: float, timeout: float = 120.0) -> float:
    while not check():
        if time.perf_counter() - start > timeout:
            raise RuntimeError("the Load tab did not show it in time")
        time.sleep(0.005)
    return time.perf_counter() - start


def one_round(nb: object, figures: Figures, line: str, dtypes: tuple[str, str], *, changes: int, name: str) -> None:
    from tests.browser.harness import NotebookPage
    from tests.browser.test_panel import control, labels

    assert isinstance(nb, NotebookPage)
    nb.open(name, [PREPARE, "%load_ext nbhw", f"%hw load {line}"])
    nb.run_cell(0)
    nb.run_cell(1)
    box = nb.cell(2).locator(".nbhw-codebox-code")
    report = nb.cell(2).locator(".nbhw-load-report")
    start = time.perf_counter()
    nb.start_cell(2)
    figures.first_code.append(_until(lambda: bool(box.count() and box.inner_text().strip()), start))
    figures.first_run.append(_until(lambda: RUN_SHOWN in report.inner_text(), start))
    searched = lambda: RUN_SHOWN in (text := report.inner_text()) and "searching" not in text  # noqa: E731
    figures.first_searches.append(_until(searched, start))
    dtype = control(nb, 2, "dropdown", "dtype")
    for i in range(changes):
        wanted = dtypes[i % 2]
        start = time.perf_counter()
        dtype.select_option(index=[t.split()[0] for t in labels(dtype)].index(wanted))  # "float32 (advised)" too
        figures.change_code.append(_until(lambda w=wanted: f"dtype=torch.{w}" in box.inner_text(), start))
        figures.change_run.append(
            _until(lambda w=wanted: f"in {w}" in report.inner_text() and RUN_SHOWN in report.inner_text(), start)
        )
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
