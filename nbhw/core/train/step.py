"""Training plans: one real training step of the model transformers builds, run on the meta device and measured.

The step is the one ``Trainer`` runs (forward with labels, backward, ``clip_grad_norm_``, ``optimizer.step()``,
``zero_grad``), on the model ``from_config`` builds, with peft's own ``get_peft_model`` for LoRA and transformers'
own bitsandbytes quantizer for the 4-bit base of QLoRA, and the optimizer ``Trainer.create_optimizer`` makes for the
``optim`` name. Memory is measured by torch's allocator-level ``MemTracker`` on meta tensors, never by a formula.

Where the meta device cannot answer as the target device would, the dry run answers the target's way and says so:
- SDPA: on meta it always decomposes to the math path (a batch x heads x T x T matrix saved for backward); CPU and
  CUDA run a fused kernel that saves only the output and a log-sum-exp. The run planner's routing
  (:func:`nbhw.core.hf.dryrun.attention_as_on`) sizes each call as the target's kernel, and checkpointing's recompute
  in backward (which runs outside torch-function modes) enters it again through checkpoint's ``context_fn``.
- The model is the run planner's meta build (:func:`nbhw.core.plan.run_parts.build`: ``from_config`` plus the
  dtype plan ``from_pretrained`` applies), then what the cell does to it: the 4-bit quantizer, peft, checkpointing.
- Masks: with ``use_cache=False`` (what Trainer sets) transformers asks whether the rows hold packed sequences
  (a ``.item()``); the dry run's rows are one sequence each, so it answers "no", as the real data does.

Here: the step measured (:func:`measure_step`, :func:`dry_run`). Beside it, by the same seams: the training cell's
own steps (:mod:`nbhw.core.train.training_build`), the meta device's answers given the target's way
(:mod:`nbhw.core.train.meta_patches`), sharded worlds (:mod:`nbhw.core.train.sharded`) and the full depth from a
few layers (:mod:`nbhw.core.train.step_depth`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from nbhw.core.cache import Recent
from nbhw.core.hf.depth import decoder_layers, layer_signature
from nbhw.core.hf.tensor_parallel import fake_world, local_nbytes
from nbhw.core.train.arguments import TrainArgs
from nbhw.core.train.meta_patches import (
    meta_step_context,
    quiet_tracking,
    sharded_step_context,
    snapshot,
    tracker_class,
)
from nbhw.core.train.sharded import Preparation, fsdp2_model, global_shapes_uncounted, shardwise_step, tp_model
from nbhw.core.train.step_depth import Timeline, synthesize_peak, uniform_depth, with_depth
from nbhw.core.train.training_build import (
    attention_target,
    build_for_training,
    clip_gradients,
    create_optimizer,
    quant_state_tensors,
    training_batch,
    training_defaults,
)


@dataclass
class StepMemory:
    """What one training step holds on one device, bytes, as the allocator-level tracker saw it."""

    weights: int  # parameters + buffers (+ 4-bit quant state) before the step
    trainable_parameters: int  # count
    parameters: int  # count (packed 4-bit weights counted as their unpacked element count)
    trainable_bytes: int
    gradients: int  # gradients held at the end of backward
    optimizer_states: int  # optimizer state kept between steps
    forward_backward_peak: int  # step 1, before the optimizer has state
    optimizer_step_peak: int
    peak: int  # the steady-state peak (step 2 onwards)
    activations: int  # the forward/backward peak less weights and gradients held then
    peak_phase: str
    breakdown: dict[str, int] = field(default_factory=dict)  # the tracker's categories at the peak
    notes: list[str] = field(default_factory=list)
    # Step 1 as Trainer.train() runs it: what it prepares before the first forward (FSDP2: accelerate shards the
    # whole model), then the step without optimizer state. ``whole_model``: the model before sharding (bytes).
    first_step_peak: int = 0
    largest_block: int = 0  # the largest block the step made: what the allocator's margin is sized by
    preparation_peak: int = 0
    whole_model: int = 0
    # The trainable parameters backward gave a gradient ("name|stride", layer index as *).
    with_gradient: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _unpacked_numel(p: Any) -> int:
    state = getattr(p, "quant_state", None)
    return int(math.prod(state.shape)) if state is not None else int(p.numel())


def measure_step(
    model: Any,
    optimizer: Any,
    batch: dict[str, Any],
    args: TrainArgs,
    *,
    device: Any,
    extra: list[Any] | None = None,
    timeline: Any = None,
) -> StepMemory:
    """Run one training step under the tracker and split its memory the way a person asks about it (``optimizer``
    None: forward and backward only, the optimizer's figures 0)."""
    import torch  # lazy: import nbhw stays free of torch

    device = torch.device(device)
    tracker = tracker_class()()
    tracker.timeline = timeline
    tracker.track_external(model, *([optimizer] if optimizer is not None else []), *(extra or []))
    tracker.largest = 0  # the weights were made at load
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    with tracker:
        start = snapshot(tracker, "current", device)
        for _ in range(args.gradient_accumulation_steps):
            tracker.reset_mod_stats()  # MemTracker refuses a second forward of a module it has stats for
            loss = model(**batch).loss
            (loss / args.gradient_accumulation_steps).backward()
            del loss
        fb_peak = snapshot(tracker, "peak", device)
    gradients = sum(local_nbytes(p.grad) for p in trainable if p.grad is not None)
    with_gradient = sorted(
        {
            f"{_wildcard(n)}|{','.join(map(str, _local(p.grad).stride()))}"
            for n, p in model.named_parameters()
            if p.grad is not None
        }
    )
    end, peak, largest = (
        ({}, {}, 0) if optimizer is None else optimizer_phase(model, optimizer, device=device, extra=extra)
    )
    weights = start.get("Total", 0)
    states = end.get("Optstate", 0)
    fb_total = fb_peak.get("Total", 0)
    step_total = peak.get("Total", 0)
    # Step 2 onwards holds the optimizer state through forward and backward; nothing else differs from step 1,
    # so its forward/backward peak is step 1's plus that state (the tests compare this to a real second step).
    steady_fb = fb_total + states
    phase = "forward/backward" if steady_fb >= step_total else "optimizer step"
    return StepMemory(
        weights=weights,
        trainable_parameters=sum(p.numel() for p in trainable),
        parameters=sum(_unpacked_numel(p) for p in params),
        trainable_bytes=sum(local_nbytes(p) for p in trainable),
        gradients=gradients,
        optimizer_states=states,
        forward_backward_peak=fb_total,
        optimizer_step_peak=step_total,
        peak=max(steady_fb, step_total),
        activations=fb_total
        - fb_peak.get("Parameter", 0)
        - fb_peak.get("Buffer", 0)
        - fb_peak.get("Gradient", 0)
        - fb_peak.get("Other", 0),
        peak_phase=phase,
        breakdown=fb_peak if phase == "forward/backward" else peak,
        with_gradient=with_gradient,
        first_step_peak=max(fb_total, step_total),
        largest_block=max(tracker.largest, largest),
    )


def optimizer_phase(
    model: Any, optimizer: Any, *, device: Any, extra: list[Any] | None = None
) -> tuple[dict[str, int], dict[str, int], int]:
    """Trainer's clip, optimizer.step() and zero_grad under their own tracker (MemTracker's peak only grows):
    what is held after, this phase's peak and the largest block it made (optimizer states on the first step)."""
    import torch  # lazy: import nbhw stays free of torch

    device = torch.device(device)
    tracker = tracker_class()()
    tracker.track_external(model, optimizer, *(extra or []))
    tracker.largest = 0
    max_norm = training_defaults().max_grad_norm
    # FSDP2's step on each rank's local shards (the same ops and bytes, without DTensor's dispatch); kept until
    # the snapshots, with the state it made.
    step = shardwise_step(optimizer) or optimizer.step
    with tracker:
        if max_norm:
            clip_gradients(model, max_norm)
        step()
        optimizer.zero_grad(set_to_none=True)
        end = snapshot(tracker, "current", device)
        peak = snapshot(tracker, "peak", device)
    return end, peak, tracker.largest


class Setup:
    """Where the step runs: one device (meta tensors), or rank 0 of a fake world of ``world_size`` ranks under
    transformers' TP plan (meta tensors) or accelerate's FSDP2 (fake CPU tensors: FSDP2 refuses meta parameters
    for training)."""

    def __init__(self, strategy: str = "single", world_size: int = 1) -> None:
        self.strategy, self.world_size = strategy, world_size
        self.device = "cpu" if strategy == "fsdp2" else "meta"
        self._fake: Any = None
        self._mesh: Any = None

    @contextlib.contextmanager
    def world(self) -> Iterator[None]:
        if self.strategy not in ("tp", "fsdp2"):
            yield
            return
        with fake_world(self.world_size), global_shapes_uncounted():
            if self.strategy == "fsdp2":
                from torch._subclasses.fake_tensor import FakeTensorMode  # lazy: import nbhw stays free of torch
                from torch.distributed.device_mesh import init_device_mesh  # lazy: import nbhw stays free of torch

                # The mesh is made before fake mode: DeviceMesh reads its rank tensor's values.
                self._mesh = init_device_mesh("cpu", (self.world_size,), mesh_dim_names=("dp_shard",))
                self._fake = FakeTensorMode(allow_non_fake_inputs=True)
            yield

    def tensors(self) -> Any:
        return self._fake if self._fake is not None else contextlib.nullcontext()

    def step_context(self, args: TrainArgs) -> Any:
        return sharded_step_context() if self.strategy == "fsdp2" else meta_step_context(attention_target(args))

    def build(self, config: Any, args: TrainArgs) -> Any:
        with quiet_tracking():  # peft's get_peft_model reads a property transformers 5.25 deprecates
            if self.strategy == "tp":
                return tp_model(config, args, self.world_size)
            model = build_for_training(config, args)
            if self.strategy == "fsdp2":
                model = fsdp2_model(model, self._mesh, self._fake)
            return model

    def batch(self, args: TrainArgs, vocab_size: int, rows: int | None) -> dict[str, Any]:
        import torch  # lazy: import nbhw stays free of torch

        if self.device == "meta":
            return training_batch(args, vocab_size, device="meta", batch=rows)
        with self.tensors():
            ids = torch.empty(rows or args.batch, args.context, dtype=torch.long, device=self.device)
        return {"input_ids": ids, "labels": ids}


def dry_run(
    config: Any,
    args: TrainArgs,
    *,
    batch: int | None = None,
    depth: str = "auto",
    recorded_layers: int = 5,
    setup: Setup | None = None,
) -> StepMemory:
    """The training step without weights or a GPU: what it holds on one device (or on one rank of ``setup``).

    ``depth="auto"`` runs forward and backward with ``recorded_layers`` decoder layers and repeats the middle
    layers' recorded period up to the model's depth when every layer does the same work (checked: layer_types,
    each layer's modules and parameters, two recorded periods repeating byte for byte); the optimizer step and the
    weights always come from the model at full depth. ``depth="full"`` runs every layer.
    """
    setup = setup or Setup()
    layers = int(config.get_text_config().num_hidden_layers)
    if setup.strategy == "fsdp2":
        recorded_layers = max(recorded_layers, 7)
    with setup.world():
        if depth == "full" or layers < recorded_layers + 2 or uniform_depth(config) is not None:
            return _full_depth(config, args, setup, batch)
        return _deep(config, args, setup, batch, recorded_layers)


def _step(
    model: Any, args: TrainArgs, setup: Setup, data: dict[str, Any], timeline: Timeline | None = None
) -> StepMemory:
    """The step on ``model``; with a ``timeline`` (a few layers recorded), forward and backward only: the optimizer
    step is measured on the model at full depth."""
    optimizer = create_optimizer(model, args, args.device_type) if timeline is None else None
    extra = [*quant_state_tensors(model), data["input_ids"]]
    with setup.tensors(), setup.step_context(args):
        found = measure_step(model, optimizer, data, args, device=setup.device, extra=extra, timeline=timeline)
    return with_preparation(found, getattr(model, "_nbhw_preparation", None))


def with_preparation(found: StepMemory, prepared: Preparation | None) -> StepMemory:
    """The first step's peak with what Trainer prepared before it (FSDP2's sharding), said in the notes."""
    if prepared is None:
        return found
    found.whole_model, found.preparation_peak = prepared.whole_model, prepared.peak
    found.first_step_peak = max(found.first_step_peak, prepared.peak)
    return found


def _full_depth(config: Any, args: TrainArgs, setup: Setup, batch: int | None) -> StepMemory:
    model = setup.build(config, args)
    result = _step(model, args, setup, setup.batch(args, config.vocab_size, batch))
    result.notes += meta_notes(args)
    return result


def _deep(config: Any, args: TrainArgs, setup: Setup, batch: int | None, recorded: int) -> StepMemory:
    layers = int(config.get_text_config().num_hidden_layers)
    small = setup.build(with_depth(config, recorded), args)
    data = setup.batch(args, config.vocab_size, batch)
    timeline = Timeline(decoder_layers(small))
    shallow = _step(small, args, setup, data, timeline)
    try:
        fb_peak, grads_at_peak = synthesize_peak(timeline, layers)
    except ValueError:
        return _full_depth(config, args, setup, batch)  # the layers do not repeat: run every one
    whole = at_full_depth(config, args, setup, shallow.with_gradient)
    if whole is None:
        return _full_depth(config, args, setup, batch)
    with setup.tensors():
        rows = _weights(None, [data["input_ids"]], setup.device)  # the batch's ids, held through the step
    weights = whole.weights + rows
    fb_peak += weights - shallow.weights  # the extra layers' weights are held from the start
    steady = fb_peak + whole.optimizer_states
    step_total = whole.optimizer_step_peak + rows
    result = StepMemory(
        weights=weights,
        trainable_parameters=whole.trainable_parameters,
        parameters=whole.parameters,
        trainable_bytes=whole.trainable_bytes,
        gradients=whole.gradients,
        optimizer_states=whole.optimizer_states,
        forward_backward_peak=fb_peak,
        optimizer_step_peak=step_total,
        peak=max(steady, step_total),
        activations=fb_peak - weights - grads_at_peak,
        peak_phase="forward/backward" if steady >= step_total else "optimizer step",
        breakdown={"Total": max(steady, step_total)},
        with_gradient=shallow.with_gradient,
        first_step_peak=max(fb_peak, step_total),
        largest_block=max(shallow.largest_block, whole.largest_block),
    )
    result = with_preparation(result, whole.preparation)
    result.notes += [
        *meta_notes(args),
        f"forward/backward recorded with {recorded} of the {layers} decoder layers and the middle layers' period "
        "repeated (every layer has the same modules and parameters); weights and the optimizer step at full depth",
    ]
    return result


@dataclass(frozen=True)
class FullDepth:
    """What a deep model's step holds at its full depth whatever its rows: the weights, the gradients backward
    leaves and the optimizer step (the rows' ids not counted), and what FSDP2's preparation held."""

    weights: int
    trainable_parameters: int
    parameters: int
    trainable_bytes: int
    gradients: int
    optimizer_states: int
    optimizer_step_peak: int
    largest_block: int
    preparation: Preparation | None  # what FSDP2's sharding held before the first step


_FULL_DEPTH: Recent[FullDepth | None] = Recent(16)
# What the model at full depth, its gradients and its optimizer step do not depend on: the rows, and how forward
# and backward run over them (checkpointing, accumulation).
ROW_WORDS = ("batch", "context", "gradient_checkpointing", "gradient_accumulation_steps")


def at_full_depth(config: Any, args: TrainArgs, setup: Setup, with_gradient: list[str]) -> FullDepth | None:
    """The model at full depth with the gradients backward gave (their layout from the recorded layers) and its
    optimizer step; None when its decoder layers differ. Once per config, arguments other than the rows, sharding
    and gradients in this process: a search over context or batch builds the deep model once."""
    rowless = tuple((f.name, getattr(args, f.name)) for f in dataclasses.fields(args) if f.name not in ROW_WORDS)
    key = (config.to_json_string(use_diff=False), rowless, setup.strategy, setup.world_size, tuple(with_gradient))
    return _FULL_DEPTH.get(key, lambda: _measure_full_depth(config, args, setup, with_gradient))


def forget_full_depths() -> None:
    _FULL_DEPTH.clear()


def _measure_full_depth(config: Any, args: TrainArgs, setup: Setup, with_gradient: list[str]) -> FullDepth | None:
    model = setup.build(config, args)
    if len({layer_signature(layer) for layer in decoder_layers(model)}) != 1:
        return None
    extra = quant_state_tensors(model)
    optimizer = create_optimizer(model, args, args.device_type)
    with setup.tensors():
        weights = _weights(model, extra, setup.device)
        trainable = [p for p in model.parameters() if p.requires_grad]
        got = dict(entry.split("|") for entry in with_gradient)
        for name, p in model.named_parameters():
            if p.requires_grad and _wildcard(name) in got:
                # What backward leaves on the same parameters, with the layout it gave them (a transposed
                # gradient makes the optimizer copy it).
                p.grad = _empty_like_with_stride(p, tuple(int(x) for x in got[_wildcard(name)].split(",")))
        gradients = sum(local_nbytes(p.grad) for p in trainable if p.grad is not None)
        end, peak, largest = optimizer_phase(model, optimizer, device=setup.device, extra=extra)
    return FullDepth(
        weights=weights,
        trainable_parameters=sum(p.numel() for p in trainable),
        parameters=sum(_unpacked_numel(p) for p in model.parameters()),
        trainable_bytes=sum(local_nbytes(p) for p in trainable),
        gradients=gradients,
        optimizer_states=end.get("Optstate", 0),
        optimizer_step_peak=peak.get("Total", 0),
        largest_block=largest,
        preparation=getattr(model, "_nbhw_preparation", None),
    )


def _local(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") else t


def _empty_like_with_stride(p: Any, stride: tuple[int, ...]) -> Any:
    import torch  # lazy: import nbhw stays free of torch

    if hasattr(p, "to_local") or tuple(_local(p).stride()) == stride:
        return torch.empty_like(p)
    return torch.empty_strided(p.shape, stride, dtype=p.dtype, device=p.device)


def _wildcard(name: str) -> str:
    import re

    return re.sub(r"\.\d+\.", ".*.", name)


def _weights(model: Any, extra: list[Any], device: str = "meta") -> int:
    tracker = tracker_class()()
    tracker.track_external(*([model] if model is not None else []), *extra)
    return snapshot(tracker, "current", device).get("Total", 0)


def meta_notes(args: TrainArgs) -> list[str]:
    """What the meta step answers the device's way (said, not silent)."""
    notes = [
        f"attention: the SDPA kernel {'torch picks on a CPU' if attention_target(args) == 'cpu' else 'CUDA would run'}"
        " (meta alone would run the math path); the kernel's internal workspace is not counted",
        "rows are one unpadded sequence each; padding adds a batch x context x context mask",
    ]
    if args.dtype != "float32":
        notes.append(
            f"weights and compute in {args.dtype}; autocast's float32 upcasts are not counted (meta "
            "tensors have no autocast)"
        )
    return notes
