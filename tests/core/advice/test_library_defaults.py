"""Answers that follow the installed transformers' own defaults, and say "unknown" where its code has a new shape.

transformers 5.25 turned Hub kernels on by default (``use_kernels=None`` becomes True in ``from_pretrained`` unless
USE_HUB_KERNELS turns them off) and made ``kernels`` a requirement, so ``flash_attention_N`` without its package goes
to a Hub kernel on every machine. nbhw's plan, cell, advice and ``nbhw.loaded()`` must describe that load, and
``plan.check()`` must give the attention advice's answer.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import transformers

import nbhw
from nbhw.core.advice.status import Status
from nbhw.core.hf import kernel_tables, meta_build
from nbhw.core.hf.tiny_model import tiny_model_path
from tests.support.fakes import GIB, FakeGpu, FakeHardware

TINY = str(tiny_model_path())


def from_pretrained_source(body: str) -> str:
    """A from_pretrained whose use_kernels handling is ``body`` (the shape transformers' source is read in)."""
    return "def from_pretrained(cls, name, *args, **kwargs):\n" + textwrap.indent(textwrap.dedent(body), "    ")


SHAPE_5_24 = """
use_kernels = kwargs.pop("use_kernels", False)
model = cls(name)
model.set_use_kernels(use_kernels)
"""
SHAPE_5_25 = """
use_kernels = kwargs.pop("use_kernels", None)
if not _kernels_enabled():
    use_kernels = False
elif use_kernels is None:
    use_kernels = True
model.set_use_kernels(use_kernels)
"""


def test_use_kernels_default_is_read_from_each_release_s_shape() -> None:
    old = kernel_tables.kernels_default_in(from_pretrained_source(SHAPE_5_24))
    new = kernel_tables.kernels_default_in(from_pretrained_source(SHAPE_5_25))
    assert (old.value, old.gated) == (False, False)
    assert (new.value, new.gated) == (True, True) and "USE_HUB_KERNELS" in new.why


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("use_kernels = kwargs.get('use_kernels')\n", "no longer pops use_kernels"),
        ("use_kernels = kwargs.pop('use_kernels', None)\nmodel.set_use_kernels(use_kernels)\n", "can't read"),
        (
            "use_kernels = kwargs.pop('use_kernels', None)\nif use_kernels is None:\n    use_kernels = pick(name)\n",
            "can't read",
        ),
        ("use_kernels = kwargs.pop('use_kernels', None\n", "could not be parsed"),
    ],
)
def test_a_changed_from_pretrained_gives_unknown_not_a_guess(body: str, said: str) -> None:
    found = kernel_tables.kernels_default_in(from_pretrained_source(body))
    assert found.value is None and said in found.why


def test_a_plan_on_an_unknown_default_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    unknown = kernel_tables.KernelsDefault(None, "the load no longer pops use_kernels")
    monkeypatch.setattr(kernel_tables, "kernels_default", lambda: unknown)
    plan = nbhw.plan(TINY, device_map="cpu")
    assert plan.use_kernels is None
    assert any("use_kernels is left out, and what transformers then does is unknown" in n for n in plan.notes)
    assert "use_kernels" not in plan.code


@pytest.mark.parametrize("switch", [None, "0"])
def test_the_default_nbhw_reads_is_the_one_from_pretrained_applies(
    monkeypatch: pytest.MonkeyPatch, switch: str | None
) -> None:
    if switch is None:
        monkeypatch.delenv("USE_HUB_KERNELS", raising=False)
    else:
        monkeypatch.setenv("USE_HUB_KERNELS", switch)
    default = kernel_tables.kernels_default()
    model = transformers.AutoModelForCausalLM.from_pretrained(TINY, device_map="cpu")
    assert default.value is not None and default.value == model.use_kernels
    plan = nbhw.plan(TINY, device_map="cpu")
    assert plan.use_kernels == model.use_kernels and "use_kernels" not in plan.code


@pytest.mark.parametrize("use_kernels", [None, False, True])
def test_the_cell_loads_with_the_use_kernels_its_plan_says(session: Any, use_kernels: bool | None) -> None:
    # On main before 5.25 was read, the default cell loaded with use_kernels=True against a plan saying False.
    plan = nbhw.plan(TINY, device_map="cpu", use_kernels=use_kernels)
    assert ("use_kernels" in plan.code) == (use_kernels is not None)
    if plan.use_kernels and not meta_build.kernels_status()[0]:  # transformers < 5.25 with kernels out of its range
        assert any(p.startswith("use_kernels=True") for p in plan.check())
        with pytest.raises(ValueError, match="Kernels are not available"):
            session.run_cell(plan.code, store_history=True).raise_error()
        return
    session.run_cell(plan.code, store_history=True).raise_error()
    found = nbhw.loaded()["model"]
    assert found.loaded.use_kernels == plan.use_kernels == session.user_ns["model"].use_kernels
    assert found.comparison is not None and found.comparison.differences == (), found.comparison.differences


def test_use_kernels_words_turn_it_on_and_off(ip: Any) -> None:
    from nbhw.commands import parser

    on = parser("cli").parse_args(["load", TINY, "--kernels"])
    off = parser("cli").parse_args(["load", TINY, "--no-kernels"])
    neither = parser("cli").parse_args(["load", TINY])
    assert (on.use_kernels, off.use_kernels, neither.use_kernels) == (True, False, None)
    assert "use_kernels=False" in nbhw.plan(TINY, use_kernels=False).code


FLASH = ["flash_attention_2", "flash_attention_3", "flash_attention_4"]


@pytest.mark.parametrize("attn", FLASH)
def test_plan_check_and_the_attention_advice_give_one_answer_here(attn: str) -> None:
    # transformers >= 5.25 sends flash_attention_N without its package to a Hub kernel; on this CPU the kernel has
    # no build, so from_pretrained fails, the advice says "won't work", and check() (once []) says the same.
    row = nbhw.attention(TINY, device="cpu").row(attn)
    problems = nbhw.plan(TINY, device_map="cpu", attn_implementation=attn).check()
    assert row.status is Status.WONT and len(problems) == 1
    if meta_build.kernels_status()[0]:  # the Hub kernel path: no build here, the advice's rule is the answer
        assert row.reason in problems[0] and "on the cpu" in problems[0]
    else:  # no usable kernels (transformers < 5.25): both are transformers' own build error
        assert row.checked and row.error and row.error in problems[0]
    with pytest.raises((ImportError, ValueError, OSError)):
        transformers.AutoModelForCausalLM.from_pretrained(TINY, device_map="cpu", attn_implementation=attn)


LITERAL_BUILDER = '''
def _build_kernel_mapping():
    """The mapping."""
    _KERNEL_MAPPING = {
        "RMSNorm": {"cuda": LayerRepository(repo_id="kernels-community/liger_kernels", layer_name="LigerRMSNorm")},
    }
    return _KERNEL_MAPPING
'''
LOOP_BUILDER = """
def _build_kernel_mapping():
    _KERNEL_MAPPING = {"Esm": {"cuda": LayerRepository(repo_id="biohub/esm", layer_name="Esm")}}
    for name in ("SiLU", "GeLU"):
        _KERNEL_MAPPING[name] = {"cuda": LayerRepository(repo_id="kernels-community/activation", layer_name=name)}
    return _KERNEL_MAPPING
"""


@pytest.mark.parametrize(("source", "read"), [(LITERAL_BUILDER, True), (LOOP_BUILDER, False)])
def test_a_kernel_mapping_built_in_code_reads_as_unknown_not_as_its_literal(
    tmp_path: Any, source: str, read: bool
) -> None:
    # transformers 5.25 builds most of the mapping in loops: the literal alone held 3 of its 64 entries, and nbhw
    # said "nothing would be swapped" on a GPU. Where it can't run the builder, nbhw now says unknown.
    path = tmp_path / "hub_kernels.py"
    path.write_text("if is_kernels_available():\n" + textwrap.indent(source, "    "))
    mapping = kernel_tables._read_mapping(str(path), 0.0)
    if read:
        assert mapping.problem is None
        assert [(e.layer, e.device, e.repos) for e in mapping.entries] == [
            ("RMSNorm", "cuda", ["kernels-community/liger_kernels:LigerRMSNorm"])
        ]
    else:
        assert mapping.entries == [] and mapping.problem is not None and "unknown" in mapping.problem


def test_the_installed_mapping_is_transformers_own() -> None:
    from transformers.integrations import hub_kernels

    mapping = kernel_tables.default_mapping()
    builder = getattr(hub_kernels, "get_kernel_mapping_transformers", None)
    if builder is None:  # kernels unusable: the builder isn't defined, and the source is read
        assert "(run)" not in mapping.source
        return
    assert mapping.problem is None and "(run)" in mapping.source
    assert {e.layer for e in mapping.entries} == set(builder())


OFFLINE_FIX = "use_kernels=False (--no-kernels)"


@pytest.fixture
def offline_cuda(fake_hw: FakeHardware, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """One CUDA GPU (NVML), the Hub offline as kernels reads it, and an empty kernels cache; returns the cache."""
    from huggingface_hub import constants

    fake_hw.nvidia(FakeGpu(total=80 * GIB))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("KERNELS_CACHE", str(tmp_path))
    return tmp_path


def _cache(cache: Path, repo: str) -> None:
    """A kernel repository with version 1 in the local cache, laid out as the Hub client lays it out."""
    from huggingface_hub.file_download import repo_folder_name

    refs = cache / repo_folder_name(repo_id=repo, repo_type="kernel") / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    (refs / "v1").write_text("0" * 40)


def test_an_offline_load_on_cuda_says_which_hub_kernels_it_lacks(offline_cuda: Path) -> None:
    # Seen on a real H200 (tests/gpu): with the Hub offline, transformers 5.25's default use_kernels made the cell
    # nbhw wrote fail in kernelize ("Version 2 of 'kernels-community/rotary' is not available in the local cache").
    if not meta_build.kernels_status()[0] or not kernel_tables.kernels_default().value:
        pytest.skip("this transformers leaves Hub kernels off by default")
    plan = nbhw.plan(TINY, device_map="cuda:0")
    cls = meta_build.model_class(plan.config.config, plan.inputs.auto_class)
    missing = kernel_tables.uncached_kernel_repos(cls, "cuda")
    assert missing and "kernels-community/rotary" in missing
    found = [p for p in plan.check() if "the Hub is offline" in p]
    assert len(found) == 1 and all(r in found[0] for r in missing) and OFFLINE_FIX in found[0], plan.check()
    # kernels itself refuses each one named, offline, the way the real load did.
    from kernels._internals._versions import resolve_version_spec_as_ref

    for repo in missing:
        with pytest.raises(ValueError, match="not available in the local cache"):
            resolve_version_spec_as_ref(repo, 1, local_files_only=True)


def test_cached_kernels_use_kernels_false_or_an_online_hub_clear_it(
    offline_cuda: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not meta_build.kernels_status()[0] or not kernel_tables.kernels_default().value:
        pytest.skip("this transformers leaves Hub kernels off by default")
    off = nbhw.plan(TINY, device_map="cuda:0", use_kernels=False)
    assert not any("the Hub is offline" in p for p in off.check())
    plan = nbhw.plan(TINY, device_map="cuda:0")
    cls = meta_build.model_class(plan.config.config, plan.inputs.auto_class)
    for repo in kernel_tables.uncached_kernel_repos(cls, "cuda") or []:
        _cache(offline_cuda, repo)
    assert kernel_tables.uncached_kernel_repos(cls, "cuda") == []
    assert not any("the Hub is offline" in p for p in nbhw.plan(TINY, device_map="cuda:0").check())
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("KERNELS_CACHE", str(offline_cuda / "empty"))
    assert not any("the Hub is offline" in p for p in nbhw.plan(TINY, device_map="cuda:0").check())
