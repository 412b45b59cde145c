"""A deep model's dry run records a few decoder layers and widens them to the model's depth (nbhw.core.plan.run_depth):
every figure of the estimate equals the same dry run made with every layer, on one device and split over two."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nbhw.core.hf.depth import decoder_stack
from nbhw.core.plan import run, run_depth, run_parts
from tests.support import families

LAYERS = 12


def deep(make: Any, **fields: Any) -> Any:
    config = make()
    config.num_hidden_layers = LAYERS
    for name, value in fields.items():
        setattr(config, name, value)
    return run_parts.build(config, dtype="float32", auto_name="AutoModelForCausalLM", attn_implementation=None).model


def two_devices(model: Any, first: int) -> dict[str, Any]:
    """Layers below ``first`` on device 0, the rest (and the norm and head) on device 1, as accelerate writes it."""
    found = {"model.embed_tokens": 0, "model.rotary_emb": 0}
    found |= {f"model.layers.{i}": 0 if i < first else 1 for i in range(LAYERS)}
    return found | {"model.norm": 1, "lm_head": 1}


def both(model: Any, context: int, device_map: dict[str, Any] | None = None) -> tuple[Any, Any, Any]:
    sizes = run.sizes(2, context, target="cpu", device_map=device_map)
    widened = run._DryRun(model, sizes)
    return widened, widened.run(), run._DryRun(model, sizes, widen=False).run()


def figures(found: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(found.estimate).items() if k != "seconds"}


@pytest.mark.parametrize("context", [100, 300])
def test_llama_widened_equals_every_layer(context: int) -> None:
    model = deep(families.llama)
    dry, widened, full = both(model, context)
    assert dry.shallow is not None and len(decoder_stack(dry.model)[1]) == run_depth.RECORDED
    assert figures(widened) == figures(full)
    assert widened.timeline == full.timeline  # op for op, every device's total
    assert widened.estimate.kernels == {"cpu_flash": 2 * LAYERS}


def test_split_over_two_devices_records_each_stretch() -> None:
    model = deep(families.llama)
    dry, widened, full = both(model, 300, two_devices(model, 8))
    assert dry.shallow is not None
    assert [(s.layers, s.device) for s in dry.shallow.stretches] == [(8, 0), (4, 1)]
    assert figures(widened) == figures(full) and widened.timeline == full.timeline
    assert set(widened.estimate.devices) == {0, 1}


def test_sliding_window_cache_layers_made_before_the_prefill() -> None:
    # Each sliding layer holds a scalar from the moment the cache is made: the widened run counts the missing ones.
    model = deep(families.mistral)
    dry, widened, full = both(model, 300, two_devices(model, 9))
    assert dry.shallow is not None
    assert figures(widened) == figures(full)
    assert max(map(sum, widened.timeline)) == max(map(sum, full.timeline))


@pytest.mark.parametrize("make", [families.llama, families.mistral], ids=["llama", "mistral"])
@pytest.mark.parametrize("first", [LAYERS, 8])  # every layer on device 0 (the head on 1), or split 8 / 4
def test_an_offloaded_cache_widened_equals_every_layer(make: Any, first: int) -> None:
    # Each layer's keys and values go to the host after its update and the next layer's come back: the recorded
    # stretch does what the full depth does, on the devices and in host memory (op for op where no layer slides:
    # a sliding layer's window scalar is made with the cache, as in test_sliding_window_cache_layers_made_...).
    model = deep(make)
    sizes = run.sizes(2, 300, target="cuda", device_map=two_devices(model, first),
                      generation={"cache_implementation": "offloaded"})  # fmt: skip
    dry = run._DryRun(model, sizes)
    widened, full = dry.run(), run._DryRun(model, sizes, widen=False).run()
    assert dry.shallow is not None
    assert figures(widened) == figures(full)
    assert max(map(sum, widened.timeline)) == max(map(sum, full.timeline))
    if make is families.llama:
        assert widened.timeline == full.timeline
    assert widened.estimate.devices["cpu"].cache_decode_bytes > 0  # the host copies are counted


def test_first_dense_layers_are_their_own_stretch() -> None:
    model = deep(families.deepseek_v3, first_k_dense_replace=3)
    dry, widened, full = both(model, 300)
    assert dry.shallow is not None
    assert [s.layers for s in dry.shallow.stretches] == [3, LAYERS - 3]
    assert figures(widened) == figures(full) and widened.timeline == full.timeline


def test_layers_that_alternate_run_every_layer() -> None:
    pattern = (["sliding_attention"] * 5 + ["full_attention"]) * 2  # Gemma-3's 5:1: no stretch long enough
    model = deep(families.gemma3, layer_types=pattern)
    dry, widened, full = both(model, 300)
    assert dry.shallow is None
    assert figures(widened) == figures(full)


def test_periods_that_do_not_repeat_are_refused() -> None:
    stretch = run_depth.Stretch(first=0, layers=8, device="cpu")
    shallow = run_depth.Shallow(model=None, device_map={}, stretches=[stretch], added_weights={}, kept_work=())
    starts = [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]
    timeline = torch.tensor([[v] for v in [1, 2, 3, 4, 5, 9, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]])
    with pytest.raises(run_depth.NotRepeating):
        run_depth.widen_timeline(timeline, starts, 10, shallow, (0,), made=(0, (0,)))
    steady = torch.arange(20).view(-1, 1)
    widened, split = run_depth.widen_timeline(steady, starts, 10, shallow, (0,), made=(0, (0,)))
    assert len(widened) == 20 + 2 * 3 * 2 and split == 10 + 3 * 2


def test_device_maps_that_differ_only_in_a_boundary_share_one_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    """A memory share or a strategy moves where a stretch of like layers ends: the few recorded layers run the same
    way on the same devices, so one recording is widened to each map, and each equals its own full-depth run."""
    model = deep(families.llama, num_hidden_layers=16)
    recorded = []
    record = run._DryRun._record
    monkeypatch.setattr(run._DryRun, "_record", lambda self: recorded.append(self.sizes) or record(self))

    def split_at(first: int) -> Any:
        layers = {f"model.layers.{i}": 0 if i < first else 1 for i in range(16)}
        device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, **layers, "model.norm": 1, "lm_head": 1}
        return run.sizes(2, 200, target="cpu", device_map=device_map)

    run.clear_results()
    at_seven, at_nine = run._DryRun(model, split_at(7)).run(), run._DryRun(model, split_at(9)).run()
    assert len(recorded) == 1
    for got, sizes in ((at_seven, split_at(7)), (at_nine, split_at(9))):
        full = run._DryRun(model, sizes, widen=False).run()
        assert figures(got) == figures(full) and got.timeline == full.timeline
    assert at_seven.estimate.devices != at_nine.estimate.devices  # the weights and cache moved with the boundary
