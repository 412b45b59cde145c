"""A load plan's stages, each made alone from the ones before it (nbhw.core.plan.stages), and a plan made of them
going only as far as its reader asks."""

from __future__ import annotations

import dataclasses

import pytest

import nbhw
from nbhw.core.hf.tiny_model import tiny_model_path
from nbhw.core.plan import stages
from nbhw.core.plan.arguments import plan_args
from nbhw.core.plan.run_search import Fit


def _pipeline(**words: object) -> tuple[stages.Inputs, stages.Built, stages.Placed, stages.Ran, stages.Verdict]:
    made = stages.inputs(str(tiny_model_path()), plan_args(**words))
    built = stages.build(made)
    placed = stages.place_weights(made, built, stages.quantizer(made))
    ran = stages.dry_run(made, built, stages.weigh(made, built, stages.quantizer(made)), placed)
    asked: list[int] = []

    def context_fit() -> Fit | None:
        asked.append(1)
        return None

    verdict = stages.verdict(made, placed, ran, context_fit)
    assert asked == ([] if ran.fits else [1])  # the verdict searches only for a run that doesn't fit
    return made, built, placed, ran, verdict


def test_each_stage_is_made_alone_from_the_ones_before_and_equals_the_plans() -> None:
    made, built, placed, ran, verdict = _pipeline(context=256, max_memory={"cpu": "2GiB"})
    plan = nbhw.plan(context=256, max_memory={"cpu": "2GiB"})

    assert (made.context, made.batch, made.dtype, made.auto_class) == (256, 1, plan.dtype, plan.inputs.auto_class)
    weights = stages.weigh(made, built, stages.quantizer(made))
    assert built.model is not None and weights is not None and weights.parameters == plan.estimate.parameters
    assert placed.placement is not None and placed.placement.device_map == plan.placement.device_map
    assert placed.run_target == "cpu"
    assert ran.outcome.run is not None and ran.estimate is not None
    assert ran.estimate.peak_bytes == plan.estimate.peak_bytes and ran.fits is True and plan.run_fits is True
    assert (verdict.text, verdict.kind) == (plan.placement.verdict, plan.placement.run_kind)
    assert verdict.placement is not None
    assert [s.peak_bytes for s in verdict.placement.devices] == [s.peak_bytes for s in plan.placement.devices]
    for stage in (made, built, placed, ran, verdict):
        with pytest.raises(dataclasses.FrozenInstanceError):
            stage.placement = None  # type: ignore[misc, union-attr]


def test_a_stage_answers_for_the_inputs_it_is_given() -> None:
    made, built, placed, ran, _ = _pipeline(context=256, max_memory={"cpu": "2GiB"})
    held = dataclasses.replace(made, args=plan_args(context=256, max_memory={"cpu": "2GiB"}, reserve="3GiB"))
    again = stages.place_weights(
        held, built, stages.quantizer(held)
    )  # the same build placed again, for inputs with a reserve

    assert ran.fits is True
    assert again.placement is not None and again.placement.device_map == placed.placement.device_map  # type: ignore[union-attr]
    # The weights and the reserve alone are over the budget: the answer needs no dry run.
    assert stages.run_fits(held, again, lambda: pytest.fail("a dry run was made")) is False


def test_a_plan_goes_only_as_far_as_its_reader() -> None:
    plan = nbhw.plan(context=256)
    assert "from_pretrained(" in plan.code
    assert "built" not in plan.__dict__ and "placed" not in plan.__dict__  # the cell needs the inputs alone

    assert plan.check() == []
    assert "built" in plan.__dict__ and "weight_estimate" not in plan.__dict__  # a check needs no weights' figures
    assert plan.weight_placement is not None
    assert "placed" in plan.__dict__ and "ran" not in plan.__dict__  # weights placed: no dry run yet

    over = nbhw.plan(context=256, max_memory={"cpu": "1MiB"}, reserve="1MiB")
    assert over.run_fits is False
    assert "ran" not in over.__dict__  # the weights alone answered: the dry run was never made
    assert over.placement is not None and over.placement.run_kind == "does_not_fit"
