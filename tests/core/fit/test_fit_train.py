"""nbhw.fit(task="train") against brute force: on small configs x budgets x contexts, the answer is the first
training option by the documented order whose own training plan fits, and every rejection's reason is that plan's
own words. Nothing fits: the nearest changes are plans that fit. A catalog target (a T4) with QLoRA, for real with
bitsandbytes in a child process. Bad input: one-line errors; the CLI and the magic take the same words."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import transformers as tf
from IPython.core.error import UsageError

import nbhw
from nbhw.core.errors import UserError
from nbhw.core.fit.train_search import TrainFitResult
from nbhw.core.train.arguments import METHODS
from tests.support import families
from tests.support.dists import BITSANDBYTES
from tests.support.models import config_only

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # this module's tests on one torch thread

ROOT = Path(__file__).resolve().parents[3]
ROWS = 2  # rows per device per optimizer step: micro-batches 2 x 1 and 1 x 2
CONTEXTS = (64, 256)
MODELS: dict[str, tuple[Callable[[], Any], str]] = {
    "llama": (lambda: tf.LlamaConfig(**families.COMMON, head_dim=16), "LlamaForCausalLM"),
    "gpt2": (families.gpt2, "GPT2LMHeadModel"),
}
ON = {"device_type": "cpu"}  # budgets in bytes via device_memory: the same on every machine


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("fit-train")
    return {name: config_only(make(), root / name, arch, "float32") for name, (make, arch) in MODELS.items()}


def every_option() -> list[dict[str, Any]]:
    """The documented order, written out here independently of the solver's lists."""
    splits = [(2, 1), (1, 2)]  # the whole batch at once, then one row with two accumulation steps
    return [
        {"method": m, "gradient_checkpointing": g, "batch": b, "gradient_accumulation_steps": a}
        for m, g, (b, a) in itertools.product(("full", "lora", "qlora"), (False, True), splits)
    ]


def planned(folder: str, budget: int, context: int, option: dict[str, Any]) -> tuple[Any, str]:
    """An option's own plan (None when its arguments are refused) and the words it gives."""
    try:
        p = nbhw.train_plan(folder, device_memory=budget, context=context, **ON, **option)
    except UserError as refused:
        return None, str(refused)
    return p, p.verdict + (f" ({p.why})" if len(p.rows) > 1 else "")


def budgets(folder: str, context: int) -> list[int]:
    """Between each pair of neighbouring option peaks, below the least and above the most: each option can win."""
    peaks = sorted({p.peak_bytes for p, _ in (planned(folder, 2**40, context, o) for o in every_option()) if p})
    return [peaks[0] - 1, *((a + b) // 2 for a, b in itertools.pairwise(peaks)), peaks[-1] + 1]


def test_training_fit_equals_brute_force_on_the_grid(folders: dict[str, str]) -> None:
    assert tuple(dict.fromkeys(o["method"] for o in every_option())) == METHODS
    cases, answered = 0, set()
    for name, context in itertools.product(MODELS, CONTEXTS):
        folder = folders[name]
        for budget in budgets(folder, context):
            result = nbhw.fit(folder, task="train", batch=ROWS, context=context, device_memory=budget, **ON)
            assert isinstance(result, TrainFitResult)
            judged = [(o, *planned(folder, budget, context, o)) for o in every_option()]
            best = next((i for i, (_, p, _) in enumerate(judged) if p is not None and p.fits), None)
            case = (name, context, budget)
            if best is None:
                assert result.plan is None and len(result.rejected) == len(judged), case
            else:
                assert result.option is not None and result.option.values() == judged[best][0], case
                assert result.plan is not None and result.plan.fits and len(result.rejected) == best, case
                answered.add(best)
            for rejected, (option, _, words) in zip(result.rejected, judged, strict=False):
                assert rejected.option.values() == option and rejected.reason == words, case
            cases += 1
    # every planned option (full and LoRA, each checkpointing and split) wins somewhere; QLoRA is refused here
    assert cases >= 30 and answered == set(range(8)), (cases, answered)


def test_nothing_fits_names_a_shorter_context_that_does(folders: dict[str, str]) -> None:
    folder, context = folders["llama"], 256
    least = min(budgets(folder, context))  # below every option's peak at 256 tokens
    result = nbhw.fit(folder, task="train", batch=ROWS, context=context, device_memory=least, **ON)
    assert result.plan is None
    shorter = [c for c in result.nearest if c.what.startswith("context ")]
    assert len(shorter) == 1, [c.what for c in result.nearest]
    found = shorter[0].plan
    assert found.fits and found.args.context < context
    # the longest (to about 1.5 %) at which it fits: a few percent longer does not
    a = found.args
    same = {"method": a.method, "gradient_checkpointing": a.gradient_checkpointing, "batch": a.batch,
            "gradient_accumulation_steps": a.gradient_accumulation_steps}  # fmt: skip
    longer = nbhw.train_plan(folder, device_memory=least, context=int(a.context * 1.05) + 1, **ON, **same)
    assert not longer.fits
    assert "Nearest changes that fit" in result.text() and shorter[0].what in result.text()


def test_when_no_context_can_fit_one_probe_says_so(folders: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Below what the step holds whatever its rows (weights, gradients, optimizer state), no shorter context fits:
    the search probes the shortest once instead of halving down to it."""
    from nbhw.core.fit import train_search

    folder, context = folders["llama"], 256
    floor = nbhw.train_plan(folder, context=2, batch=ROWS, method="lora", **ON).peak_bytes
    contexts: list[int] = []
    plan = train_search.train_plan
    monkeypatch.setattr(train_search, "train_plan", lambda *a, **k: contexts.append(k["context"]) or plan(*a, **k))
    result = nbhw.fit(folder, task="train", batch=ROWS, context=context, device_memory=floor // 2, **ON)
    assert result.plan is None and not [c for c in result.nearest if c.what.startswith("context ")]
    assert [c for c in contexts if c != context] == [2]


def test_a_training_plan_for_a_catalog_target_takes_its_memory_count_and_precision(folders: dict[str, str]) -> None:
    from nbhw.core.hardware.targets import parse_target

    t4 = nbhw.train_plan(folders["llama"], method="lora", target="T4", context=64)
    assert (t4.args.devices, t4.args.dtype, t4.device.device_type) == (1, "float16", "cuda")
    assert t4.device.total == parse_target("T4").accelerator.memory_bytes
    assert "planning for 1x T4: hardware that is not here" in t4.text()
    h100 = nbhw.train_plan(folders["llama"], method="lora", target="2x H100", context=64)
    assert (h100.args.devices, h100.args.dtype) == (2, "bfloat16") and len(h100.rows) > 1
    assert h100.to_dict()["asked"]["target"] == parse_target("2x H100").text


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"task": "train", "max_memory": {0: "1GiB"}}, "max_memory is for task='infer'"),
        ({"task": "train", "device_map": "auto"}, "device_map is for task='infer'"),
        ({"devices": 2}, "devices is for task='train'"),
        ({"method": "lora"}, "method 'lora' is for task='train'"),
        ({"task": "train", "method": "qlora4"}, "unknown method 'qlora4'; valid: full, lora, qlora"),
        ({"task": "train", "accelerators_only": True}, "accelerators_only is for task='infer'"),
        ({"task": "train", "target": "T4", "device_memory": "1GiB"}, "sets the devices and their memory"),
        ({"task": "train", "target": "M3 Max 36GB"}, "training plans are for cuda devices"),
        ({"task": "train", "device_type": "cpu"}, "fit needs the memory of the devices trained on"),
        ({"task": "train", "batch": 0}, "batch must be a whole number of at least 1"),
    ],
)
def test_training_fit_mistakes_are_one_line_errors(values: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError) as caught:
        nbhw.fit(None, **values)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_cli_and_the_magic_take_the_training_words(
    folders: dict[str, str], ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from nbhw.__main__ import main

    folder = folders["llama"]
    words = [folder, "--task", "train", "--context", "64", "--device-type", "cpu", "--device-memory", "64GiB"]
    assert main(["fit", *words, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] and data["option"]["method"] == "full" and data["plan"]["fits"] is True
    assert data["pinned"] == {"context": 64, "device_type": "cpu", "device_memory": "64GiB"}
    assert main(["fit", *words[:-1], "1MiB"]) == 1  # nothing fits: exit 1, the reasons printed
    assert "nothing fits" in capsys.readouterr().out
    assert main(["fit", *words, "--max-memory", "0=1GiB"]) == 2
    assert "max_memory is for task='infer'" in capsys.readouterr().err
    ip.run_line_magic("load_ext", "nbhw")
    ip.run_line_magic("hw", "fit " + " ".join(words) + " --method lora --emit")
    assert "get_peft_model" in ip.rl_next_input and "TrainingArguments(" in ip.rl_next_input
    with pytest.raises(UsageError, match="devices is for task='train'"):
        ip.run_line_magic("hw", f"fit {folder} --devices 2")


# ---------------------------------------------------------------- a T4 target, QLoRA for real (bitsandbytes)

CASE = """
import sys
from pathlib import Path
from tests.support import published
import nbhw
published.folder("Llama-3.1-8B", Path(sys.argv[1]))
r = nbhw.fit("Llama-3.1-8B", task="train", target="T4", context="2k", batch=4)
print(r.text())
"""


@pytest.mark.slow
def test_an_8b_qlora_on_a_t4_is_the_answer_and_the_examples_page_shows_it(tmp_path: Path) -> None:
    if not BITSANDBYTES.is_dir():
        pytest.skip(f"bitsandbytes is not beside the venv ({BITSANDBYTES}; scripts/setup.sh test)")
    path = os.pathsep.join([str(ROOT), str(BITSANDBYTES)])
    proc = subprocess.run(
        [sys.executable, "-c", CASE, str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, timeout=900,
        env={**os.environ, "PYTHONPATH": path}, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    headline = out.splitlines()[0]
    assert headline.startswith("nbhw fit (train): qlora, ") and ", float16: fits: " in headline, headline
    assert "BitsAndBytesConfig(" in out and "fp16=True" in out and "planning for 1x T4" in out
    # every full and LoRA option lost on the T4's memory, by its own plan's verdict
    rejected = [line for line in out.splitlines() if line.startswith("  - full") or line.startswith("  - lora")]
    assert len(rejected) == 12 and all(": does not fit: " in line for line in rejected)
    page = (ROOT / "docs" / "reference" / "examples.md").read_text()
    assert headline in page and all(line in page for line in rejected)
