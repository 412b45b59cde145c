"""nbhw.loaded() in a real Jupyter kernel: the cell nbhw's plan wrote runs there, %hw loaded reports it as it is and
as planned, the Memory tab's line appears, and a pin written there reads back here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import nbhw
from tests.support.kernel import Kernel, fresh_kernel  # noqa: F401  (the `kernel` fixture)

pytestmark = pytest.mark.slow


def test_the_emitted_cell_in_a_kernel_is_reported_as_planned_and_pinned(kernel: Kernel, tmp_path: Path) -> None:
    kernel.run("%load_ext nbhw\nimport nbhw, json\n%hw memory --interval 0.05 --window 60")
    kernel.run("import transformers, torch")
    code, _ = kernel.run("print(nbhw.plan(attn_implementation='eager').code)")
    kernel.run(code, timeout=120)
    out, _ = kernel.run("%hw loaded --json")
    (model,) = json.loads(out)["models"]
    assert model["model_class"] == "Qwen3ForCausalLM" and model["attention"] == {"": "eager"}
    assert model["devices"]["cpu"]["bytes"] == 450112 and model["plan"]["differences"] == []
    assert model["loaded_by_cell"] is not None and model["plan"]["peaks"][0]["device"] == "host"
    out, _ = kernel.run(
        "from nbhw.ui import memory as ui\nview = ui.monitor(interval=0.05, window=60).view()\n"
        "view.render(force=True)\nprint(view.table.value)\nview.close()"
    )
    assert "loaded model: Qwen3ForCausalLM" in out and "as planned" in out
    path = tmp_path / "run.json"
    kernel.run(f"%hw pin {path}")
    pin = nbhw.plan(pinned=str(path))  # read back in this process
    assert pin.args.attn_implementation == "eager" and pin.pinned is not None
    assert pin.pinned.devices == {"cpu": 450112} and pin.pinned.attention == {"": "eager"}
    kernel.run("%hw memory --stop")
