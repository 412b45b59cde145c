"""A load plan's stages, each a frozen dataclass made once from the stages before it.

    inputs (the model's config, the checked words, the hardware, the run's size)
      → build (the model on the meta device in the plan's dtype; its weights' figures when asked: weigh)
      → placement (the device_map transformers computes for those weights against the budgets)
      → run (generate()'s dry run on that placement, the framework's reserves, the host while loading)
      → verdict (the run against every device's budget, in one line)

:class:`~nbhw.core.plan.load_plan.LoadPlan` makes each stage the first time it is asked for, so a plan goes only
as far as its reader: the cell needs the inputs, the Load tab's first figures the placement, the fit solver stops
at the first stage that refuses an option. Each maker takes the stages before it and nothing else, so each can be
made and tested alone.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbhw.core.cache import Recent
from nbhw.core.hardware import backends
from nbhw.core.hardware.data import BackendStatus
from nbhw.core.hardware.targets import Target, target_of
from nbhw.core.hardware.who_picks import from_pretrained_default
from nbhw.core.hf import meta_build, model_config
from nbhw.core.plan import estimate, for_target, run, run_figures, run_parts, run_plan, run_search, run_store
from nbhw.core.plan.arguments import PlanArgs
from nbhw.core.plan.estimate import Estimate
from nbhw.core.plan.outside_tensors import LoadPeak, Reserve
from nbhw.core.plan.placement import LiveMemory, Placement, live_memory, place
from nbhw.core.plan.quantized_sizes import PlanningQuantizer
from nbhw.core.plan.run_plan import Outcome
from nbhw.core.plan.run_search import Fit

if TYPE_CHECKING:
    from transformers import PreTrainedModel

FALLBACK_AUTO_CLASS = "AutoModelForCausalLM"
BUILD_CACHE_SIZE = 32  # the solver plans every dtype x attention of a model
_BUILDS: Recent[meta_build.MetaBuild] = Recent(BUILD_CACHE_SIZE)
_PLACEMENTS: Recent[tuple[Placement, list[str]]] = Recent(256)
_WEIGHTS: Recent[Estimate] = Recent(256)


def clear_cache() -> None:
    """Forget the cached meta builds, weights' figures and weights placements."""
    _BUILDS.clear()
    _PLACEMENTS.clear()
    _WEIGHTS.clear()


# ---------------------------------------------------------------- 1. inputs


@dataclass(frozen=True)
class Inputs:
    """What the plan is of: the model, your checked words, its config, the hardware and the run's size."""

    model: str
    args: PlanArgs
    offline: bool
    config: model_config.ModelConfig
    auto_class: str  # the Auto class for the architecture (AutoModelForCausalLM without a config)
    config_dtype: str | None  # the dtype the config names (what dtype="auto" picks)
    checkpoint_dtype: str  # what the checkpoint stores: the config's, else the weights' header, else float32
    dtype: str  # the weights' dtype after loading: yours, else the checkpoint's
    target: Target | None  # the catalog hardware planned for; None for this machine
    rows: tuple[BackendStatus, ...]  # every backend row as nbhw's probes see it (a target's: as it would be there)
    context_limit: int | None  # the most tokens the config allows; None without a config
    context: int  # tokens per sequence: yours, else 4,096 or the model's maximum when smaller
    default_device: str  # where from_pretrained puts a model without a device_map

    @property
    def batch(self) -> int:
        """Sequences generated together."""
        return self.args.batch

    @property
    def generation(self) -> dict[str, Any] | None:
        """The generate() options the dry runs pass (the cache asked for)."""
        return run_plan.generation(self.args)


def inputs(
    model: str,
    args: PlanArgs,
    *,
    offline: bool = False,
    rows: list[BackendStatus] | None = None,
    config: model_config.ModelConfig | None = None,
) -> Inputs:
    """The inputs of a plan: ``rows`` and ``config`` when read already (the solver plans many options against one
    read of the machine and the config)."""
    if config is None:
        with meta_build.quiet():
            config = model_config.load(model, offline=offline)
    named = _config_dtype(config)
    checkpoint = named or weights_dtype(model, config.source) or "float32"
    target = target_of(args.target)
    if rows is None:
        rows = target.rows() if target is not None else backends.probe_all()
    limit = run_search.context_limit(config.config) if config.available else None
    return Inputs(
        model=model,
        args=args,
        offline=offline,
        config=config,
        auto_class=meta_build.auto_class_name(config.config) if config.available else FALLBACK_AUTO_CLASS,
        config_dtype=named,
        checkpoint_dtype=checkpoint,
        dtype=args.dtype if args.dtype != "auto" else checkpoint,
        target=target,
        rows=tuple(rows),
        context_limit=limit,
        context=args.context or run_plan.default_context(limit),
        default_device=from_pretrained_default().device,
    )


def _config_dtype(config: model_config.ModelConfig) -> str | None:
    value = getattr(config.config, "dtype", None) if config.available else None
    return None if value is None else str(value).removeprefix("torch.")


def _weights_file(model: str, source: str | None) -> str | None:
    """The first weights file transformers would read for dtype="auto", if it is on this machine."""
    names = ("model.safetensors", "pytorch_model.bin")
    if source == model_config.LOCAL:
        folder = Path(model).expanduser()
        for name in names:
            if (folder / name).is_file():
                return str(folder / name)
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            import json

            shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
            return str(folder / shards[0]) if shards and (folder / shards[0]).is_file() else None
        return None
    if source == model_config.CACHE:
        from huggingface_hub import try_to_load_from_cache

        for name in names:
            found = try_to_load_from_cache(model, name)
            if isinstance(found, str):
                return found
    return None


def weights_dtype(model: str, source: str | None) -> str | None:
    """The dtype transformers reads from the weights' header when the config names none (no tensor data read)."""
    path = _weights_file(model, source)
    if path is None:
        return None
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.modeling_utils import get_state_dict_dtype, load_state_dict

    try:
        state = load_state_dict(path, map_location="meta", weights_only=True)
    except Exception:
        return None
    return str(get_state_dict_dtype(state)).removeprefix("torch.")


# ---------------------------------------------------------------- 2. build


@dataclass(frozen=True)
class Built:
    """The model on the meta device, built by transformers' own ``__init__`` in the plan's dtype."""

    build: meta_build.MetaBuild | None  # with your attention; None without a config or when a build can't tell
    model: PreTrainedModel | None  # for sizes: default attention where yours was refused; None without a config
    attn: str | None  # the attention the sizing model was built with (None: the default)
    attn_download: bool  # the attention asked is a Hub kernel a build would download
    attn_on_target: bool  # the attention asked depends on the target's device: its rules answer, not a build


def cached_build(
    config: model_config.ModelConfig, auto_name: str, dtype: str, attn: str | None
) -> meta_build.MetaBuild:
    """A meta build with the dtype plan from_pretrained applies, shared by every plan with the same config, class,
    dtype and attention (the model is read-only; its dry runs are remembered with it)."""
    key = (config.key, auto_name, dtype, attn)

    def built() -> meta_build.MetaBuild:
        found = run_parts.build(config.config, dtype=dtype, auto_name=auto_name, attn_implementation=attn)
        if found.model is not None:
            run_store.remember_build(found.model, *key)  # its dry runs can be kept on disk, under this key
        return found

    return _BUILDS.get(key, built)


def build(made: Inputs) -> Built:
    """The build stage of ``made``: the meta model (its weights' figures: :func:`weigh`)."""
    attn = made.args.attn_implementation
    download = meta_build.needs_download(attn)
    on_target = made.target is not None and for_target.device_dependent(attn)
    asked = None
    if made.config.available and not download and not on_target:
        asked = cached_build(made.config, made.auto_class, made.dtype, attn)
    used = attn if asked is not None and asked.ok else None  # the attention the sizing model was built with
    return Built(asked, _sizing_model(made, asked), used, download, on_target)


def _sizing_model(made: Inputs, asked: meta_build.MetaBuild | None) -> PreTrainedModel | None:
    if asked is not None and asked.ok:
        return asked.model
    if not made.config.available:
        return None
    fallback = cached_build(made.config, made.auto_class, made.dtype, None)
    return fallback.model if fallback.ok else None


def quantizer(made: Inputs) -> PlanningQuantizer | None:
    """The quantizer the weights are sized and placed with, when quantization is asked: one per plan, shared by
    :func:`weigh` and :func:`place_weights` (placing adds transformers' device_map checks to its errors). Made when
    a size is asked for: a method refused here needs none."""
    if made.args.quantization is None:
        return None
    device = made.target.device() if made.target is not None else None
    with meta_build.quiet():
        return PlanningQuantizer(made.args.quantization, made.dtype, device, made.args.device_map)


def weigh(made: Inputs, built: Built, quantizer: PlanningQuantizer | None) -> Estimate | None:
    """The weights' figures: parameters, bytes, largest layer, training (no dry run; None without a model). Made
    when asked (a check or a placement needs none), once per model and sizing, each plan given its own copy."""
    model = built.model
    if model is None:
        return None
    asked = made.args.quantization
    # A quantizer's sizes may depend on the device and the device_map (modules it keeps unquantized); without one,
    # the weights are the model's alone.
    device = made.target.device() if made.target is not None else None
    sizing = (asked, repr(device), repr(made.args.device_map)) if asked is not None else None
    key = (made.config.key, made.auto_class, made.dtype, built.attn, sizing)

    def sized() -> Estimate:
        with meta_build.quiet():
            return estimate.estimate(model, made.dtype, quantizer=quantizer, quantization=asked)

    kept = _WEIGHTS.get(key, sized)
    result = replace(kept, notes=list(kept.notes), training=dict(kept.training), largest_layer=list(kept.largest_layer))
    method: Any = getattr(made.config.config, "quantization_config", None)
    if method is not None and asked is None:
        method = method.get("quant_method") if isinstance(method, dict) else getattr(method, "quant_method", "?")
        result.notes.append(f"this checkpoint is pre-quantized ({method}): sizes are of the unquantized weights")
    if asked is not None:
        result.notes.append(
            f"quantization={asked}: the dry run runs the unquantized model and counts the weights at their "
            "quantized size, so a quantized matmul's transient (bitsandbytes dequantizes each weight to the "
            "compute dtype for it) is not in it"
        )
    return result


# ---------------------------------------------------------------- 3. placement


@dataclass(frozen=True)
class Placed:
    """Where transformers puts the weights: the memory it fills, its device_map and the weights-only verdict."""

    live: LiveMemory  # the free memory device_map="auto" fills here, read once (a target's: its catalog memory)
    placement: Placement | None  # the weights per device against the budgets; None without a meta model
    run_target: str  # whose attention kernels size the run: "cpu" (torch's own) or "cuda" (every accelerator)


def place_weights(made: Inputs, built: Built, quantizer: PlanningQuantizer | None) -> Placed:
    """The placement stage: the device_map transformers computes for ``built``'s weights (no dry run)."""
    live = live_memory(list(made.rows))
    if made.target is not None:
        live.source = f"the {made.target.label}'s memory (nbhw's catalog)"
    placement = _placement(made, built, quantizer, live)
    return Placed(live, placement, run_plan.run_target(placement, made, live))


def _placement(made: Inputs, built: Built, quantizer: PlanningQuantizer | None, live: LiveMemory) -> Placement | None:
    model = built.model
    if model is None:
        return None
    # Attention and kernels change no module's size: plans that differ only there share one placement.
    args = made.args
    memory = None if args.max_memory is not None else tuple(sorted(live.max_memory.items(), key=str))
    key = (made.config.key, made.auto_class, made.dtype, args.quantization, repr(args.device_map),
           repr(args.max_memory), made.default_device, memory, repr(made.target))  # fmt: skip

    def placed() -> tuple[Placement, list[str]]:
        found = place(model, args, quantizer=quantizer, default_device=made.default_device, live=live)
        return found, list(quantizer.errors) if quantizer is not None else []

    found, errors = _PLACEMENTS.get(key, placed)
    if quantizer is not None and not quantizer.errors:
        quantizer.errors.extend(errors)  # transformers' device_map checks, made while placing
    found = copy.deepcopy(found)  # each plan's own: the run's verdict replaces parts of it
    return for_target.unlisted_budgets(found, made.target) if made.target is not None else found


def run_fits(made: Inputs, placed: Placed, ran: Callable[[], Ran]) -> bool | None:
    """Whether the run fits every device's budget, as the verdict decides "fits", without its search for the longest
    context: False from the placement alone when the weights and reserve are over a budget (no dry run can fit),
    else the dry run's answer (``ran()`` made only then); None when there is nothing to run on or no run answers."""
    placement = placed.placement
    if placement is None or placement.kind in ("none", "too_big"):
        return None
    if run_plan.weights_alone_over(made, placed, placement, least_margin=False):
        return False  # a run's peak holds its weights: no dry run can fit it
    return ran().fits


# ---------------------------------------------------------------- 4. run


@dataclass(frozen=True)
class Ran:
    """generate()'s dry run on the placement, what each device holds outside tensors, and the estimate with them."""

    outcome: Outcome  # the dry run's figures, or why there are none
    reserves: dict[int | str, Reserve]  # per device the run uses: the framework's reserve and its source
    load_peak: LoadPeak | None  # the host while from_pretrained reads the checkpoint
    estimate: Estimate | None  # weights and run together; None without a config
    fits: bool | None  # the run within every device's budget; None when no dry run answers


def dry_run(made: Inputs, built: Built, weights: Estimate | None, placed: Placed) -> Ran:
    """The run stage: one dry run of generate() at ``batch x context`` on the placement (``weights``: :func:`weigh`)."""
    with meta_build.quiet():
        outcome = run_plan.dry_run(made, built, placed)
    labels = list(outcome.run.devices) if outcome.run is not None else []
    found = run_plan.reserves(made, placed, labels)
    reserves = {k if isinstance(k, int | str) else str(k): v for k, v in found.items()}
    peak = run_plan.load_peak(made, weights, placed)
    whole = _estimate(made, built, weights, placed, outcome, reserves=reserves, peak=peak)
    fits = None
    if placed.placement is not None and placed.placement.kind not in ("none", "too_big") and outcome.run is not None:
        shares = run_plan.run_shares(made, placed, placed.placement, outcome.run, reserves)
        fits = not any(s.over_bytes is not None and s.over_bytes > 0 for s in shares)
    return Ran(outcome, reserves, peak, whole, fits)


def _estimate(
    made: Inputs,
    built: Built,
    weights: Estimate | None,
    placed: Placed,
    outcome: Outcome,
    *,
    reserves: dict[int | str, Reserve],
    peak: LoadPeak | None,
) -> Estimate | None:
    if weights is None:
        return None
    cache_at = _cache_at(made, built, placed)
    if outcome.run is None or placed.placement is None:
        return replace(weights, context=made.context, batch=made.batch, run_problem=outcome.problem,
                       load_peak=peak, cache_at=cache_at)  # fmt: skip
    placed_bytes = sum(s.bytes for s in placed.placement.devices)
    held = sum(r.bytes for r in reserves.values())
    return weights.with_run(outcome.run, weight_bytes=placed_bytes, reserve_bytes=held, load_peak=peak,
                            cache_at=cache_at)  # fmt: skip


def _cache_at(made: Inputs, built: Built, placed: Placed) -> Callable[[int], int | None]:
    """The cache of one sequence of so many tokens (a dry run at that length on one device)."""

    def cache_at(tokens: int) -> int | None:
        if built.model is None:
            return None
        try:
            found = run.run_estimate(built.model, batch=1, context=max(tokens, 2), target=placed.run_target,
                                     generation=made.generation)  # fmt: skip
        except run_figures.DryRunError:
            return None
        return found.cache_decode_bytes

    return cache_at


# ---------------------------------------------------------------- 5. verdict


@dataclass(frozen=True)
class Verdict:
    """The placement with each device's run figures against its budget, and the one line that says if it fits."""

    placement: Placement | None  # None without a config
    text: str  # the verdict's words ("fits on one device (cuda:0)", "fits up to 12,288 tokens, not 32,768", ...)
    kind: str | None  # fits, tight, fits_shorter, does_not_fit, not_covered; None for a weights-only verdict

    @property
    def tight(self) -> bool:
        """The run fits by its tensors, but some device has less room left than its allocator needs."""
        return self.kind == "tight"


def verdict(made: Inputs, placed: Placed, ran: Ran, context_fit: Callable[[], Fit | None]) -> Verdict:
    """The verdict stage; ``context_fit`` is asked only when the run doesn't fit (the verdict names the longest
    context that does)."""
    placement = run_plan.with_run(made, placed, ran.outcome, ran.reserves, context_fit)
    if placement is None:
        return Verdict(None, "", None)
    return Verdict(placement, placement.verdict, placement.run_kind)
