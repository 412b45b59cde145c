"""On a real NVIDIA GPU: a LoRA and a QLoRA training step of a locally built ~1B model on cuda:0, the peak torch's
allocator reports for the second step against nbhw's meta-device estimate (within 10 %).

Written without a GPU lent (the session that wrote it had none): not yet run on one.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.gpuenv import GIB, gpu_only

pytestmark = gpu_only()

TOLERANCE = 0.10


@pytest.mark.timeout(600)
@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_a_training_step_on_cuda0_peaks_as_planned(billion_model: Path, method: str, record_property: Any) -> None:
    if method == "qlora" and importlib.util.find_spec("bitsandbytes") is None:
        pytest.skip("bitsandbytes is not installed in the GPU suite's environment")
    import torch
    from transformers import AutoConfig

    from nbhw.core.train import step as S
    from nbhw.core.train import training_build
    from nbhw.core.train.arguments import train_args

    args = train_args(method=method, batch=1, context=512, gradient_checkpointing=True, dtype="bfloat16",
                      device_type="cuda")  # fmt: skip
    config = AutoConfig.from_pretrained(billion_model)
    estimate = S.dry_run(config, args)
    model = training_build.load_for_training(str(billion_model), args, device="cuda:0")
    optimizer = training_build.create_optimizer(model, args)
    batch = training_build.training_batch(args, config.vocab_size, device="cuda:0")
    max_norm = training_build.training_defaults().max_grad_norm
    training_build.train_step(model, optimizer, batch, max_grad_norm=max_norm)  # step 1 makes the optimizer state
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    training_build.train_step(model, optimizer, batch, max_grad_norm=max_norm)
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated()
    ratio = measured / estimate.peak
    record_property("estimate_gib", round(estimate.peak / GIB, 3))
    record_property("measured_gib", round(measured / GIB, 3))
    record_property("ratio", round(ratio, 4))
    assert abs(ratio - 1) <= TOLERANCE, (measured, estimate.peak)
