"""``nbhw.plan()``: the from_pretrained cell for a model, its dry run, memory estimate and placement.

Nothing here downloads weights or kernels, and nothing creates a CUDA context: the model is built on the meta
device through transformers' own ``__init__`` (see :mod:`nbhw.core.hf.meta_build`), free memory comes from nbhw's
probes, and the config comes from a local folder, the HF cache, or (only when online and allowed) the Hub.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbhw.core import argument
from nbhw.core.cache import Recent
from nbhw.core.errors import UserError
from nbhw.core.hardware.data import BackendStatus
from nbhw.core.hardware.targets import Target
from nbhw.core.hf import kernel_tables, meta_build, model_config
from nbhw.core.hf.tiny_model import tiny_model_path
from nbhw.core.plan import codegen, plan_checks, plan_view, run_figures, run_plan, stages
from nbhw.core.plan.arguments import PLAN_ARGUMENTS, PlanArgs, plan_args
from nbhw.core.plan.estimate import Estimate
from nbhw.core.plan.pinned import Pin, read_pin
from nbhw.core.plan.placement import Placement
from nbhw.core.plan.quantized_sizes import PlanningQuantizer
from nbhw.core.plan.run_search import Fit
from nbhw.core.render import Shown

if TYPE_CHECKING:
    from transformers import PreTrainedModel

WRITTEN_PLANS = 32
# The plans whose cell was written (code asked for), newest last: a cell that runs one of them is matched to its
# plan after it ran (nbhw.loaded()). Meta models are small; 32 plans are a few Load tab sessions.
_WRITTEN: Recent[LoadPlan] = Recent(WRITTEN_PLANS)


class LoadPlan(Shown):
    """A from_pretrained plan: ``.code``, ``.check()``, ``.estimate``, ``.placement``; renders as a report.

    A plan is its stages (:mod:`nbhw.core.plan.stages`), each made the first time it is asked for and kept:
    ``.inputs`` → ``.built`` → ``.placed`` → ``.ran`` → ``.verdict``. ``.placed`` reads free memory at that moment.
    The other properties name a stage's parts in the words of ``nbhw.plan()``'s documentation.
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
        self._read = (rows, config)  # the machine and the config as read already (the solver's one read of each)

    def __repr__(self) -> str:
        return f"LoadPlan(model={self.model!r}, {self.args})"

    # ------------------------------------------------------------ the stages

    @cached_property
    def inputs(self) -> stages.Inputs:
        """Stage 1: the config, your words, the hardware and the run's size."""
        rows, config = self._read
        return stages.inputs(self.model, self.args, offline=self.offline, rows=rows, config=config)

    @cached_property
    def built(self) -> stages.Built:
        """Stage 2: the meta model in the plan's dtype and its weights' figures."""
        return stages.build(self.inputs)

    @cached_property
    def quantizer(self) -> PlanningQuantizer | None:
        """The quantizer the weights are sized and placed with (quantization asked for), shared by both."""
        return stages.quantizer(self.inputs)

    @cached_property
    def weight_estimate(self) -> Estimate | None:
        """The build's weights: parameters, bytes, largest layer and training, without the run (no dry run: quick);
        None without a config."""
        return stages.weigh(self.inputs, self.built, self.quantizer)

    @cached_property
    def placed(self) -> stages.Placed:
        """Stage 3: the device_map transformers computes for the weights (free memory read now)."""
        return stages.place_weights(self.inputs, self.built, self.quantizer)

    @cached_property
    def ran(self) -> stages.Ran:
        """Stage 4: generate()'s dry run on the placement, the reserves, the host while loading."""
        return stages.dry_run(self.inputs, self.built, self.weight_estimate, self.placed)

    @cached_property
    def verdict(self) -> stages.Verdict:
        """Stage 5: the run against every device's budget."""
        return stages.verdict(self.inputs, self.placed, self.ran, lambda: self.context_fit)

    @cached_property
    def context_fit(self) -> Fit | None:
        """The search behind ``max_context`` (how many dry runs, which method)."""
        with meta_build.quiet():
            return run_plan.context_fit(self.inputs, self.built, self.placed, lambda: self.ran)

    @cached_property
    def batch_fit(self) -> Fit | None:
        """The search behind ``max_batch``."""
        with meta_build.quiet():
            return run_plan.batch_fit(self.inputs, self.built, self.placed, lambda: self.ran)

    # ------------------------------------------------------------ the stages' parts, in nbhw.plan()'s words

    @property
    def config(self) -> model_config.ModelConfig:
        """The model's config and where it came from (local folder, HF cache, Hub config.json)."""
        return self.inputs.config

    @property
    def dtype(self) -> str:
        """The dtype the weights will have: yours, else the config's, else the weights', else float32."""
        return self.inputs.dtype

    @property
    def target(self) -> Target | None:
        """The catalog target the plan is for (hardware that is not here), or None for this machine."""
        return self.inputs.target

    @property
    def rows(self) -> list[BackendStatus]:
        """Every backend row as nbhw's probes see it (a catalog target's: as detection would give them there)."""
        return list(self.inputs.rows)

    @property
    def context(self) -> int:
        """Tokens per sequence the run is planned for (prompt + generated)."""
        return self.inputs.context

    @property
    def batch(self) -> int:
        """Sequences generated together."""
        return self.args.batch

    @property
    def meta_model(self) -> PreTrainedModel | None:
        """A meta-device model in the plan's dtype for sizes (built with default attention if yours was refused)."""
        return self.built.model

    @property
    def weight_placement(self) -> Placement | None:
        """The device_map transformers would compute, per device, with a weights-only verdict (no dry run)."""
        return self.placed.placement

    @property
    def dry_run(self) -> run_plan.Outcome:
        """The dry run of generate() at the plan's batch and context on its placement, or why there is none."""
        return self.ran.outcome

    @property
    def run(self) -> run_figures.RunEstimate | None:
        """The dry run's own figures (per device in ``.devices``); None when it could not answer."""
        return self.ran.outcome.run

    @property
    def estimate(self) -> Estimate | None:
        """The weights and the run at ``batch x context``: cache after the prefill and while decoding, fixed state,
        activations, the run's peak, the framework's reserve and the host's peak while loading (one dry run)."""
        return self.ran.estimate

    @property
    def placement(self) -> Placement | None:
        """The device_map transformers would compute; per device the weights, cache, activations and reserve of the
        run against the device's budget, and a verdict that counts the run; None without a config."""
        return self.verdict.placement

    @cached_property
    def run_fits(self) -> bool | None:
        """Whether the run fits every budget, as the verdict decides "fits", without searching for the largest
        context (``placement.verdict`` does that when it does not fit); None when no dry run answers."""
        return stages.run_fits(self.inputs, self.placed, lambda: self.ran)

    @property
    def run_tight(self) -> bool | None:
        """Whether a run that fits leaves some device less room than its allocator needs (the verdict says
        "tight"); None when the run doesn't fit or no dry run answers."""
        return self.verdict.tight if self.run_fits else None

    @property
    def absent_devices(self) -> list[str]:
        """The problems of ``check()`` that say a device of the placement is not on this machine (a plan for
        other hardware, named by ``max_memory``, has them by design)."""
        placement = self.weight_placement if self.config.available else None
        return [] if placement is None else plan_checks.device_problems(self, placement)

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

    # ------------------------------------------------------------ the cell

    @cached_property
    def arguments(self) -> codegen.Arguments:
        """The keyword arguments the cell passes, and why the others are left out."""
        return codegen.call_arguments(
            self.args, config_dtype=self.inputs.config_dtype, default_device=self.inputs.default_device
        )

    @cached_property
    def code(self) -> str:
        """The cell a person would write: imports, tokenizer, from_pretrained, a short generation."""
        code = codegen.cell(self.model, self.inputs.auto_class, self.arguments)
        _WRITTEN.put(code, self)  # after the cell runs, nbhw.loaded() finds the plan that wrote it
        return code

    @cached_property
    def pinned(self) -> Pin | None:
        """The pinned run this plan is checked against (``pinned=path``), read and checked."""
        return None if self.args.pinned is None else read_pin(self.args.pinned)

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
        run_plan.check_sizes(made.inputs, lambda: made.built)  # against the model's maximum positions
    return made


plan.__signature__ = argument.signature(plan, PLAN_ARGUMENTS, keep=("model", "offline"))  # type: ignore[attr-defined]
