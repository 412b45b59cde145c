"""The option solver (nbhw.fit) against brute force: on a grid of small configs x budgets x contexts, the answer
is the best option by the documented order found by planning every combination, and every rejection's reason is
the one that option's own plan gives. Bad input: nothing fits is an answer, conflicts are one-line errors."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest
import transformers as tf
from IPython.core.error import UsageError

import nbhw
from nbhw.core.advice.quantization_gates import fix_for
from nbhw.core.advice.quantization_methods import Loads, build_config, loads, method_key, plan_words
from nbhw.core.advice.quantization_sizes import SizingQuantizer
from nbhw.core.errors import UserError
from nbhw.core.fit import solver
from nbhw.core.fit.fit_form import filled, fit_form
from nbhw.core.fit.options import WHERE_OF_KIND, options, quantization_order
from nbhw.core.hf.meta_build import quiet
from nbhw.core.plan.load_form import Form
from nbhw.core.plan.load_plan import LoadPlan, plan
from tests.support import families, published
from tests.support.models import config_only

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# name -> (config, architecture, checkpoint dtype)
MODELS: dict[str, tuple[Callable[[], Any], str, str]] = {
    "llama": (lambda: tf.LlamaConfig(**{**families.COMMON, "num_hidden_layers": 4}, head_dim=16),
              "LlamaForCausalLM", "float32"),
    "qwen3": (families.qwen3, "Qwen3ForCausalLM", "bfloat16"),
    "mixtral": (families.mixtral, "MixtralForCausalLM", "float32"),
    "mistral": (families.mistral, "MistralForCausalLM", "bfloat16"),
    "gpt2": (families.gpt2, "GPT2LMHeadModel", "float32"),
}  # fmt: skip
CONTEXTS = (200, 600, 1200, 1800)
MIN_CASES = 200
# Budgets as shares of N, what the run needs on one device in the checkpoint's dtype (so they scale to each model).
BUDGETS: dict[str, dict[int | str, float]] = {
    "one roomy": {0: 1.5},
    "one tight": {0: 0.8},
    "one tight + cpu": {0: 0.8, "cpu": 10},
    "one small + cpu": {0: 0.4, "cpu": 10},
    "one tiny + cpu": {0: 0.2, "cpu": 10},
    "two halves": {0: 0.5, 1: 0.5},
    "two roomy halves": {0: 0.6, 1: 0.6},
    "two small + cpu": {0: 0.3, 1: 0.3, "cpu": 10},
    "one far too small": {0: 0.05},
    "cpu only": {"cpu": 2},
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("fit")
    return {name: config_only(make(), root / name, arch, dtype) for name, (make, arch, dtype) in MODELS.items()}


def need(folder: str, context: int) -> int:
    """What the run needs on one device (weights, cache, activations; no reserve)."""
    p = nbhw.plan(folder, device_map=0, max_memory={0: 2**40}, context=context, reserve=0)
    with quiet():
        return int(p.placement.devices[0].needed_bytes)


def cases() -> list[tuple[str, str, int]]:
    return list(itertools.product(MODELS, BUDGETS, CONTEXTS))


def expected_reason(p: LoadPlan, problems: list[str], where: int | None, stage: int) -> str:
    """The option's own plan's words: its problems, else where its weights go, else its run's verdict."""
    if problems:
        return "; ".join(problems)
    placement = p.weight_placement if where != stage else p.placement
    return placement.verdict if placement is not None else "no placement"


def brute_force(
    folder: str, pinned: dict[str, Any], base: LoadPlan
) -> list[tuple[Any, LoadPlan, list[str], int | None, bool, bool]]:
    """Every option planned (the plans are the kept ones the solver shares), each judged by its own check(), its
    weights-only placement, its run and whether that run is tight (less room than the allocator needs)."""
    budget = base.args.max_memory_bytes
    has_acc = any(isinstance(k, int) for k in budget or {})
    every = options(base.inputs.checkpoint_dtype, pinned, has_budget=has_acc)
    search = solver.Search(folder, pinned, False, budget, True, (0, 1, 2), every, base)
    found = []
    with quiet():  # as the solver's search: quiet as a whole
        for option in every:
            p = solver.planned(folder, search.values(option), False, base)
            problems = [x for x in p.check() if x not in p.absent_devices]
            where = WHERE_OF_KIND.get(p.weight_placement.kind) if p.weight_placement else None
            fits = not problems and where is not None and bool(p.run_fits)
            found.append((option, p, problems, where, fits, bool(fits and p.run_tight)))
    return found


@pytest.mark.slow
@pytest.mark.timeout(1200)  # 40 cases, each searched and brute-forced: 5 min per 70 cases on a loaded machine
@pytest.mark.parametrize(
    "one", [pytest.param(m, marks=pytest.mark.xdist_group(f"fit-grid-{m}")) for m in MODELS]
)  # each model's cases are a part of their own, that xdist can run beside the others
def test_solver_equals_brute_force_on_the_grid(folders: dict[str, str], one: str) -> None:
    grid = cases()
    assert len(grid) >= MIN_CASES
    needs = {c: need(folders[one], c) for c in CONTEXTS}
    answered = nothing = 0
    for i, (model, budget_name, context) in enumerate(grid):
        if model != one:
            continue  # the case's index over the whole grid still says which options it searches
        n = needs[context]
        budget = {k: int(share * n) for k, share in BUDGETS[budget_name].items()}
        # To keep the grid quick: attention and kernels are searched in every tenth case (their other options are
        # refused here or plan the same), device_map strategies in every fifth, cache implementations in every
        # seventh (spread over budgets and contexts); the rest is searched everywhere.
        pinned: dict[str, Any] = {"max_memory": budget, "context": context, "reserve": 0}
        if i % 7 != 3:
            pinned |= {"cache_implementation": None}
        if i % 10:
            pinned |= {"attn_implementation": "sdpa", "use_kernels": False}
        if i % 5:
            pinned |= {"device_map": "auto"}
        # every quantization method in every tenth case (most are refused here, their reasons compared all the
        # same); elsewhere quantization is pinned off (test_each_method_that_runs_here_wins_where_its_budget_says
        # gives the methods budgets that reach them)
        if i % 10 != 2:
            pinned |= {"quantization": None}
        result = nbhw.fit(folders[model], **pinned)
        base = result.search.base
        planned = brute_force(folders[model], dict(result.search.pinned), base)
        # the best stage, then room for the allocator over tight, then the documented order
        ranked = [(where, tight, index) for index, (_, _, _, where, fits, tight) in enumerate(planned) if fits]
        label = f"{model} / {budget_name} / {context}"
        print(label, result.headline(), f"{result.seconds:.2f} s", flush=True)
        if not ranked:
            assert result.plan is None, label
            assert all(r.why in ("refused", "placed", "run") for r in result.rejected)
            nothing += 1
        else:
            where, _, index = min(ranked)
            assert result.option == planned[index][0], label
            assert result.answer is not None and result.answer.where == where, label
            answered += 1
        for r in result.rejected:
            index = result.search.options.index(r.option)
            _, own, problems, where, _, _ = planned[index]
            assert r.reason == expected_reason(own, problems, where, r.stage), (label, r.option)
    assert answered and nothing, (answered, nothing)


def test_quantization_is_searched_in_the_documented_order() -> None:
    order = quantization_order()
    assert sorted(order) == sorted(plan_words())  # every word a plan takes, once: the plan's own list
    assert order.index("8bit") == 0 and order.index("8bit") < order.index("quanto") < order.index("4bit")

    def bits(word: str) -> float:
        key = method_key(word)
        element = SizingQuantizer(key, build_config(key, "bfloat16")[0]).element
        return 8 * element if element is not None else 0.0  # unknown here (its config needs its package): last

    assert [bits(w) for w in order] == sorted((bits(w) for w in order), reverse=True)
    for word in order:  # within the same bits: on load before calibrated, bitsandbytes first
        same = [w for w in order if bits(w) == bits(word)]
        calibrated = [loads(method_key(w))[0] is Loads.CALIBRATED for w in same]
        assert calibrated == sorted(calibrated), same
        assert same[0] in ("8bit", "4bit") or not {"8bit", "4bit"} & set(same), same
    searched = dict.fromkeys((o.dtype, o.quantization) for o in options("float32", {}, has_budget=False))
    assert list(searched) == [("auto", None), ("bfloat16", None), ("float16", None), *(("auto", q) for q in order)]


def _need(folder: str, context: int, quantization: str | None) -> tuple[int, int] | None:
    """What the run needs on one device with this quantization: with room for its allocator, and its tensors alone;
    None when its plan is refused here."""
    p = nbhw.plan(folder, device_map=0, max_memory={0: 2**40}, context=context, reserve=0, quantization=quantization)
    with quiet():
        if [x for x in p.check() if x not in p.absent_devices] or p.placement is None:
            return None
        share = p.placement.devices[0]
        return int(share.needed_bytes) + int(share.margin_bytes), int(share.needed_bytes)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen3", "mistral"])  # bfloat16 checkpoints: no smaller float dtype
def test_each_method_that_runs_here_wins_where_its_budget_says(folders: dict[str, str], model: str) -> None:
    folder, context = folders[model], 200
    pinned: dict[str, Any] = {"context": context, "reserve": 0, "attn_implementation": "sdpa", "use_kernels": False,
                              "device_map": "auto"}  # fmt: skip
    found = {q: _need(folder, context, q) for q in [None, *quantization_order()]}
    needs_of = {q: None if f is None else f[0] for q, f in found.items()}
    runs_here = [q for q, need in needs_of.items() if need is not None and q is not None]
    assert "quanto" in runs_here, needs_of  # optimum-quanto is in the test environment
    needs = sorted({need for need in needs_of.values() if need is not None})
    tensors = min(f[1] for f in found.values() if f is not None)
    # a budget between each pair of neighbouring needs (with the allocator's margin), and one under the least
    # tensors: each option that runs here wins where its own need is the largest that fits with room, unless one
    # ranked ahead of it needs no more
    budgets = [int(need * 1.001) for need in needs] + [tensors // 2]
    won = set()
    for budget in budgets:
        result = nbhw.fit(folder, max_memory={0: budget}, accelerators_only=True, **pinned)
        planned = brute_force(folder, dict(result.search.pinned), result.search.base)
        ranked = sorted((tight, index) for index, (_, _, _, where, fits, tight) in enumerate(planned)
                        if fits and where == 0)  # fmt: skip
        assert result.option == (planned[ranked[0][1]][0] if ranked else None), budget
        for r in result.rejected:
            _, own, problems, where, _, _ = planned[result.search.options.index(r.option)]
            assert r.reason == expected_reason(own, problems, where, r.stage), r.option
        won.add(result.option.quantization if result.option else "nothing")
        refused = [r for r in result.rejected if r.why == "refused" and r.option.quantization]
        # Each refusal names its fix: nbhw's "(fix: ...)", or transformers' own words when they already say it
        # ("requires a CUDA GPU"), which is when nbhw adds none (plan_checks.with_fix).
        unnamed = [r.reason for r in refused if "fix: " not in r.reason and fix_for(r.reason) not in r.reason]
        assert unnamed == [], unnamed
    assert {*runs_here, None, "nothing"} <= won, (won, needs_of)
    print(model, {q: need for q, need in needs_of.items() if need is not None}, "answers:", won)


def test_the_solver_prefers_room_for_the_allocator_and_says_so(folders: dict[str, str]) -> None:
    folder, context = folders["llama"], 600  # a float32 checkpoint: bfloat16 needs about half
    pinned: dict[str, Any] = {"context": context, "reserve": 0, "attn_implementation": "sdpa", "use_kernels": False,
                              "device_map": "auto", "quantization": None, "cache_implementation": None}  # fmt: skip
    whole = nbhw.plan(folder, device_map=0, max_memory={0: 2**40}, context=context, reserve=0)
    with quiet():
        share = whole.placement.devices[0]  # type: ignore[union-attr]
    budget = int(share.needed_bytes) + int(share.margin_bytes) - 1  # float32 fits, less its allocator's margin
    result = nbhw.fit(folder, max_memory={0: budget}, accelerators_only=True, **pinned)
    assert result.option is not None and result.option.dtype == "bfloat16", result.headline()
    assert result.plan is not None and result.plan.placement.run_kind == "fits"  # type: ignore[union-attr]
    first = result.rejected[0]
    assert (first.option.dtype, first.why) == ("auto", "tight")
    assert first.reason.startswith("tight on one device (accelerator 0) at 600 tokens: ")
    # only float32 asked for: the tight plan is the answer, and its verdict says tight
    alone = nbhw.fit(folder, max_memory={0: budget}, accelerators_only=True, dtype="auto", **pinned)
    assert alone.plan is not None and alone.plan.placement.run_kind == "tight"  # type: ignore[union-attr]
    assert "tight on one device" in alone.headline()


# ---------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def llama70b(tmp_path_factory: pytest.TempPathFactory) -> str:
    return published.folder("Llama-3.1-70B", tmp_path_factory.mktemp("published"))


def test_an_impossible_request_is_an_answer_not_an_exception(llama70b: str) -> None:
    # a 70B at 128k on one T4: the prefill's logits alone (131,072 x 128,256 x 4 B) are over any 15 GiB device
    # attention and kernels pinned: every quantization method is searched (quanto's plans run a dry run each here)
    result = nbhw.fit(llama70b, context="128k", max_memory={0: "15GiB"}, accelerators_only=True,
                      attn_implementation="sdpa", use_kernels=False)  # fmt: skip
    assert result.plan is None and result.code is None
    assert result.rejected and all(r.reason for r in result.rejected[:50])
    assert "nothing fits" in result.text() and result.to_dict()["fits"] is False
    for change in result.nearest:
        assert change.plan.run_fits


def test_nothing_fits_names_the_nearest_changes_that_do(folders: dict[str, str]) -> None:
    folder = folders["llama"]
    # 6 MiB: 2 MiB more than the least an allocator needs left free (a small-pool segment and one more for a block
    # of up to 1 MiB); 8 sequences of 600 tokens are over it in every dtype, fewer tokens are not
    budget = {0: 6 * 2**20}
    result = nbhw.fit(folder, context=600, batch=8, max_memory=budget, reserve=0, accelerators_only=True)
    assert result.plan is None
    changes = [c.what for c in result.nearest]
    assert changes and all(c.startswith("context ") or "accelerators of" in c for c in changes), changes
    for change in result.nearest:  # each is a plan that fits, by its own verdict
        assert change.plan.placement is not None and change.plan.placement.run_kind == "fits", change.what
    assert "Nearest changes that fit" in result.text()


def test_a_catalog_target_is_searched_on_its_own_memory_and_rules(folders: dict[str, str]) -> None:
    result = nbhw.fit(folders["llama"], context=600, target="t4")
    assert result.plan is not None and result.plan.target is not None and result.plan.target.text == "T4"
    assert result.option is not None and result.option.share == 1.0 and "max_memory" not in (result.code or "")
    # the T4's compute capability 7.5 refuses flash attention, by the plan's own check for the target
    flash = [r for r in result.rejected if (r.option.attn_implementation or "").startswith("flash_attention")]
    assert flash and all("7.5" in r.reason for r in flash if not r.option.use_kernels)
    assert result.option.attn_implementation in ("sdpa", "eager")


def test_when_nothing_fits_a_target_more_of_its_cards_are_the_nearest_change(llama70b: str) -> None:
    pinned = {"dtype": "auto", "attn_implementation": "sdpa", "use_kernels": False, "device_map": "auto"}
    result = nbhw.fit(llama70b, context=512, target="t4", accelerators_only=True, **pinned)
    assert result.plan is None
    more = [c for c in result.nearest if c.what.startswith("target '")]
    assert len(more) == 1, [c.what for c in result.nearest]
    found = more[0].plan
    assert found.target is not None and found.target.cards > 1 and found.run_fits
    # the first count (one more, then doubling) that fits: the count before it does not
    counts = [2, 4, 8, 16, 32, 64]
    assert found.target.cards in counts, found.target.cards
    fewer = counts[counts.index(found.target.cards) - 1] if found.target.cards > 2 else 1
    with quiet():
        assert not nbhw.plan(llama70b, context=512, target=f"{fewer}x T4", **pinned).run_fits
    assert f"  - {more[0].what}: " in result.text() and f"target '{found.target.text}'" in more[0].what


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"accelerators_only": True, "device_map": "cpu"}, "puts layers off the accelerators"),
        ({"accelerators_only": True, "max_memory": {"cpu": "10GiB"}}, "names no accelerator"),
        ({"method": "lora"}, "is for task='train'"),
        ({"task": "serve"}, "unknown task 'serve'; valid: infer, train"),
        ({"context": 0}, "context 0 is out of range"),
        ({"context": 10**9}, "out of range"),
        ({"batch": 0}, "batch 0 is out of range"),
        ({"quantize": "4bit"}, "unknown argument 'quantize'"),
        ({"dtype": "int8"}, "dtype"),
        ({"quantization": "int3"}, "unknown quantization 'int3'; valid: 4bit, 8bit, "),
        ({"quantization": "awq"}, "quantization (transformers' awq pre-quantized checkpoints only) 'awq'; valid: 4bit"),
    ],
)
def test_conflicting_or_bad_options_are_one_line_errors(values: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError) as caught:
        nbhw.fit(None, **values)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_cli_and_the_magic_take_the_same_words(
    ip: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbhw.__main__ import main

    assert main(["fit", "--context", "200", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["fits"] and found["plan"]["code"] and found["option"]["attn_implementation"] == "sdpa"
    assert main(["fit", "--context", "zero"]) == 2
    assert "context 'zero' is not a token count" in capsys.readouterr().err
    seen: list[str] = []
    monkeypatch.setattr(ip, "set_next_input", lambda text, replace=False: seen.append(text))
    ip.run_line_magic("load_ext", "nbhw")
    ip.run_line_magic("hw", "fit --context 200 --emit")
    assert seen == [found["plan"]["code"]]
    with pytest.raises(UsageError, match="accelerators_only=True but device_map='cpu'"):
        ip.run_line_magic("hw", "fit --accelerators-only --device-map cpu")


def test_a_memory_share_leaves_the_rest_of_the_device_to_the_run(tmp_path: Any) -> None:
    """A share of max_memory moves layers to the CPU so that the run has room: its plan checks the run against the
    whole device (``budget``), while the cell's max_memory is the share."""
    config = tf.LlamaConfig(**{**families.COMMON, "num_hidden_layers": 8, "hidden_size": 256,
                               "intermediate_size": 1024, "num_attention_heads": 4, "num_key_value_heads": 2},
                            head_dim=64)  # fmt: skip
    folder = config_only(config, tmp_path / "llama", "LlamaForCausalLM", "float32")
    pinned: dict[str, Any] = {"context": 512, "reserve": 0, "attn_implementation": "sdpa", "use_kernels": False,
                              "device_map": "auto", "quantization": None, "cache_implementation": None,
                              "dtype": "auto"}  # fmt: skip
    device = int(0.95 * need(folder, 512))  # all the weights fit, and the run on them does not
    result = nbhw.fit(folder, max_memory={0: device, "cpu": 10 * device}, **pinned)
    assert result.option is not None and result.option.share < 1.0, result.headline()
    assert result.answer is not None and result.answer.where == 1  # with CPU offload
    first = result.rejected[0]  # every layer on the device: its run is over the device
    assert (first.option.share, first.stage, first.why) == (1.0, 0, "run"), first.reason
    later = [r for r in result.rejected if r.stage == 1]  # larger shares with CPU offload: runs over the device
    assert all(r.why == "run" and r.option.share > result.option.share for r in later), [r.reason for r in later]
    plan = result.plan
    assert plan is not None and plan.args.budget == {0: device} and plan.placement is not None
    assert next(s for s in plan.placement.devices if s.key == 0).budget == device
    cut = plan.args.max_memory
    assert cut is not None and f"max_memory={{0: {cut[0]!r}" in (result.code or "")


def test_make_it_fit_keeps_the_forms_target(folders: dict[str, str]) -> None:
    form, result = fit_form(Form(folders["llama"], context="600", target="T4"))
    assert result.plan is not None and result.plan.target is not None and result.plan.target.text == "T4"
    assert form.target == "T4"  # the tab plans what the button found: on the T4, not on this machine
    assert plan(folders["llama"], **form.plan_values()).code == result.code


def test_a_memory_share_fills_the_form_with_its_budget(tmp_path: Any) -> None:
    """The Load tab's form after "Make it fit" gives the plan the fit chose, budget included: the tab's verdict is
    the fit's, not the run checked against the share. A max_memory typed afterwards ends the budget."""
    config = tf.LlamaConfig(**{**families.COMMON, "num_hidden_layers": 8, "hidden_size": 256,
                               "intermediate_size": 1024, "num_attention_heads": 4, "num_key_value_heads": 2},
                            head_dim=64)  # fmt: skip
    folder = config_only(config, tmp_path / "llama", "LlamaForCausalLM", "float32")
    device = int(0.95 * need(folder, 512))
    pinned: dict[str, Any] = {"context": 512, "reserve": 0, "attn_implementation": "sdpa", "use_kernels": False,
                              "device_map": "auto", "quantization": None, "cache_implementation": None,
                              "dtype": "auto"}  # fmt: skip
    result = nbhw.fit(folder, max_memory={0: device, "cpu": 10 * device}, **pinned)
    assert result.option is not None and result.option.share < 1.0 and result.plan is not None
    form = filled(Form(folder, context="512"), result)
    assert form.budget == (("0", str(device)),)
    again = plan(folder, **form.plan_values(), reserve=0)
    assert again.code == result.code and again.args.budget == {0: device}
    assert again.placement is not None and result.plan.placement is not None
    assert again.placement.run_kind == result.plan.placement.run_kind in ("fits", "tight")
    assert form.replace(max_memory=(("0", "1GiB"),)).budget == ()
