"""One dtype vocabulary for every surface: the names torch has, the ones the controls offer, and what each means.

``check_dtype`` serves the load plan and the attention advisor alike, so ``--dtype half`` means float16 for both.
torch is imported only when a name has to be checked.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from nbhw.core.errors import UserError, one_of

AUTO = "auto"
# What the controls offer, in this order: "auto" (the checkpoint's own dtype) and the three a model is loaded in.
OFFERED = (AUTO, "float32", "float16", "bfloat16")
HALF = ("float16", "bfloat16")


@lru_cache(maxsize=1)
def dtype_names() -> tuple[str, ...]:
    """Every floating-point dtype name torch has (aliases like 'half' included), read from torch."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    return tuple(
        sorted(
            n
            for n in dir(torch)
            if isinstance(getattr(torch, n, None), torch.dtype) and getattr(torch, n).is_floating_point
        )
    )


def check_dtype(value: Any) -> str:
    """'auto' or the canonical name of a floating-point torch dtype ('half' -> 'float16'); a UserError otherwise."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    if value is None or value == AUTO:
        return AUTO
    if isinstance(value, torch.dtype):
        found: Any = value
    elif isinstance(value, str) and value.strip().removeprefix("torch.") in dtype_names():
        found = getattr(torch, value.strip().removeprefix("torch."))
    else:
        rest = [n for n in dtype_names() if n not in OFFERED]
        raise one_of("dtype", value, [*OFFERED, *rest])
    if not found.is_floating_point:
        raise UserError(f"dtype {value!r} is not a floating-point dtype; valid: {', '.join(OFFERED)}")
    return str(found).removeprefix("torch.")


# The dtype argument of the load plan and of the attention advisor, declared once (nbhw.core.argument).
DTYPE: dict[str, Any] = {
    "metavar": "DTYPE",
    "check": check_dtype,
    "help": "float32, float16, bfloat16 or auto (the checkpoint's own dtype); torch's names and aliases work too",
}
