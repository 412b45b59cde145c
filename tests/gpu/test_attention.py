"""On a real NVIDIA GPU: the advisor's rows for this card are what transformers does when it builds each one,
and the implementations it says work run a forward pass on the card.
"""

from __future__ import annotations

import copy
import importlib.util
import warnings
from typing import Any

import pytest

from nbhw.core.advice.status import Status
from tests.gpu.gpuenv import NvmlGpu, gpu_only

pytestmark = gpu_only()

FORWARD_KEYS = ("eager", "sdpa", "flex_attention")
DEVICE = "cuda:0"  # the card checked (a module constant, so the checks can be dry-run on another device)


@pytest.fixture(scope="module")
def advice() -> Any:
    import nbhw

    return nbhw.attention(device=DEVICE)


def _would_download(key: str) -> bool:
    """Whether transformers would fetch a Hub kernel to build this key here (the test never builds those)."""
    from transformers.integrations import hub_kernels
    from transformers.modeling_flash_attention_utils import FLASH_ATTENTION_COMPATIBILITY_MATRIX
    from transformers.utils.import_utils import is_kernels_available

    if importlib.util.find_spec("kernels") is None or not is_kernels_available():
        return False
    impl = key.rsplit("|", maxsplit=1)[-1]
    if hub_kernels.is_kernel(impl):
        return True
    version = impl.removeprefix("flash_attention_")
    entry = FLASH_ATTENTION_COMPATIBILITY_MATRIX.get(int(version)) if version.isdigit() else None
    return bool(entry) and not entry["pkg_availability_check"]()


def _meta_build(key: str | None, dtype: str) -> tuple[str | None, str | None]:
    """Build nbhw's reference model on the meta device with transformers: (attention it resolved to, error)."""
    import torch
    from transformers import AutoModelForCausalLM

    from nbhw.core.hf.tiny_model import tiny_config

    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
    if key is not None:
        kwargs["attn_implementation"] = key
    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_config(copy.deepcopy(tiny_config()), **kwargs)
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return str(model.config._attn_implementation), None


def test_advice_is_for_this_card_and_checked_by_builds_here(advice: Any, gpu0: NvmlGpu) -> None:
    assert (advice.device, advice.device_type, advice.present, advice.live) == ("cuda:0", "cuda", True, True)
    assert advice.dtype == ("bfloat16" if gpu0.compute_capability[0] >= 8 else "float16")
    assert not advice.notes, advice.notes  # nothing about an absent device or transformers running elsewhere


def test_every_row_agrees_with_a_meta_build_by_transformers(advice: Any, record_property: Any) -> None:

    disagree = []
    statuses = {}
    for row in advice.rows:
        statuses[row.key] = row.status
        if _would_download(row.key):
            assert row.status in {Status.HUB, Status.DOWNLOAD, Status.WONT}, row
            continue
        resolved, error = _meta_build(row.key, advice.dtype)
        if not row.checked:
            disagree.append(f"{row.key}: not checked by a build on a present card ({row.check})")
        if row.status == Status.WORKS and error is not None:
            disagree.append(f"{row.key}: nbhw says it works; transformers: {error[:200]}")
        runtime = row.check.startswith("meta build: transformers loads it")
        if row.status == Status.WONT and error is None and not runtime:
            disagree.append(f"{row.key}: nbhw says it won't work; transformers builds it")
        if row.status not in {Status.WORKS, Status.WONT}:
            disagree.append(f"{row.key}: {row.status!r} on a card that is present")
        if error is None and resolved not in (row.key, row.resolves_to):
            disagree.append(f"{row.key}: nbhw says it resolves to {row.resolves_to}; transformers: {resolved}")
    assert not disagree, "\n".join(disagree)
    default, error = _meta_build(None, advice.dtype)
    assert error is None and advice.default.resolves_to == default
    record_property("works", ",".join(k for k, s in statuses.items() if s == Status.WORKS))
    record_property("wont", ",".join(k for k, s in statuses.items() if s == Status.WONT))


@pytest.mark.timeout(300)  # flex_attention compiles its kernel on the first call
@pytest.mark.parametrize("key", FORWARD_KEYS)
def test_implementation_said_to_work_runs_a_forward_on_the_card(advice: Any, key: str, record_property: Any) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from nbhw.core.hf.tiny_model import tiny_config

    row = advice.row(key)
    dtype = getattr(torch, advice.dtype)
    torch.manual_seed(1)
    ids = torch.randint(0, tiny_config().vocab_size, (2, 32), device=DEVICE)

    def forward(impl: str) -> Any:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(tiny_config(), dtype=dtype, attn_implementation=impl)
        model = model.to(DEVICE).eval()
        with torch.no_grad():
            return model(ids).logits.float()

    try:
        logits = forward(key)
        error = None
    except Exception as exc:
        logits, error = None, f"{type(exc).__name__}: {exc}"
    assert (row.status == Status.WORKS) == (error is None), f"nbhw says {row.status}; forward: {error}"
    if logits is not None:
        assert torch.isfinite(logits).all()
        reference = forward("eager")
        torch.testing.assert_close(logits, reference, atol=2e-2, rtol=5e-2)
        record_property("max_abs_diff_vs_eager", f"{(logits - reference).abs().max().item():.2e}")
    record_property("status", row.status)
