"""nbhw.holders() in a real IPython shell: each kind of holder is attributed exactly its tensors' bytes.

Every attribution test also checks the balance: attributed + unattributed == the tensors' total, per device.
"""

from __future__ import annotations

import gc
import json
import random
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import nbhw
import nbhw.session
from nbhw.core.cache import Recent
from nbhw.core.errors import UserError
from nbhw.core.memory import holders as H
from nbhw.core.memory.allocator import TorchMemory
from nbhw.core.memory.keeps_alive import Walker, device_of, key_of, on_device, where
from nbhw.session import shell_holders
from tests.support.cells import fails, run, storage_bytes
from tests.support.fake_allocator import FakeDevice, FakeMemory
from tests.support.shells import fresh_session


@pytest.fixture(scope="module")
def collected() -> None:
    """One full collection before the module's first test (each later test starts after its predecessor's)."""
    gc.collect()


@pytest.fixture
def shell(ip: Any, collected: None) -> Iterator[Any]:
    """conftest's fresh_ip with one full gc.collect() a test instead of three (see tests/support/shells.py)."""
    with fresh_session(ip):
        run(ip, "import torch\nfrom torch import nn")
        yield ip


def group(report: H.Holders, *labels: str, device: str = "cpu") -> H.Group:
    """The group held by exactly these holders."""
    for g in report.device(device).groups:
        if sorted(h.label for h in g.holders) == sorted(labels):
            return g
    shown = [g.label for g in report.device(device).groups]
    raise AssertionError(f"no group held by exactly {labels}; groups: {shown}")


def unwrapped(t: Any) -> Any:
    """What a tensor of (nested) vmap levels wraps (transformers' mask helpers nest vmap over four dimensions)."""
    while torch._C._functorch.is_batchedtensor(t):
        t = torch._C._functorch.get_unwrapped(t)
    return t


def balanced(report: H.Holders) -> None:
    for d in report.devices:
        assert d.attributed + d.unattributed == d.tensors
        assert d.attributed == sum(g.nbytes for g in d.groups)


def test_a_variable_holding_a_tensor_is_attributed_its_bytes(shell: Any) -> None:
    run(shell, "t = torch.zeros(1000)")
    report = shell_holders(shell)
    assert report.held_by("t") == 4000
    assert group(report, "t").storages == 1
    balanced(report)


def test_the_sharded_dry_runs_of_a_training_plan_leave_nothing_the_walk_trips_on(shell: Any) -> None:
    # A two-device training plan shards its meta step with FSDP2 and tensor parallelism under fake mode: the DTensors
    # it made may still be alive (gc has not run), and their __tensor_flatten__ names a non-tensor (the mesh).
    run(shell, "import nbhw\nplan = nbhw.train_plan(method='lora', target='2x H100', context=16)\n"
               "t = torch.zeros(1000)")  # fmt: skip
    report = shell_holders(shell)
    assert report.held_by("t") == 4000
    balanced(report)


def test_a_storage_key_gives_back_its_device_and_address_and_keys_on_one_device_are_picked_out() -> None:
    top = (1 << 57) - 8  # above any user-space address of a 64-bit machine
    keys = {key_of(device, ptr) for device in ("cpu", "cuda:0", "cuda:1") for ptr in (0, 8, top)}
    assert len(keys) == 9
    assert sorted(map(where, keys)) == sorted((d, p) for d in ("cpu", "cuda:0", "cuda:1") for p in (0, 8, top))
    assert {where(k) for k in on_device(keys, "cuda:1")} == {("cuda:1", p) for p in (0, 8, top)}
    assert on_device(keys, "xpu:0") == set()
    assert {device_of(k) for k in keys} == {"cpu", "cuda:0", "cuda:1"}


def test_an_object_many_others_share_is_walked_once_in_one_frontier_and_after() -> None:
    shared = {"weight": torch.zeros(10)}
    walker = Walker(torch, set())
    keys, _ = walker.reach([[shared] * 1000 + [[shared]] * 1000])  # 1000 in one frontier, 1000 more one level down
    assert {where(k)[0] for k in keys} == {"cpu"} and len(keys) == 1
    assert walker.visited <= 6  # the root list, the 1000 lists of one (one object), the dict, the tensor


def test_each_storage_lands_in_the_group_of_exactly_the_holders_that_keep_it() -> None:
    """The groups are split part by part with set operations; checked against asking each storage who keeps it."""
    rng = random.Random(21)
    storages = [key_of("cpu", i) for i in range(300)]
    for _ in range(20):
        holder_keys = [set(rng.sample(storages, rng.randint(0, 120))) for _ in range(rng.randint(1, 8))]
        expected: dict[tuple[int, ...], set[int]] = {}
        for key in set().union(*holder_keys):
            expected.setdefault(tuple(i for i, keys in enumerate(holder_keys) if key in keys), set()).add(key)
        assert H._groups(holder_keys) == expected


def test_a_view_counts_its_whole_storage_and_two_names_share_one_group(shell: Any) -> None:
    run(shell, "base = torch.zeros(1000)\nview = base[:10]\nalias = base")
    report = shell_holders(shell)
    g = group(report, "base", "view", "alias")
    assert (g.nbytes, g.storages, g.kind) == (4000, 1, "variable")
    assert report.held_by("base") == 0  # no one of them alone keeps it alive


def test_a_list_and_a_dict_of_tensors(shell: Any) -> None:
    run(
        shell,
        "xs = [torch.zeros(10), torch.zeros(20)]\n"
        "d = {'a': torch.zeros(5), 'b': [torch.zeros(7, dtype=torch.float64)]}",
    )
    report = shell_holders(shell)
    assert report.held_by("xs") == 120
    assert report.held_by("d") == 20 + 56
    assert group(report, "xs").storages == 2


def test_a_model_holds_its_parameters_buffers_and_grads(shell: Any) -> None:
    run(shell, "model = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4))\nmodel(torch.randn(3, 8)).sum().backward()")
    model = shell.user_ns["model"]
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    expected = storage_bytes([*model.parameters(), *model.buffers(), *grads])
    assert len(grads) == 4
    report = shell_holders(shell)
    assert report.held_by("model") == expected
    balanced(report)


def test_an_optimizer_holds_its_states_and_shares_the_parameters_with_the_model(shell: Any) -> None:
    run(
        shell,
        "model = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4))\n"
        "opt = torch.optim.AdamW(model.parameters())\n"
        "model(torch.randn(3, 8)).sum().backward()\nopt.step()",
    )
    model, opt = shell.user_ns["model"], shell.user_ns["opt"]
    states = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    params = list(model.parameters())
    report = shell_holders(shell)
    assert report.held_by("opt") == storage_bytes(states)
    assert group(report, "model", "opt").nbytes == storage_bytes(params + [p.grad for p in params])
    assert report.held_by("model") == storage_bytes(list(model.buffers()))  # the running stats: not the optimizer's
    balanced(report)


def test_a_tensor_only_a_modules_hook_closure_keeps_is_the_models(shell: Any) -> None:
    # The walk drops empty builtin containers (a module's dozen empty hook dicts): a filled one is still walked.
    run(
        shell,
        "model = nn.Linear(2, 2)\n"
        "def hooked():\n"
        "    scale = torch.zeros(1000)\n"
        "    model.register_forward_hook(lambda m, i, o: o * scale.sum())\n"
        "    model.register_forward_pre_hook(lambda m, i: i)\n"
        "hooked()",
    )
    model = shell.user_ns["model"]
    report = shell_holders(shell)
    assert report.held_by("model") == 4000 + storage_bytes(list(model.parameters()))
    balanced(report)


def test_the_output_history_holds_what_a_cell_displayed(shell: Any) -> None:
    result = run(shell, "torch.ones(50)")
    n = result.execution_count
    report = shell_holders(shell)
    g = group(report, f"Out[{n}]")
    assert (g.nbytes, g.kind) == (200, "output")
    assert {f"_{n}", "_"} <= set(g.holders[0].aliases)
    assert "IPython last_execution_result.result" in g.holders[0].aliases


def test_underscore_alone_still_holds_an_output_dropped_from_Out(shell: Any) -> None:
    n = run(shell, "torch.ones(60)").execution_count
    run(shell, f"del Out[{n}], _{n}")
    report = shell_holders(shell)
    g = group(report, "_")
    assert (g.nbytes, g.kind) == (240, "output")
    assert "IPython displayhook._" in g.holders[0].aliases  # IPython's own copy: clearing `_` alone is not enough


def test_the_last_tracebacks_frames_hold_their_locals(shell: Any) -> None:
    run(shell, "def f():\n    x = torch.zeros(2000)\n    y = x[:10]\n    raise ValueError('boom')\n")
    fails(shell, "f()")
    report = shell_holders(shell)
    g = group(report, "f() › x", "f() › y")
    assert (g.nbytes, g.kind) == (8000, "traceback")
    balanced(report)


def test_an_autograd_graph_hanging_off_a_held_tensor(shell: Any) -> None:
    # exp saves its result and sin its input: the same 400-byte intermediate, which only the graph keeps.
    run(shell, "a = torch.randn(100, requires_grad=True)\ny = a.exp().sin()")
    report = shell_holders(shell)
    assert report.held_by("y") == 400
    assert report.held_by("autograd graph of y") == 400
    assert group(report, "a", "autograd graph of y").nbytes == 400  # AccumulateGrad keeps the leaf too
    balanced(report)


def test_a_custom_autograd_functions_saved_tensors_and_ctx_attributes(shell: Any) -> None:
    run(
        shell,
        "class Twice(torch.autograd.Function):\n"
        "    @staticmethod\n"
        "    def forward(ctx, x):\n"
        "        ctx.save_for_backward(x * 2)\n"
        "        ctx.extra = torch.ones(30)\n"
        "        return x.clone()\n"
        "    @staticmethod\n"
        "    def backward(ctx, g):\n"
        "        return g\n"
        "x = torch.randn(50, requires_grad=True)\nout = Twice.apply(x)",
    )
    report = shell_holders(shell)
    assert report.held_by("autograd graph of out") == 200 + 120


def test_saved_tensor_hooks_are_never_run_by_the_walk(shell: Any) -> None:
    run(
        shell,
        "unpacked = []\n"
        "def pack(t):\n    return ('packed', t.clone())\n"
        "def unpack(p):\n    unpacked.append(1)\n    return p[1]\n"
        "a = torch.randn(100, requires_grad=True)\n"
        "with torch.autograd.graph.saved_tensors_hooks(pack, unpack):\n    y = a.exp().sin()",
    )
    report = shell_holders(shell)
    assert shell.user_ns["unpacked"] == []
    assert report.held_by("autograd graph of y") == 800  # the two clones pack made, found in what pack returned


def test_a_transformers_cache_object(shell: Any) -> None:
    run(
        shell,
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,\n"
        "                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)\n"
        "model = LlamaForCausalLM(cfg).eval()\n"
        "with torch.no_grad():\n"
        "    cache = model(torch.ones(1, 5, dtype=torch.long), use_cache=True).past_key_values\n",
    )
    cache = shell.user_ns["cache"]
    assert type(cache).__name__ == "DynamicCache"
    expected = storage_bytes([t for layer in cache.layers for t in (layer.keys, layer.values)])
    assert expected == 2 * 2 * (1 * 2 * 5 * 8 * 4)
    report = shell_holders(shell)
    assert report.held_by("cache") == expected
    model = shell.user_ns["model"]
    assert report.held_by("model") == storage_bytes([*model.parameters(), *model.buffers()])
    balanced(report)


def test_tensors_held_only_by_nbhw_are_named_and_there_are_none_otherwise(shell: Any) -> None:
    run(shell, "t = torch.zeros(10)")
    assert not [g for d in shell_holders(shell).devices for g in d.groups if g.kind == "nbhw"]
    probe = types.ModuleType("nbhw._leak_probe")
    probe.kept = [torch.zeros(25)]  # type: ignore[attr-defined]
    sys.modules["nbhw._leak_probe"] = probe
    try:
        report = shell_holders(shell)
        assert report.held_by("nbhw._leak_probe.kept") == 100
        assert group(report, "nbhw._leak_probe.kept").kind == "nbhw"
    finally:
        del sys.modules["nbhw._leak_probe"]


def test_the_planners_caches_are_not_walked_and_hide_nothing(shell: Any) -> None:
    run(shell, "t = torch.zeros(10)")
    before = shell_holders(shell)
    probe = types.ModuleType("nbhw._cache_probe")
    plans: Recent[Any] = Recent(64)  # what a fit leaves: meta builds, thousands of modules and parameters
    for i in range(8):
        with torch.device("meta"):
            plans.put(i, torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(50))))
    probe.plans = plans  # type: ignore[attr-defined]
    sys.modules["nbhw._cache_probe"] = probe
    try:
        assert shell_holders(shell).visited <= before.visited + 50  # the 400 modules were not walked
        kept = torch.zeros(25)
        plans.put("real", kept)  # never done by nbhw: if it were, the bytes would still show
        report = shell_holders(shell)
        assert report.storages[("cpu", kept.untyped_storage().data_ptr())] == (100, frozenset())
        balanced(report)
    finally:
        del sys.modules["nbhw._cache_probe"]


def test_a_tensor_no_holder_explains_is_unattributed_never_hidden(shell: Any) -> None:
    orphan = torch._holders_orphan = torch.zeros(777, dtype=torch.float64)  # type: ignore[attr-defined]
    try:
        report = shell_holders(shell)
        cpu = report.device("cpu")
        assert report.storages[("cpu", orphan.untyped_storage().data_ptr())] == (777 * 8, frozenset())
        # The rest is every storage no holder explains (an earlier test's leftovers too), the largest three shown.
        unheld = sorted((n for k, (n, by) in report.storages.items() if k[0] == "cpu" and not by), reverse=True)
        assert (cpu.unattributed, cpu.unattributed_storages) == (sum(unheld), len(unheld))
        assert len(cpu.unattributed_examples) == min(3, len(unheld))
        if unheld[min(2, len(unheld) - 1)] <= 777 * 8:
            assert any(e.startswith("float64[777]") for e in cpu.unattributed_examples)
        assert "unattributed" in report.text()
        balanced(report)
    finally:
        del torch._holders_orphan  # type: ignore[attr-defined]


def test_a_tensor_kept_past_its_vmap_call_is_attributed_what_it_wraps(shell: Any) -> None:
    run(shell, "kept = []\ndef f(x):\n    kept.append(x)\n    return x * 2\nout = torch.vmap(f)(torch.ones(3, 50))")
    run(
        shell,
        "deep = []\ndef g(x):\n    deep.append(x)\n    return x + 1\n"
        "nested = torch.vmap(torch.vmap(g))(torch.ones(2, 3, 7))",
    )
    assert torch._C._functorch.is_batchedtensor(shell.user_ns["kept"][0])  # no storage of its own
    report = shell_holders(shell)
    assert report.held_by("kept") == 3 * 50 * 4  # the batch it wraps (its Python object died with the call)
    assert report.held_by("out") == 3 * 50 * 4
    assert report.held_by("deep") == 2 * 3 * 7 * 4  # through both vmap levels
    balanced(report)


def test_tensors_only_cpp_holds_are_found_through_the_graph_and_count_in_the_total(shell: Any) -> None:
    # layer_norm's saved mean and rstd are made in C++ and never had a Python object: gc cannot see them.
    # (A temporary that once had one, like a.exp() in a.exp().sin(), keeps it: torch preserves the PyObject.)
    run(shell, "x = torch.randn(4, 100, requires_grad=True)\nz = torch.nn.functional.layer_norm(x, (100,))")
    found = set(map(where, Walker(torch, set()).find_all()))
    report = shell_holders(shell)
    graph_only = [n for k, (n, _) in report.storages.items() if k not in found]
    assert sorted(graph_only) == [16, 16]
    assert report.held_by("autograd graph of z") == 32
    assert report.device("cpu").tensors == sum(n for n, _ in report.storages.values())


def test_the_allocator_figures_and_its_cache_are_shown(shell: Any) -> None:
    gpu = FakeDevice(limit=10**9)
    shell.user_ns["gpu"] = gpu
    run(shell, "with gpu:\n    keep = torch.zeros(1000)\n    gone = torch.zeros(500)\ndel gone")
    report = shell_holders(shell, memory=FakeMemory(gpu))
    cpu = report.device("cpu")
    assert (cpu.allocated, cpu.reserved, cpu.cached) == (4000, 6000, 2000)
    assert "allocator cache (reserved, unused)" in report.text()


def test_an_unknown_device_is_a_one_line_error(shell: Any) -> None:
    run(shell, "t = torch.zeros(3)")
    with pytest.raises(UserError, match=r"^no tensors on 'cuda:7'; devices with tensors: cpu$"):
        shell_holders(shell, device="cuda:7")


def test_modules_functions_and_the_shell_are_not_walked_into(shell: Any) -> None:
    run(shell, "import numpy as np\nip = get_ipython()\ng = globals()\nsmall = torch.zeros(4)")
    report = shell_holders(shell)
    assert report.held_by("small") == 16
    assert report.reached_from("ip") == 0 and report.reached_from("g") == 0


def test_a_closure_holds_what_it_captured(shell: Any) -> None:
    run(shell, "def make():\n    kept = torch.zeros(9)\n    return lambda: kept.sum()\nfn = make()")
    assert shell_holders(shell).held_by("fn") == 36


def test_a_wrapper_subclass_counts_its_inner_tensors_and_a_sparse_tensor_its_parts(shell: Any) -> None:
    run(
        shell,
        "from torch.testing._internal.two_tensor import TwoTensor\n"
        "pair = TwoTensor(torch.zeros(10), torch.ones(10))\n"
        "sparse = torch.eye(4).to_sparse()",
    )
    report = shell_holders(shell)
    assert report.held_by("pair") == 80
    sparse = shell.user_ns["sparse"]
    assert report.held_by("sparse") == sparse._indices().nbytes + sparse._values().nbytes


def test_meta_and_fake_tensors_hold_no_memory(shell: Any) -> None:
    run(
        shell,
        "from torch._subclasses.fake_tensor import FakeTensorMode\n"
        "with torch.device('meta'):\n    big = nn.Linear(4096, 4096)\n"
        "with FakeTensorMode():\n    fake = torch.zeros(1000, 1000)\n"
        "small = torch.zeros(2)",
    )
    assert type(shell.user_ns["fake"]).__name__ == "FakeTensor"
    report = shell_holders(shell)
    assert report.reached_from("big") == 0 and report.reached_from("fake") == 0
    assert report.names() == ["cpu"]


def test_device_counters_are_read_only_from_an_initialised_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    # The CUDA module is faked at the boundary: the counters are never asked before CUDA is initialised.
    asked: list[int] = []

    def allocated(index: int) -> int:
        asked.append(index)
        return 123

    monkeypatch.setattr(torch.cuda, "memory_allocated", allocated)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index: 456)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    memory = TorchMemory()
    assert (memory.allocated("cuda:1"), memory.reserved("cuda:1"), memory.devices()) == (None, None, [])
    assert asked == []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert (memory.allocated("cuda:1"), memory.reserved("cuda:1"), memory.devices()) == (123, 456, ["cuda:0", "cuda:1"])
    assert asked == [1]
    assert memory.allocated("cpu") is None


def test_labels_fold_a_tracebacks_locals_and_ipythons_own_references(shell: Any) -> None:
    run(shell, "def f(x):\n    y = x[:1]\n    raise ValueError\n")
    run(shell, "t = torch.zeros(100)")
    fails(shell, "f(t)")
    n = run(shell, "torch.ones(3)").execution_count
    report = shell_holders(shell)
    labels = [g.label for g in report.device("cpu").groups]
    assert "t + the last error's frames: f() › y and 1 more" in labels
    assert f"Out[{n}] (also _{n}, _ and 4 IPython references)" in labels


def test_a_walk_out_of_time_says_what_it_left_unattributed(shell: Any) -> None:
    run(shell, "xs = [torch.zeros(4) for _ in range(2000)]\nys = [torch.zeros(4) for _ in range(10)]")
    report = shell_holders(shell, time_limit=0.0)
    assert report.notes and "out of time" in report.notes[0] and "not walked" in report.notes[0]
    cpu = report.device("cpu")
    assert cpu.unattributed >= 2010 * 16  # the scan still found them: nothing hidden
    balanced(report)


def test_roots_sharing_one_autograd_graph_walk_it_once(shell: Any) -> None:
    run(
        shell,
        "a = torch.randn(10, requires_grad=True)\nh = a\n"
        "for _ in range(50):\n    h = h.sin()\n"
        "y1 = h * 1\ny2 = h * 2\ndel h",
    )
    y1, y2 = shell.user_ns["y1"].grad_fn, shell.user_ns["y2"].grad_fn
    one, both = Walker(torch, set()), Walker(torch, set())
    one.graphs([[y1]])
    masks = both.graphs([[y1], [y2]])
    assert both.visited - one.visited <= 3  # the second root adds its mul node and what it saves, not the chain
    del y1, y2
    chain = [k for k, m in masks.items() if m == 0b11]
    assert len(chain) == 50  # the 50 sin inputs (a and 49 intermediates) are kept by both graphs
    report = shell_holders(shell)
    shared = group(report, "autograd graph of y1", "autograd graph of y2")
    assert (shared.nbytes, shared.storages) == (49 * 40, 49)  # a itself is a variable too: its own group


def test_every_kind_of_holder_at_once_and_the_balance_against_every_live_tensor(shell: Any) -> None:
    run(
        shell,
        "from transformers import DynamicCache\n"
        "t = torch.zeros(100)\nxs = [torch.zeros(10)]\nd = {'k': torch.zeros(20)}\n"
        "model = nn.Linear(4, 4)\nopt = torch.optim.SGD(model.parameters(), momentum=0.9)\n"
        "model(torch.randn(2, 4)).sum().backward()\nopt.step()\n"
        "a = torch.randn(30, requires_grad=True)\ny = a.exp().sin()\n"
        "cache = DynamicCache()\ncache.update(torch.zeros(1, 1, 3, 8), torch.ones(1, 1, 3, 8), 0)\n"
        "def f():\n    local = torch.zeros(40)\n    raise ValueError('boom')\n",
    )
    n = run(shell, "torch.ones(50)").execution_count
    fails(shell, "f()")
    gc.collect()  # the walk and the count below see the same tensors: none freed between them
    report = nbhw.holders()
    labels = {h.label: h.kind for h in report.holders}
    assert labels["t"] == labels["xs"] == labels["d"] == labels["cache"] == "variable"
    assert (labels[f"Out[{n}]"], labels["f() › local"], labels["autograd graph of y"]) == (
        "output",
        "traceback",
        "graph",
    )
    assert (report.held_by("t"), report.held_by("xs"), report.held_by("d")) == (400, 40, 80)
    assert report.held_by("cache") == 2 * 96 and report.held_by(f"Out[{n}]") == 200
    assert report.held_by("f() › local") == 160 and report.held_by("autograd graph of y") == 120
    cpu = report.device("cpu")
    balanced(report)
    gc.collect()
    # Independently of the walker: every live Python tensor's storage, by torch's public API.
    # (issubclass of the type: isinstance would read __class__, which some lazy module objects answer with a warning)
    alive = [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor) and not o.is_sparse and not o.is_meta]
    # A tensor of a vmap level kept past its call (transformers' mask helpers run vmap) has no storage of its own:
    # what it wraps is counted.
    alive = [unwrapped(t) for t in alive]
    assert cpu.tensors == storage_bytes(t for t in alive if t.untyped_storage().device.type == "cpu")


def test_the_magic_and_the_function_read_the_same_session(shell: Any, capsys: pytest.CaptureFixture[str]) -> None:
    shell.run_line_magic("load_ext", "nbhw")
    run(shell, "t = torch.zeros(1000)")
    assert nbhw.holders().held_by("t") == 4000
    assert nbhw.holders("cpu").names() == ["cpu"]
    capsys.readouterr()
    shell.run_line_magic("hw", "holders")  # a terminal IPython prints the table
    printed = capsys.readouterr().out
    assert "nbhw holders: what keeps tensors alive" in printed and "\n  t " in printed
    shell.run_line_magic("hw", "holders --device cpu --json")
    data = json.loads(capsys.readouterr().out)
    [cpu] = data["devices"]
    assert {"holders": ["t"], "kind": "variable", "bytes": 4000, "tensors": 1} in cpu["groups"]


def test_holders_outside_ipython_reads_the_main_modules_globals(monkeypatch: pytest.MonkeyPatch) -> None:
    main = types.ModuleType("__main__")
    main.big = torch.zeros(321)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(nbhw.session, "get_ipython", lambda: None)
    assert nbhw.holders().held_by("big") == 321 * 4


def test_the_scan_finds_every_tensor_a_pass_over_the_whole_heap_finds() -> None:
    # find_all looks for tensors through their classes (gc.get_referrers); the plain pass over gc.get_objects() must
    # find no other: a leaf, a parameter, a subclass instance, and a tensor only an autograd graph still keeps.
    class Marked(torch.Tensor):
        pass

    leaf = torch.ones(3, requires_grad=True)
    middle = leaf * 2
    out = middle.sin()  # saves middle
    del middle
    kept = [torch.nn.Parameter(torch.ones(5)), torch.ones(7).as_subclass(Marked), out]
    walker = Walker(torch, set())
    reader = Walker(torch, set())
    every = [o for o in gc.get_objects() if type(o) in walker.tensor_types]
    expected = {k for t in every for k in reader.storage_keys(t)}
    assert out.grad_fn._saved_self.untyped_storage().nbytes() == 12  # the graph's tensor is alive
    assert walker.find_all() == expected
    assert len(kept) == 3
