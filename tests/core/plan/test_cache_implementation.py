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
from tests.support import families
from tests.support.models import config_only, saved
from tests.support.realrun import RealRun, offloading_on_cpu, real_generate

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # this module's tests on one torch thread

BATCH, CONTEXT = 2, 257  # a 256-token prompt: quanto groups the cached keys by 64 (its q_group_size)
MEMORY: dict[int | str, int | str] = {0: "1GiB", "cpu": "1GiB"}  # a CUDA placement: the offloaded cache runs there


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    return saved(families.llama(), tmp_path_factory.mktemp("cache") / "llama")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny random-weight checkpoint of a family in tests/support/families.py, saved once per module."""
    made: dict[str, str] = {}

    def folder(name: str) -> str:
        if name not in made:
            made[name] = saved(getattr(families, name)(), tmp_path_factory.mktemp("cache") / name)
        return made[name]

    return folder


def _real(folder: str, generation: dict[str, Any], new_tokens: int = 2) -> Any:
    with quiet():
        model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
        return real_generate(model, batch=BATCH, prompt=CONTEXT - 1, new_tokens=new_tokens, generation=generation)


def _real_offloaded(folder: str) -> tuple[RealRun, RealRun]:
    """transformers' own offloaded cache on the CPU (streams stood in, offloads copied): after the prefill, and
    after one decode step."""
    with offloading_on_cpu():
        runs = [_real(folder, {"cache_implementation": "offloaded"}, new_tokens=n) for n in (1, 2)]
    return runs[0], runs[1]


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


# ---------------------------------------------------------------- other families against real caches


@pytest.mark.parametrize("name", ["mistral", "gemma3", "qwen3_moe"])
def test_an_offloaded_cache_is_planned_at_the_real_offloaded_caches_bytes(tiny: Any, name: str) -> None:
    folder = tiny(name)
    plan = nbhw.plan(folder, device_map=0, max_memory=MEMORY, context=CONTEXT, batch=BATCH,
                     cache_implementation="offloaded")  # fmt: skip
    prefill, step = _real_offloaded(folder)
    assert plan.run is not None, plan.dry_run.problem
    assert step.cache_class == plan.run.cache_class == "DynamicCache"
    assert (plan.run.cache_bytes, plan.run.cache_decode_bytes) == (prefill.cache_bytes, step.cache_bytes)
    # DynamicCache offloads every layer, sliding ones too (its offload_only_non_sliding is False); the prefetch
    # circles back to layer 0, so the host holds every other layer after the prefill and after the decode step
    host = plan.run.devices["cpu"]
    assert (host.cache_bytes, host.cache_decode_bytes) == (sum(prefill.layer_bytes[1:]), sum(step.layer_bytes[1:]))


def test_an_offloaded_sliding_layer_holds_its_window_not_the_tensor_it_was_cut_from(tiny: Any) -> None:
    folder, window = tiny("mistral"), families.mistral().sliding_window
    sizes = {"context": CONTEXT, "batch": BATCH, "device_map": 0, "max_memory": MEMORY}
    offloaded = nbhw.plan(folder, cache_implementation="offloaded", **sizes)
    dynamic = nbhw.plan(folder, **sizes)
    assert offloaded.run is not None and dynamic.run is not None, offloaded.dry_run.problem
    kept = [_real(folder, {}, new_tokens=n) for n in (1, 2)]
    copied = _real_offloaded(folder)
    # A dynamic sliding layer keeps its last window - 1 tokens as a view of the concatenation it was cut from (the
    # whole prompt after the prefill, window tokens after a decode step); the offload copies the view alone.
    prompt = CONTEXT - 1
    assert [c * prompt for c in copied[0].layer_bytes] == [k * (window - 1) for k in kept[0].layer_bytes]
    assert [c * window for c in copied[1].layer_bytes] == [k * (window - 1) for k in kept[1].layer_bytes]
    assert dynamic.run.cache_bytes - offloaded.run.cache_bytes == kept[0].cache_bytes - copied[0].cache_bytes > 0
    saved_at_step = kept[1].cache_bytes - copied[1].cache_bytes  # one token's keys and values per layer
    assert dynamic.run.cache_decode_bytes - offloaded.run.cache_decode_bytes == saved_at_step > 0


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_a_quantized_cache_of_a_moe_model_is_planned_at_the_real_quanto_caches_bytes(tiny: Any, name: str) -> None:
    pytest.importorskip("optimum.quanto")
    folder = tiny(name)
    plan = nbhw.plan(folder, device_map="cpu", context=CONTEXT, batch=BATCH, cache_implementation="quantized")
    prefill, step = (_real(folder, {"cache_implementation": "quantized"}, new_tokens=n) for n in (1, 2))
    assert plan.run is not None, plan.dry_run.problem
    assert step.cache_class == plan.run.cache_class == "QuantizedCache"
    assert (plan.run.cache_bytes, plan.run.cache_decode_bytes) == (prefill.cache_bytes, step.cache_bytes)


@pytest.mark.parametrize(
    ("name", "implementation", "says"),
    [
        # StaticCache keeps sliding layers on the device (its offload_only_non_sliding is True): with every layer
        # sliding there is no layer to prefetch, and transformers' Cache.prefetch raises
        ("mistral", "offloaded_static", "True is not in list"),
        ("mistral", "quantized", "only supported for models with only full attention layers"),
        ("gemma2", "quantized", "only supported for models with only full attention layers"),
    ],
)
def test_a_cache_transformers_refuses_for_a_family_is_the_plans_reason(
    tiny: Any, name: str, implementation: str, says: str
) -> None:
    if implementation == "quantized":
        pytest.importorskip("optimum.quanto")
    folder = tiny(name)
    plan = nbhw.plan(folder, device_map=0, max_memory=MEMORY, context=CONTEXT, batch=BATCH,
                     cache_implementation=implementation)  # fmt: skip
    assert plan.run is None and says in str(plan.dry_run.problem)
    if implementation == "quantized":
        assert str(plan.dry_run.problem).startswith("transformers refuses cache_implementation='quantized'")
    else:
        assert "the offloaded cache fails for this model in the prefill forward: transformers' Cache.prefetch" in str(
            plan.dry_run.problem
        )
    with offloading_on_cpu(), pytest.raises(ValueError, match=re.escape(says)):
        _real(folder, {"cache_implementation": implementation})


def _recorded(events: list[tuple[int, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Record (layer id, what) for every offload, prefetch and update of a dynamic cache layer."""
    from transformers import cache_utils

    for cls, name in [(cache_utils.CacheLayerMixin, "offload"), (cache_utils.CacheLayerMixin, "prefetch"),
                      (cache_utils.DynamicLayer, "update")]:  # fmt: skip
        original = getattr(cls, name)

        def recording(self: Any, *args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            events.append((id(self), _name))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, recording)


@pytest.mark.parametrize("decoder_layers", [1, 3])
def test_an_encoder_decoder_offloaded_cache_that_reads_a_layer_left_on_the_host_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decoder_layers: int
) -> None:
    config = families.t5_unequal()  # three encoder layers
    config.num_decoder_layers = decoder_layers
    folder = saved(config, tmp_path / "t5", "AutoModelForSeq2SeqLM")
    plan = nbhw.plan(folder, device_map=0, max_memory=MEMORY, context=CONTEXT, batch=BATCH,
                     cache_implementation="offloaded")  # fmt: skip
    assert plan.run is None
    problem = str(plan.dry_run.problem)
    assert problem.startswith("the offloaded cache fails for this model in the decode step: ")
    assert "left in host memory" in problem and "a real generate() fails there" in problem
    # transformers for real (CPU, streams stood in): generate() makes both the self- and the cross-attention caches
    # offloaded, each with one layer per *encoder* layer; the layer read at the decode step is one no prefetch
    # brought back since its offload after the prefill
    events: list[tuple[int, str]] = []
    _recorded(events, monkeypatch)
    with quiet(), offloading_on_cpu():
        model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
        inputs = {"input_ids": torch.zeros(BATCH, 8, dtype=torch.long)}
        out = model.generate(**inputs, max_new_tokens=2, min_new_tokens=2, return_dict_in_generate=True,
                             cache_implementation="offloaded")  # fmt: skip
    parts = out.cache.self_attention_cache, out.cache.cross_attention_cache
    assert all(part.offloading and len(part.layers) == config.num_layers for part in parts)
    if decoder_layers < config.num_layers:  # the self-attention's layer 0: offloaded, then updated at the decode step
        layer = parts[0].layers[0]
        assert [what for who, what in events if who == id(layer)] == ["update", "offload", "update", "offload"]
        assert "torch.cat reads" in problem
    else:  # the cross-attention's layers after the first: offloaded once filled and never brought back, then read
        # at the decode step without an update (T5 reuses them as they are); the last one's prefetch circled to 0
        for layer in parts[1].layers[1:]:
            seen = [what for who, what in events if who == id(layer)]
            assert seen[seen.index("update") :] == ["update", "offload"]
        assert "scaled_dot_product_attention reads" in problem
    assert out.cache.is_updated[config.num_decoder_layers - 1]


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
