"""The option solver's benchmark: a Llama-3.1-70B-sized config at 32k tokens over every option for 2 x 24 GiB
(and 128 GiB of CPU RAM), the solver first and warm, against brute force (every option planned afresh, judged the
same way) in the same process. ``python benchmarks/bench.py --only fit`` prints it; also runnable alone."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

MODEL = "Llama-3.1-70B"
CONTEXT = 32768
BUDGET = {0: "24GiB", 1: "24GiB", "cpu": "128GiB"}
HEADERS = ("what", "seconds", "options planned", "answer")


def brute_force(folder: str, result: Any) -> tuple[float, Any]:
    """Every option planned as new plans, judged by check(), the weights-only placement and run_fits; the best by
    the documented order (where the layers are, then the option's rank)."""
    from nbhw.core.fit.options import WHERE_OF_KIND
    from nbhw.core.hf.meta_build import quiet
    from nbhw.core.plan.arguments import plan_args
    from nbhw.core.plan.load_plan import LoadPlan

    search = result.search
    started = time.perf_counter()
    best = None
    for index, option in enumerate(search.options):
        p = LoadPlan(folder, plan_args(**search.values(option)), rows=search.base.rows, config=search.base.config)
        with quiet():
            problems = [x for x in p.check() if x not in p.absent_devices]
            where = WHERE_OF_KIND.get(p.weight_placement.kind) if p.weight_placement else None
            fits = not problems and where is not None and bool(p.run_fits)
        if fits and (best is None or (where, index) < best[0]):
            best = ((where, index), option)
    return time.perf_counter() - started, None if best is None else best[1]


def measure() -> list[list[str]]:
    import nbhw
    from nbhw.core.fit import solver
    from tests.support import published

    folder = published.folder(MODEL, Path(tempfile.mkdtemp()))
    rows = []
    first = nbhw.fit(folder, context=CONTEXT, max_memory=BUDGET)
    rows.append(["solver, first (builds, dry runs)", f"{first.seconds:.2f}", str(first.planned), first.headline()])
    warm = nbhw.fit(folder, context=CONTEXT, max_memory=BUDGET)
    rows.append(["solver, warm (plans kept)", f"{warm.seconds:.2f}", str(warm.planned), warm.headline()])
    solver.clear_cache()
    cold = nbhw.fit(folder, context=CONTEXT, max_memory=BUDGET)
    rows.append(["solver, plans forgotten (builds kept)", f"{cold.seconds:.2f}", str(cold.planned), cold.headline()])
    seconds, best = brute_force(folder, first)
    same = "same answer" if best == first.option else f"DIFFERENT: {best}"
    rows.append(["brute force, every option", f"{seconds:.2f}", str(len(first.search.options)), same])
    return rows


if __name__ == "__main__":
    from nbhw.core.render import text_table

    print(f"nbhw fit: {MODEL}-sized config at {CONTEXT:,} tokens, max_memory {BUDGET}")
    print(text_table(HEADERS, measure(), indent="  "))
