"""cache_implementation in the plan and the solver: transformers' own caches dry-run on meta, against real ones."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from IPython.core.error import UsageError

import nbhw
from nbhw.__main__ import main
from nbhw.core.errors import UserError
from nbhw.core.hf.meta_build import quiet
from nbhw.core.hf.tiny_model import tiny_model_path
from tests import families
from tests.realrun import real_generate
from tests.test_run import (
    config_only,
    one_thread,  # noqa: F401  (autouse: this module's tests on one torch thread)
    saved,
)

BATCH, CONTEXT = 2, 257  # a 256-token prompt: quanto groups the cached keys by 64 (its q_group_size)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    return saved(families.llama(), tmp_path_factory.mktemp("cache") / "llama")


def _real(folder: str, generation: dict[str, Any]) -> Any:
    with quiet():
        model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
        return real_generate(model, batch=BATCH, prompt=CONTEXT - 1, new_tokens=2, generation=generation)


def test_a_quantized_cache_is_planned_at_the_real_quanto_caches_bytes(llama: str) -> None:
    pytest.importorskip("optimum.quanto")
    plan = nbhw.plan(llama, device_map="cpu", context=CONTEXT, batch=BATCH, cache_implementation="quantized")
    dynamic = nbhw.plan(llama, device_map="cpu", context=CONTEXT, batch=BATCH)
    truth = _real(llama, {"cache_implementation": "quantized"})
    assert plan.run is not None and dynamic.run is not None, plan.dry_run.problem
    assert truth.cache_class == plan.run.cache_class == "QuantizedCache"
    # after the decode step: the prompt's keys / values packed to 4 bits with quanto's scales and shifts, and the
    # one new token in full precision (the residual)
    assert plan.run.cache_decode_bytes == truth.cache_bytes
    assert plan.run.layer_classes == {"QuantoQuantizedLayer": 2}
    assert plan.run.cache_decode_bytes < dynamic.run.cache_decode_bytes / 3
    assert 'cache_implementation="quantized"' in plan.code.split("model.generate(")[1]


def test_a_quantized_cache_that_quanto_refuses_is_the_plans_reason(llama: str) -> None:
    pytest.importorskip("optimum.quanto")
    odd = 300  # a 299-token prompt does not split into quanto's groups of 64
    plan = nbhw.plan(llama, device_map="cpu", context=odd, batch=BATCH, cache_implementation="quantized")
    assert plan.run is None and "Group size (64) must be a divisor" in str(plan.dry_run.problem)
    assert "the run is not covered: the prefill forward failed" in plan.placement.verdict  # type: ignore[union-attr]
    with quiet():
        model = transformers.AutoModelForCausalLM.from_pretrained(llama).eval()
        with pytest.raises(ValueError, match="Group size"):
            real_generate(
                model, batch=BATCH, prompt=odd - 1, new_tokens=2, generation={"cache_implementation": "quantized"}
            )


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a CPU-only torch says")
def test_an_offloaded_cache_on_the_cpu_fails_as_transformers_fails(llama: str) -> None:
    plan = nbhw.plan(llama, device_map="cpu", context=CONTEXT, cache_implementation="offloaded")
    assert plan.run is None
    assert "the offloaded cache fails on cpu" in str(plan.dry_run.problem)
    assert "Torch not compiled with CUDA enabled" in str(plan.dry_run.problem)
    with quiet():
        model = transformers.AutoModelForCausalLM.from_pretrained(llama).eval()
        with pytest.raises(AssertionError, match="Torch not compiled with CUDA enabled"):
            model.generate(torch.zeros(1, 8, dtype=torch.long), max_new_tokens=2, cache_implementation="offloaded")


def test_an_offloaded_cache_keeps_one_layer_on_the_device_and_the_rest_in_host_memory(llama: str) -> None:
    memory = {0: "1GiB", "cpu": "1GiB"}
    plan = nbhw.plan(llama, device_map=0, max_memory=memory, context=CONTEXT, batch=BATCH,
                     cache_implementation="offloaded")  # fmt: skip
    dynamic = nbhw.plan(llama, device_map=0, max_memory=memory, context=CONTEXT, batch=BATCH)
    truth = _real(llama, {})  # the same layers, all on the one device: their bytes, layer by layer
    assert plan.run is not None and dynamic.run is not None, plan.dry_run.problem
    layers = truth.layer_bytes
    devices = plan.run.devices
    # transformers' own update(): each layer goes to the host after its update, and the next one is prefetched;
    # after the last layer the prefetch circles back to layer 0, so the device holds layer 0 and the host the rest
    assert devices[0].cache_decode_bytes == layers[0]
    assert devices["cpu"].cache_decode_bytes == sum(layers[1:])
    assert plan.run.cache_decode_bytes == dynamic.run.cache_decode_bytes == sum(layers)
    assert devices[0].held_cache_bytes < dynamic.run.devices[0].held_cache_bytes
    # the host copies count against the CPU's budget: a budget below them is the verdict's reason
    small = nbhw.plan(llama, device_map=0, max_memory={0: "1GiB", "cpu": 1000}, context=CONTEXT, batch=BATCH,
                      cache_implementation="offloaded")  # fmt: skip
    assert not small.run_fits and "more on cpu" in small.placement.verdict  # type: ignore[union-attr]


def test_planning_an_offloaded_cache_asks_torch_for_no_stream(llama: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # transformers makes the prefetch stream with torch.Stream() in Cache.__init__: on a GPU machine that creates a
    # CUDA context. Faked at that boundary: any real stream asked for fails the plan.
    asked: list[str] = []

    def no_stream(*args: Any, **kwargs: Any) -> Any:
        asked.append("stream")
        raise RuntimeError("a real stream was asked for (a CUDA context on a GPU machine)")

    monkeypatch.setattr(torch, "Stream", no_stream)
    monkeypatch.setattr(torch.cuda, "Stream", no_stream)
    plan = nbhw.plan(llama, device_map=0, max_memory={0: "1GiB", "cpu": "1GiB"}, context=CONTEXT + 64, batch=BATCH,
                     cache_implementation="offloaded")  # fmt: skip
    assert plan.run is not None, plan.dry_run.problem
    assert asked == []
    devices = plan.run.devices
    # transformers' own update() still ran: layer 0 back on the device, the rest in host memory
    assert devices[0].cache_decode_bytes > 0 and devices["cpu"].cache_decode_bytes > 0
    assert plan.run.cache_decode_bytes == devices[0].cache_decode_bytes + devices["cpu"].cache_decode_bytes


def test_the_solver_offloads_the_cache_when_the_device_cant_hold_it(tmp_path: Path) -> None:
    # twelve layers whose cache outweighs the activations (a cuda target: SDPA keeps no score matrix)
    config = transformers.LlamaConfig(**{**families.COMMON, "num_hidden_layers": 12, "num_key_value_heads": 4},
                                      head_dim=16)  # fmt: skip
    folder = config_only(config, tmp_path, "LlamaForCausalLM")
    sizes = {"context": 1024, "batch": 4, "reserve": 0}
    dynamic = nbhw.plan(folder, device_map=0, max_memory={0: 2**30, "cpu": 2**30}, **sizes)
    device = dynamic.run.devices[0]  # type: ignore[union-attr]
    memory: dict[int | str, int] = {0: device.peak_bytes - device.held_cache_bytes // 2, "cpu": 2**30}
    pinned = {"dtype": "auto", "attn_implementation": "sdpa", "use_kernels": False, "device_map": 0}
    result = nbhw.fit(folder, max_memory=memory, accelerators_only=True, **sizes, **pinned)
    assert result.option is not None and result.option.cache_implementation == "offloaded", result.text()
    first = result.rejected[0]
    assert first.option.cache_implementation is None and "not 1,024 tokens" in first.reason
    assert first.reason == first.plan.placement.verdict  # type: ignore[union-attr]
    assert 'cache_implementation="offloaded"' in str(result.code)
    host = result.plan.run.devices["cpu"]  # type: ignore[union-attr]
    assert host.held_cache_bytes > device.held_cache_bytes // 2  # most layers wait in host memory


def test_the_emitted_cell_generates_with_the_cache_it_names() -> None:
    pytest.importorskip("optimum.quanto")
    model = str(tiny_model_path())
    code = nbhw.plan(model, device_map="cpu", cache_implementation="quantized").code
    call = re.search(r"outputs = model\.generate\((.*)\)", code)
    assert call is not None and call.group(1) == '**inputs, max_new_tokens=20, cache_implementation="quantized"'
    namespace: dict[str, Any] = {}
    with contextlib.redirect_stdout(io.StringIO()) as out, quiet():
        exec(compile(code, "<nbhw cell>", "exec"), namespace)
    assert namespace["outputs"].shape[1] > namespace["inputs"]["input_ids"].shape[1] and out.getvalue().strip()
    if not torch.cuda.is_available():  # the cell's keyword reaches generate(): offloaded fails on the CPU as planned
        offloaded = nbhw.plan(model, device_map="cpu", cache_implementation="offloaded")
        assert "Torch not compiled with CUDA enabled" in str(offloaded.dry_run.problem)
        with pytest.raises(AssertionError, match="Torch not compiled with CUDA enabled"), quiet():
            exec(compile(offloaded.code, "<nbhw cell>", "exec"), {})


# ---------------------------------------------------------------- bad input

VALID = "valid: dynamic, offloaded, quantized, static, offloaded_static"


def test_an_unknown_cache_implementation_is_one_line_naming_the_valid_ones(
    ip: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(UserError) as err:
        nbhw.plan(cache_implementation="fast")
    assert str(err.value) == f"unknown cache_implementation 'fast'; {VALID}"
    ip.run_line_magic("load_ext", "nbhw")
    with pytest.raises(UsageError) as usage:
        ip.run_line_magic("hw", "load --cache-implementation fast")
    assert "\n" not in str(usage.value) and VALID in str(usage.value)
    assert main(["load", "--cache-implementation", "fast"]) == 2
    err_lines = capsys.readouterr().err.splitlines()
    assert len(err_lines) == 1 and VALID in err_lines[0]
