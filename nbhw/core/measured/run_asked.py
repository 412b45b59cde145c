"""Which run ran out of memory: the model, batch, prompt and length of the ``generate()`` call a failed cell was in.

Read from the error's traceback frames (transformers' own ``generate()`` locals: ``input_ids`` once the inputs are
prepared, ``generation_config`` once its ``max_length`` is set), so the run planner can project changes to that very
run. Nothing is imported: a model exists only where transformers is already imported.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AskedRun:
    """The generate() call that ran out of memory."""

    model: Any  # the transformers model that was generating
    source: str  # its name_or_path: where nbhw.plan() reads its config from
    batch: int  # sequences, as the cache holds them (beams and returned sequences included)
    prompt: int  # tokens of the prompt
    context: int  # prompt + generated: the generation config's max_length
    dtype: str | None  # the model's parameter dtype ("bfloat16")


def _is_model(obj: Any) -> bool:
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(obj, transformers.PreTrainedModel)


def _generate_frame(exc: BaseException) -> Any:
    """The outermost ``generate`` frame of a transformers model in the traceback (frames run outer to inner)."""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "generate" and _is_model(frame.f_locals.get("self")):
            return frame
        tb = tb.tb_next
    return None


def asked_run(exc: BaseException) -> AskedRun | None:
    """The run the error happened in, or None (not in generate(), or before its inputs were prepared)."""
    frame = _generate_frame(exc)
    if frame is None:
        return None
    local = frame.f_locals
    model, ids, config = local["self"], local.get("input_ids"), local.get("generation_config")
    shape = tuple(getattr(ids, "shape", ()))
    length = getattr(config, "max_length", None)
    if len(shape) != 2 or not isinstance(length, int):
        return None
    source = getattr(model, "name_or_path", None) or getattr(model.config, "name_or_path", "")
    dtype = getattr(model, "dtype", None)
    return AskedRun(model, str(source), int(shape[0]), int(shape[1]), length,
                    str(dtype).removeprefix("torch.") if dtype is not None else None)  # fmt: skip
