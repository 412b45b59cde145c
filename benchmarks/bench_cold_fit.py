"""The first ``nbhw.fit`` a user meets: CPU seconds of the first call in a fresh process, after importing torch and
transformers, for the three requests of issue 34, against the code of :data:`BASELINE` (the commit before this
work) in the same run: its ``nbhw`` package is extracted from git and put first on the path of a child process.

Each measure is its own fresh process with no dry run kept on disk (``NBHW_HOME`` a new folder); "second kernel"
is one more fresh process that finds the first one's recordings on disk, and must give the same answer: the whole
text of the answer (its cell, the rejected options with their reasons, the nearest changes), less the line that
says how long it took. "as the baseline" compares that text with the baseline's, and "as a full search" (``--full``,
load requests) plans every option afresh in one more process with no rule refusing a run before its dry run
(:func:`full_search`): the same answer, and the same reason for every option ranked ahead of it that the text shows.

``python -m benchmarks.bench --only coldfit`` prints it; ``python -m benchmarks.bench_cold_fit`` too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

BASELINE = "6f1f0a8"  # main before the shared recordings, the tensor timelines and the kept dry runs
ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "8B at 8k on T4": ("Llama-3.1-8B", {"context": 8192, "target": "T4"}),
    "70B at 32k on 2 x 24 GiB + 128 GiB CPU": (
        "Llama-3.1-70B",
        {"context": 32768, "max_memory": {0: "24GiB", 1: "24GiB", "cpu": "128GiB"}},
    ),
    "train 8B on T4 at 2k": ("Llama-3.1-8B", {"task": "train", "target": "T4", "context": 2048}),
}
HEADERS = ("request", "baseline CPU s", "now CPU s", "ratio", "second kernel s", "as the baseline", "as a full search")
TARGET_SECONDS = 10.0

# The child: imports first (not measured), then the first call; prints the figures and the answer as JSON.
CHILD = """
import json, sys, tempfile, time
from pathlib import Path
import torch, transformers  # noqa: F401
sys.path.append(sys.argv[1])
from tests.support import published
import nbhw
name, values = sys.argv[2], json.loads(sys.argv[3])
if "max_memory" in values:
    values["max_memory"] = {int(k) if k.isdigit() else k: v for k, v in values["max_memory"].items()}
folder = published.folder(name, Path(tempfile.gettempdir()) / "nbhw-cold-fit")  # one path: a second kernel's
started = time.process_time()
result = nbhw.fit(folder, **values)
seconds = time.process_time() - started
shown = [line for line in result.text().splitlines() if not line.strip().startswith("planned ")]
full = None
if sys.argv[4] == "full":
    from benchmarks.bench_cold_fit import full_search
    full = full_search(folder, result)
print(json.dumps({"code": nbhw.__file__, "seconds": seconds, "headline": result.headline().replace(folder, "MODEL"),
                  "text": "\\n".join(shown).replace(folder, "MODEL"), "full": full}))
"""


@dataclass
class Measured:
    seconds: float
    headline: str
    text: str
    full: str | None = None  # the full search's finding (--full)


def full_search(folder: str, result: Any) -> str:
    """Every option of ``result``'s search planned afresh (new plans; the run of every option its stage reaches by
    its own dry run: no rule refuses one first), the best by the documented order, and each reason the text shows
    for an option ranked ahead of it, as that option's fresh plan gives it: "same", or what differs."""
    from nbhw.core.fit.options import WHERE_OF_KIND
    from nbhw.core.hf.meta_build import quiet
    from nbhw.core.plan import run_plan
    from nbhw.core.plan.arguments import plan_args
    from nbhw.core.plan.load_plan import LoadPlan

    run_plan.weights_alone_over = lambda *args, **kwargs: False  # type: ignore[assignment]
    search, ranked, plans = result.search, [], {}
    with quiet():
        for index, option in enumerate(search.options):
            p = LoadPlan(folder, plan_args(**search.values(option)), rows=search.base.rows, config=search.base.config)
            problems = [x for x in p.check() if x not in p.absent_devices]
            where = (
                WHERE_OF_KIND.get(p.weight_placement.kind)
                if p.weight_placement and not p.quantization_refused
                else None
            )
            plans[index] = (p, problems, where)
            if not problems and where is not None and p.run_fits:
                ranked.append((where, bool(p.run_tight), index))
        best = search.options[min(ranked)[2]] if ranked else None
        if best != result.option:
            return f"answer differs: {best}"
        groups, _ = result.rejected_groups()
        for stage, options, reason in groups:
            p, problems, where = plans[search.options.index(options[0])]
            if problems:
                own = "; ".join(problems)
            else:
                placement = p.weight_placement if where != stage else p.placement
                own = placement.verdict if placement is not None else "no placement"
            if own != reason:
                return f"reason differs for {options[0].words()}: {own!r} / {reason!r}"
    return f"same ({len(search.options)} options planned afresh)"


def baseline_tree() -> Path:
    """The BASELINE commit's nbhw package, extracted into a temporary folder."""
    out = Path(tempfile.mkdtemp(prefix="nbhw-baseline-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", BASELINE, "nbhw"], check=True, capture_output=True)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(out, filter="data")
    return out


def first_call(name: str, values: dict[str, object], *, code: Path | None, home: Path, full: bool = False) -> Measured:
    """One fresh process: the first fit of ``name`` with ``values`` (``code``: a tree whose nbhw comes first)."""
    path = str(code) if code else os.environ.get("PYTHONPATH", "")
    env = dict(os.environ, NBHW_HOME=str(home), NBHW_KEEP_DRY_RUNS="1", PYTHONPATH=path)
    # cwd: not the repository, whose nbhw would come first on the path (before PYTHONPATH's)
    mode = "full" if full else "first"
    done = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), name, json.dumps(values), mode],
                          env=env, cwd=home, capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    found = json.loads(done.stdout.strip().splitlines()[-1])
    expected = (code or ROOT) / "nbhw"
    if Path(found["code"]).resolve().parent != expected.resolve():
        raise RuntimeError(f"the child ran the nbhw of {found['code']}, not of {expected}")
    return Measured(found["seconds"], found["headline"], found["text"], found["full"])


def measure(full: bool = False) -> list[list[str]]:
    old = baseline_tree()
    rows = []
    for label, (name, values) in CASES.items():
        before = first_call(name, values, code=old, home=Path(tempfile.mkdtemp()))
        home = Path(tempfile.mkdtemp())
        now = first_call(name, values, code=None, home=home)
        again = first_call(name, values, code=None, home=home)  # a second kernel: the recordings are on disk
        if now.text != again.text:
            raise RuntimeError(f"{label}: the second kernel answers otherwise: {again.headline}")
        same = "yes" if (now.headline, now.text) == (before.headline, before.text) else f"NO: {before.headline}"
        checked = "-"
        if full and values.get("task") != "train":
            checked = first_call(name, values, code=None, home=Path(tempfile.mkdtemp()), full=True).full or "?"
        rows.append([label, f"{before.seconds:.1f}", f"{now.seconds:.1f}", f"{now.seconds / before.seconds:.2f}x",
                     f"{again.seconds:.1f}", same, checked])  # fmt: skip
    return rows


if __name__ == "__main__":
    from nbhw.core.render import text_table

    print(f"nbhw.fit, first call in a fresh process (CPU seconds), against {BASELINE} in the same run")
    print(text_table(HEADERS, measure(full="--full" in sys.argv), indent="  "))
