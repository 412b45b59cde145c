"""``nbhw.plan()``: the from_pretrained cell for a model, its dry run, memory estimate and placement.

Nothing here downloads weights or kernels, and nothing creates a CUDA context: the model is built on the meta
device through transformers' own ``__init__`` (see :mod:`nbhw.core.hf.meta_build`), free memory comes from nbhw's
probes, and the config comes from a local folder, the HF cache, or (only when online and allowed) the Hub.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbhw.core import argument
from nbhw.core.cache import Recent
from nbhw.core.errors import UserError
from nbhw.core.hardware import backends
from nbhw.core.hardware.data import BackendStatus
from nbhw.core.hardware.targets import Target, target_of
from nbhw.core.hardware.who_picks import from_pretrained_default
from nbhw.core.hf import kernel_tables, meta_build, model_config
from nbhw.core.hf.tiny_model import tiny_model_path
from nbhw.core.plan import (
    codegen,
    estimate,
    for_target,
    plan_checks,
    plan_view,
    run,
    run_figures,
    run_parts,
    run_plan,
    run_search,
    run_store,
)
from nbhw.core.plan.arguments import PLAN_ARGUMENTS, PlanArgs, plan_args
from nbhw.core.plan.estimate import Estimate
from nbhw.core.plan.outside_tensors import LoadPeak, Reserve
from nbhw.core.plan.pinned import Pin, read_pin
from nbhw.core.plan.placement import LiveMemory, Placement, live_memory, place
from nbhw.core.plan.quantized_sizes import PlanningQuantizer
from nbhw.core.plan.run_search import Fit
from nbhw.core.render import Shown

if TYPE_CHECKING:
    from transformers import PreTrainedModel

BUILD_CACHE_SIZE = 32  # the solver plans every dtype x attention of a model
_BUILDS: Recent[meta_build.MetaBuild] = Recent(BUILD_CACHE_SIZE)
WRITTEN_PLANS = 32
# The plans whose cell was written (code asked for), newest last: a cell that runs one of them is matched to its
# plan after it ran (nbhw.loaded()). Meta models are small; 32 plans are a few Load tab sessions.
_WRITTEN: Recent[LoadPlan] = Recent(WRITTEN_PLANS)
FALLBACK_AUTO_CLASS = "AutoModelForCausalLM"


def cached_build(
    config: model_config.ModelConfig, auto_name: str, dtype: str, attn: str | None
) -> meta_build.MetaBuild:
    """A meta build with the dtype plan from_pretrained applies, shared by every plan with the same config, class,
    dtype and attention (the model is read-only; its dry runs are remembered with it)."""
    hf = config.config
    key = (config.key, auto_name, dtype, attn)

    def built() -> meta_build.MetaBuild:
        found = run_parts.build(hf, dtype=dtype, auto_name=auto_name, attn_implementation=attn)
        if found.model is not None:
            run_store.remember_build(found.model, *key)  # its dry runs can be kept on disk, under this key
        return found

    return _BUILDS.get(key, built)


_PLACEMENTS: Recent[tuple[Placement, list[str]]] = Recent(256)


def clear_cache() -> None:
    """Forget the cached meta builds and weights placements."""
    _BUILDS.clear()
    _PLACEMENTS.clear()


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


class LoadPlan(Shown):
    """A from_pretrained plan: ``.code``, ``.check()``, ``.estimate``, ``.placement``; renders as a report.

    Properties are computed on first use and kept: ``.placement`` reads free memory at that moment.
    """

    def __init__(
        self,
        model: str,
        args: PlanArgs,
        *,
        offline: bool = False,
        rows: list[BackendStatus] | None = None,
        config: model_config.ModelConfig | None = None,
    ) -> None:
        self.model = model
        self.args = args
        self.offline = offline
        if rows is not None:  # a machine read already (the solver plans many options against one read)
            self.__dict__["rows"] = rows
        if config is not None:  # the config as read already (one read for the solver's many plans of a model)
            self.__dict__["config"] = config

    def __repr__(self) -> str:
        return f"LoadPlan(model={self.model!r}, {self.args})"

    # ------------------------------------------------------------ inputs

    @cached_property
    def config(self) -> model_config.ModelConfig:
        """The model's config and where it came from (local folder, HF cache, Hub config.json)."""
        with meta_build.quiet():
            return model_config.load(self.model, offline=self.offline)

    @cached_property
    def auto_class(self) -> str:
        """The Auto class for this architecture (AutoModelForCausalLM when the config is not available)."""
        if not self.config.available:
            return FALLBACK_AUTO_CLASS
        return meta_build.auto_class_name(self.config.config)

    @cached_property
    def config_dtype(self) -> str | None:
        """The dtype the config names (what dtype="auto" picks), if any."""
        if not self.config.available:
            return None
        value = getattr(self.config.config, "dtype", None)
        return None if value is None else str(value).removeprefix("torch.")

    @cached_property
    def dtype(self) -> str:
        """The dtype the weights will have: yours, else the config's, else the weights', else float32."""
        if self.args.dtype != "auto":
            return self.args.dtype
        return self.config_dtype or weights_dtype(self.model, self.config.source) or "float32"

    @cached_property
    def target(self) -> Target | None:
        """The catalog target the plan is for (hardware that is not here), or None for this machine."""
        return target_of(self.args.target)

    @cached_property
    def rows(self) -> list[BackendStatus]:
        """Every backend row as nbhw's probes see it now (no device is touched); for a catalog target, the rows
        detection would give on it: its memory is the budget (see for_target)."""
        return self.target.rows() if self.target is not None else backends.probe_all()

    @cached_property
    def checkpoint_dtype(self) -> str:
        """The dtype the checkpoint stores: the config's, else the weights' header, else float32."""
        return self.config_dtype or weights_dtype(self.model, self.config.source) or "float32"

    # ------------------------------------------------------------ the run's size

    @cached_property
    def context_limit(self) -> int | None:
        """The most tokens per sequence the model's config allows (its maximum positions); None without a config."""
        return run_search.context_limit(self.config.config) if self.config.available else None

    @cached_property
    def context(self) -> int:
        """Tokens per sequence the run is planned for (prompt + generated): yours, else 4,096 or the model's maximum
        when smaller."""
        return self.args.context or run_plan.default_context(self.context_limit)

    @property
    def batch(self) -> int:
        """Sequences generated together."""
        return self.args.batch

    @cached_property
    def run_target(self) -> str:
        """Whose attention kernels size the run: "cpu" (torch's own choice) or "cuda" (for every accelerator)."""
        return run_plan.target(self)

    @cached_property
    def default_device(self) -> str:
        """Where from_pretrained puts the model without a device_map (cpu, unless a torch default device is set)."""
        return from_pretrained_default().device

    # ------------------------------------------------------------ code

    @cached_property
    def arguments(self) -> codegen.Arguments:
        """The keyword arguments the cell passes, and why the others are left out."""
        return codegen.call_arguments(self.args, config_dtype=self.config_dtype, default_device=self.default_device)

    @cached_property
    def code(self) -> str:
        """The cell a person would write: imports, tokenizer, from_pretrained, a short generation."""
        code = codegen.cell(self.model, self.auto_class, self.arguments)
        _WRITTEN.put(code, self)  # after the cell runs, nbhw.loaded() finds the plan that wrote it
        return code

    @cached_property
    def pinned(self) -> Pin | None:
        """The pinned run this plan is checked against (``pinned=path``), read and checked."""
        return None if self.args.pinned is None else read_pin(self.args.pinned)

    # ------------------------------------------------------------ meta builds

    @cached_property
    def attn_download(self) -> bool:
        """Whether the attention asked is one a build would download (a Hub kernel): a build here can't check it."""
        return meta_build.needs_download(self.args.attn_implementation)

    @cached_property
    def attn_on_target(self) -> bool:
        # A build here can't answer for flash attention or a Hub kernel on the target: the rules do (for_target).
        return self.target is not None and for_target.device_dependent(self.args.attn_implementation)

    @cached_property
    def build(self) -> meta_build.MetaBuild | None:
        """The meta build with your dtype and attn_implementation (None without a config or if it needs a download)."""
        if not self.config.available or self.attn_download or self.attn_on_target:
            return None
        return cached_build(self.config, self.auto_class, self.dtype, self.args.attn_implementation)

    @cached_property
    def meta_model(self) -> PreTrainedModel | None:
        """A meta-device model in the plan's dtype for sizes (built with default attention if yours was refused)."""
        if self.build is not None and self.build.ok:
            return self.build.model
        if not self.config.available:
            return None
        fallback = cached_build(self.config, self.auto_class, self.dtype, None)
        return fallback.model if fallback.ok else None

    @cached_property
    def quantizer(self) -> PlanningQuantizer | None:
        """The quantizer sizes are computed with, when quantization is asked for."""
        if self.args.quantization is None:
            return None
        device = self.target.device() if self.target is not None else None
        with meta_build.quiet():
            return PlanningQuantizer(self.args.quantization, self.dtype, device, self.args.device_map)

    # ------------------------------------------------------------ estimate and placement

    @cached_property
    def weight_estimate(self) -> Estimate | None:
        """Parameters, bytes, largest layer and training, without the run (no dry run: quick); None without a config."""
        model = self.meta_model
        if model is None:
            return None
        with meta_build.quiet():
            result = estimate.estimate(model, self.dtype, quantizer=self.quantizer, quantization=self.args.quantization)
        method: Any = getattr(self.config.config, "quantization_config", None)
        if method is not None and self.args.quantization is None:
            method = method.get("quant_method") if isinstance(method, dict) else getattr(method, "quant_method", "?")
            result.notes.append(f"this checkpoint is pre-quantized ({method}): sizes are of the unquantized weights")
        if self.args.quantization is not None:
            result.notes.append(
                f"quantization={self.args.quantization}: the dry run runs the unquantized model and counts the weights "
                "at their quantized size, so a quantized matmul's transient (bitsandbytes dequantizes each weight to "
                "the compute dtype for it) is not in it"
            )
        return result

    @cached_property
    def estimate(self) -> Estimate | None:
        """The weights and the run at ``batch x context``: cache after the prefill and while decoding, fixed state,
        activations, the run's peak, the framework's reserve and the host's peak while loading (one dry run)."""
        weights = self.weight_estimate
        if weights is None:
            return None
        outcome, placement = self.dry_run, self.weight_placement
        peak = self.load_peak
        cache_at = self._cache_at
        if outcome.run is None or placement is None:
            return replace(weights, context=self.context, batch=self.batch, run_problem=outcome.problem,
                           load_peak=peak, cache_at=cache_at)  # fmt: skip
        placed = sum(s.bytes for s in placement.devices)
        held = sum(r.bytes for r in self.reserves.values())
        return weights.with_run(outcome.run, weight_bytes=placed, reserve_bytes=held, load_peak=peak, cache_at=cache_at)

    def _cache_at(self, tokens: int) -> int | None:
        """The cache of one sequence of ``tokens`` tokens (a dry run at that length on one device)."""
        model = self.meta_model
        if model is None:
            return None
        try:
            found = run.run_estimate(model, batch=1, context=max(tokens, 2), target=self.run_target,
                                     generation=run_plan.generation(self))  # fmt: skip
            return found.cache_decode_bytes
        except run_figures.DryRunError:
            return None

    @cached_property
    def live(self) -> LiveMemory:
        """The free memory device_map="auto" would fill here, read now (a target's: its catalog memory)."""
        found = live_memory(self.rows)
        if self.target is not None:
            found.source = f"the {self.target.label}'s memory (nbhw's catalog)"
        return found

    @cached_property
    def weight_placement(self) -> Placement | None:
        """The device_map transformers would compute, per device, with a weights-only verdict (no dry run)."""
        model = self.meta_model
        if model is None:
            return None
        # Attention and kernels change no module's size: plans that differ only there share one placement.
        args = self.args
        live = None if args.max_memory is not None else tuple(sorted(self.live.max_memory.items(), key=str))
        key = (self.config.key, self.auto_class, self.dtype, args.quantization, repr(args.device_map),
               repr(args.max_memory), self.default_device, live, repr(self.target))  # fmt: skip
        quantizer = self.quantizer

        def placed() -> tuple[Placement, list[str]]:
            found = place(model, args, quantizer=quantizer, default_device=self.default_device, live=self.live)
            return found, list(quantizer.errors) if quantizer is not None else []

        found, errors = _PLACEMENTS.get(key, placed)
        if quantizer is not None and not quantizer.errors:
            quantizer.errors.extend(errors)  # transformers' device_map checks, made while placing
        found = copy.deepcopy(found)  # each plan's own: the run's verdict replaces parts of it
        return for_target.unlisted_budgets(found, self.target) if self.target is not None else found

    @cached_property
    def placement(self) -> Placement | None:
        """The device_map transformers would compute; per device the weights, cache, activations and reserve of the
        run against the device's budget, and a verdict that counts the run; None without a config."""
        return run_plan.with_run(self)

    @cached_property
    def run_fits(self) -> bool | None:
        """Whether the run fits every budget, as the verdict decides "fits", without searching for the largest
        context (``placement.verdict`` does that when it does not fit); None when no dry run answers."""
        with meta_build.quiet():
            return run_plan.run_fits(self)

    @cached_property
    def run_tight(self) -> bool | None:
        """Whether a run that fits leaves some device less room than its allocator needs (the verdict says
        "tight"); None when the run doesn't fit or no dry run answers."""
        with meta_build.quiet():
            return run_plan.run_tight(self)

    @property
    def absent_devices(self) -> list[str]:
        """The problems of ``check()`` that say a device of the placement is not on this machine (a plan for
        other hardware, named by ``max_memory``, has them by design)."""
        placement = self.weight_placement if self.config.available else None
        return [] if placement is None else plan_checks.device_problems(self, placement)

    @cached_property
    def dry_run(self) -> run_plan.Outcome:
        """The dry run of generate() at the plan's batch and context on its placement, or why there is none."""
        with meta_build.quiet():
            return run_plan.dry_run(self)

    @property
    def run(self) -> run_figures.RunEstimate | None:
        """The dry run's own figures (per device in ``.devices``); None when it could not answer."""
        return self.dry_run.run

    @cached_property
    def reserves(self) -> dict[int | str, Reserve]:
        """Per device the run uses, what the framework holds outside tensors: a stated figure and its source."""
        labels = list(self.run.devices) if self.run is not None else []
        found = run_plan.reserves(self, labels)
        return {k if isinstance(k, int | str) else str(k): v for k, v in found.items()}

    @cached_property
    def context_fit(self) -> Fit | None:
        """The search behind ``max_context`` (how many dry runs, which method)."""
        with meta_build.quiet():
            return run_plan.context_fit(self)

    @cached_property
    def batch_fit(self) -> Fit | None:
        """The search behind ``max_batch``."""
        with meta_build.quiet():
            return run_plan.batch_fit(self)

    @property
    def max_context(self) -> int | None:
        """Tokens per sequence (prompt + generated) that fit at this batch on this placement, up to the model's
        maximum; 0 when not even the shortest run fits; None when the dry run can't answer."""
        fit = self.context_fit
        return None if fit is None else fit.value

    @property
    def max_batch(self) -> int | None:
        """Sequences of this context that fit together on this placement (searched up to 4,096)."""
        fit = self.batch_fit
        return None if fit is None else fit.value

    @cached_property
    def load_peak(self) -> LoadPeak | None:
        """The host's peak while from_pretrained reads the checkpoint (a dtype cast keeps a private copy)."""
        return run_plan.load_peak(self)

    # ------------------------------------------------------------ dry run

    @cached_property
    def checked(self) -> plan_checks.Checked:
        """What transformers would refuse of this plan, checked once (:mod:`nbhw.core.plan.plan_checks`)."""
        return plan_checks.checked(self)

    def check(self) -> list[str]:
        """Dry run: what transformers would refuse, one line each; [] means it accepts the plan here."""
        return list(self.checked.problems)

    @property
    def quantization_refused(self) -> bool:
        """Whether check() stopped at the quantization asked for: refused on this machine or the target, before
        any placement was made."""
        return self.checked.quantization_refused

    @cached_property
    def target_quantization(self) -> tuple[list[str], list[str]]:
        """(problems, notes) of the quantization, as if on the target (for_target's rules)."""
        return plan_checks.target_quantization(self)

    @cached_property
    def kernels_default(self) -> kernel_tables.KernelsDefault:
        """What the installed transformers does when the cell doesn't pass use_kernels (read from its source)."""
        return kernel_tables.kernels_default()

    @property
    def use_kernels(self) -> bool | None:
        """use_kernels as the load will have it: yours, else transformers' default (None: nbhw can't read it)."""
        return self.args.use_kernels if self.args.use_kernels is not None else self.kernels_default.value

    def kernel_problems(self) -> list[str]:
        """use_kernels=True's problems here (yours or the default): kernels unusable, or kernelize refusing."""
        return plan_checks.kernel_problems(self)

    # ------------------------------------------------------------ notes and views

    @property
    def notes(self) -> list[str]:
        """What a reader should know that is not a problem: defaults left out, guesses, what was not checked."""
        return plan_view.plan_notes(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data: arguments, code, problems, notes, estimate, placement."""
        return plan_view.plan_to_dict(self)

    def text(self, *, code: bool = True) -> str:
        """The plan as text for terminals (``code=False`` leaves out the cell)."""
        return plan_view.plan_text(self, code=code)

    def html(self, *, code: bool = True, run: bool = True, searches: bool = True) -> str:
        """The plan as an HTML fragment (``run=False``: the weights only, the run still to come; ``searches=False``:
        max context and max batch still to come)."""
        return plan_view.plan_html(self, code=code, run=run, searches=searches)

    def view(self, *, code: bool = True) -> plan_view.PlanView:
        """A displayable report of this plan (``code=False``: without the cell, e.g. when it was just emitted)."""
        return plan_view.PlanView(self, code=code)


def written_plans() -> list[LoadPlan]:
    """The plans whose cell nbhw wrote in this process, newest first."""
    return list(reversed(_WRITTEN.values()))


def _with_pinned(model: str | Path | None, arguments: dict[str, Any]) -> tuple[str | Path | None, dict[str, Any]]:
    """The pinned run's model and arguments, under those the call gives."""
    pin = read_pin(arguments["pinned"])
    given = {k: v for k, v in (pin.arguments or {}).items() if k != "pinned"}
    try:
        plan_args(**given)
    except UserError as exc:
        raise UserError(f"pinned file {pin.path!r}: its arguments are not valid here: {exc}") from None
    return (pin.model if model is None else model), {**given, **arguments}


def from_words(args: Any) -> LoadPlan:
    """A plan from the parsed words of ``%hw load`` / ``python -m nbhw load`` (see nbhw.commands)."""
    return plan(args.model, offline=args.offline, **argument.given(args, PLAN_ARGUMENTS))


def plan(model: str | Path | None = None, *, offline: bool = False, **arguments: Any) -> LoadPlan:
    """Plan ``from_pretrained(model, ...)`` for this machine (or for the ``max_memory`` you name).

    ``model`` is a Hub id or a local folder; None plans nbhw's tiny local model. The other keywords are the
    arguments of :class:`~nbhw.core.plan.arguments.PlanArgs` (``dtype``, ``device_map``, ``attn_implementation``,
    ...). Mistakes raise a one-line :class:`~nbhw.core.errors.UserError` naming the valid values. Same words on
    the command line: ``python -m nbhw load MODEL --device-map auto --dtype bfloat16 --max-memory 0=70GiB``.

    >>> p = nbhw.plan("Qwen/Qwen3-0.6B", dtype="bfloat16")   # doctest: +SKIP
    >>> print(p.code); p.check(); p.estimate; p.placement     # doctest: +SKIP
    """
    if arguments.get("pinned") is not None:
        model, arguments = _with_pinned(model, arguments)
    name = str(tiny_model_path() if model is None else model)
    model_config.kind(name)  # a mistyped path or id is a UserError now, not a problem later
    made = LoadPlan(name, plan_args(**arguments), offline=offline)
    if made.args.context is not None or made.args.encoder_length is not None:
        run_plan.check_sizes(made)  # against the model's maximum positions: needs its config
    return made


plan.__signature__ = argument.signature(plan, PLAN_ARGUMENTS, keep=("model", "offline"))  # type: ignore[attr-defined]
