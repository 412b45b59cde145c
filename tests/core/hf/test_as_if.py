"""Advice for a target runs transformers' own checks as if on the target's device; the real machine never sees it.

The checks are copies of transformers' functions whose globals answer for the target. These tests show that the
copies see the target, that nothing process-wide changes (module attributes, transformers' cached device checks,
other threads), and that a device call nbhw doesn't answer is stopped before it reaches a driver.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

import pytest
import torch
import transformers.quantizers.quantizer_finegrained_fp8 as fp8_module
from transformers import FineGrainedFP8Config
from transformers.modeling_flash_attention_utils import FLASH_ATTENTION_COMPATIBILITY_MATRIX
from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING
from transformers.utils import import_utils

import nbhw
from nbhw.core.advice import quantization_methods as M
from nbhw.core.advice.attention_rules import FLASH_KEY, catalog_target, transformers_flash_check
from nbhw.core.advice.quantization import where_for
from nbhw.core.advice.quantization_gates import gate
from nbhw.core.hardware.targets import catalog, parse_target
from nbhw.core.hf.as_if import AsIf, NotModelled, TargetDevice

T4 = TargetDevice("cuda", 1, (7, 5), "Tesla T4", 16 * 1024**3)
CACHED_CHECKS = ("is_torch_cuda_available", "is_torch_xpu_available", "is_torch_mps_available")


def _validate(device: TargetDevice | None) -> tuple[AsIf, FineGrainedFP8Config]:
    cls = AUTO_QUANTIZER_MAPPING["fp8"]
    q = cls(FineGrainedFP8Config(), pre_quantized=True)
    run = AsIf(device)
    run.call(cls.validate_environment, q, device_map={"": 0}, weights_only=True)
    return run, q.quantization_config


def test_transformers_own_check_sees_the_targets_capability() -> None:
    run, config = _validate(T4)
    assert config.dequantize is True  # transformers' own rule: FP8 below 8.9 dequantizes
    assert run.seen.calls == ["torch.cuda.is_available", "torch.cuda.get_device_capability"]
    assert any("compute capability >= 8.9" in msg and "7.5" in msg for _, msg in run.seen.logs)
    _, on_h100 = _validate(TargetDevice("cuda", 1, (9, 0)))
    assert not on_h100.dequantize


def test_checking_a_target_changes_nothing_in_the_process() -> None:
    module_before = dict(vars(fp8_module))
    answers_before = {name: getattr(import_utils, name)() for name in CACHED_CHECKS}  # cached by transformers now
    cached_before = {name: getattr(import_utils, name).cache_info().currsize for name in CACHED_CHECKS}
    nbhw.quantization(target="H100")
    nbhw.attention(target="2x H100")
    assert fp8_module.torch is torch and dict(vars(fp8_module)) == module_before
    # transformers' cached answers (read for this machine, by the rows for "here") gained no entry and kept their value
    assert {name: getattr(import_utils, name).cache_info().currsize for name in CACHED_CHECKS} == cached_before
    assert {name: getattr(import_utils, name)() for name in CACHED_CHECKS} == answers_before
    assert torch.cuda.is_available() is False and torch.accelerator.current_accelerator() is None


def test_the_real_machine_is_unaffected_while_a_target_is_checked() -> None:
    stop = threading.Event()
    wrong: list[str] = []
    real = {"cuda": torch.cuda.is_available(), "hf": import_utils.is_torch_cuda_available()}

    def watch() -> None:
        # What another thread (a cell, the memory sampler) reads while the advice runs for a GPU that isn't here.
        while not stop.is_set():
            seen = {"cuda": torch.cuda.is_available(), "hf": import_utils.is_torch_cuda_available()}
            if seen != real or fp8_module.torch is not torch or torch.cuda.device_count() != 0:
                wrong.append(str(seen))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        results: list[Any] = []
        workers = [threading.Thread(target=lambda: results.append(_validate(T4)[1].dequantize)) for _ in range(8)]
        workers.append(threading.Thread(target=lambda: results.append(nbhw.quantization(target="2x H100"))))
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        stop.set()
        watcher.join()
    assert results.count(True) == 8 and wrong == []
    advice = next(r for r in results if not isinstance(r, bool))
    assert advice.row("fp8").target.status == "works" and advice.row("fp8").here.status != "works"
    assert nbhw.detect().devices[0].device == "cpu"  # detection still finds this machine


def test_a_device_call_nbhw_does_not_answer_is_refused_not_passed_to_the_driver() -> None:
    def reads_memory() -> int:
        return int(torch.cuda.memory_allocated())

    with pytest.raises(NotModelled, match=r"torch\.cuda\.memory_allocated"):
        AsIf(T4).call(reads_memory)


def test_plugin_modules_exist_only_for_their_own_device() -> None:
    def has_npu() -> bool:
        return hasattr(torch, "npu")

    assert AsIf(TargetDevice("npu")).call(has_npu) is True
    assert AsIf(T4).call(has_npu) is False


def test_the_static_survey_covers_every_call_a_checked_run_made() -> None:
    where = where_for(catalog_target(parse_target("T4")))
    for key in M.methods():
        config, _ = M.build_config(key, "float16")
        if config is None:
            continue
        how, _ = M.loads(key)
        g = gate(key, config, where, pre_quantized=how in {M.Loads.PREQUANTIZED, M.Loads.FILE_FORMAT})
        assert set(g.calls) <= set(M.survey(key)["device"]), (key, g.calls)


@pytest.mark.parametrize("entry", [a.key for a in catalog()])
def test_the_flash_rows_for_every_target_agree_with_transformers_own_check(entry: str) -> None:
    target = parse_target(next(a.name for a in catalog() if a.key == entry))
    advice = nbhw.attention(target=target.text)
    for row in advice.rows:
        m = FLASH_KEY.match(row.key)
        if m is None or row.kind != "registry":
            continue
        refused = transformers_flash_check(int(m.group(1)), target.device())
        documented = any("documented gate" in n for n in row.notes)
        # Where transformers refuses, so does nbhw; where nbhw refuses what transformers accepts, it says why.
        assert (refused is None) or row.status == "won't work", (entry, row.key, refused)
        assert refused is not None or row.status != "won't work" or documented, (entry, row.key, row.reason)


def test_a_changed_flash_matrix_in_transformers_changes_a_targets_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    # A release that raised FlashAttention 3's floor to Blackwell: the H100's row follows it, read from the matrix.
    assert nbhw.attention(target="H100").row("flash_attention_3").status == "works"
    monkeypatch.setitem(FLASH_ATTENTION_COMPATIBILITY_MATRIX[3], "cuda_min_major_version", 10)
    after = nbhw.attention(target="H100").row("flash_attention_3")
    assert after.status == "won't work" and "compute capability 10.0" in after.reason
    assert nbhw.attention(target="B200").row("flash_attention_3").status == "works"


_INSTALLED = [False]
logger = logging.getLogger("nbhw.tests.demo")  # in a copy, the run's own log (as transformers' logger is)


@functools.lru_cache
def is_nbhw_demo_available() -> bool:
    """Shaped as transformers' package checks are: cached for the process, and it logs."""
    logger.warning("looked for nbhw_demo")
    return _INSTALLED[0]


def _asks_for_the_demo() -> bool:
    return is_nbhw_demo_available()


def test_a_kept_false_answer_is_asked_again_and_only_the_answer_is_kept() -> None:
    first = AsIf(T4)
    assert first.call(_asks_for_the_demo) is False and first.seen.kept == []  # still missing: nothing to say
    _INSTALLED[0] = True  # "pip install" after the first answer
    try:
        again = AsIf(T4)
        assert again.call(_asks_for_the_demo) is False  # what transformers keeps, as transformers would answer
        assert again.seen.kept == ["is_nbhw_demo_available"]
        # The second ask ran as a copy (its log line went to the run) and left nothing else behind.
        assert again.seen.packages == [("is_nbhw_demo_available", False)] and again.seen.logs == []
        assert is_nbhw_demo_available() is False  # the cache itself is untouched
    finally:
        _INSTALLED[0] = False
        is_nbhw_demo_available.cache_clear()
