"""Every private name of the libraries nbhw touches is listed once, and each still exists in the installed version."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import torch

from nbhw.core.hf.private_names import (
    CUDA_BUILD,
    PRIVATE_NAMES,
    PrivateName,
    in_installed_version,
    installed_version,
    resolve,
)

ROOT = Path(__file__).resolve().parents[3]


def present_here(name: PrivateName) -> bool:
    if name.only == CUDA_BUILD:
        return torch.version.cuda is not None
    # An optional package (bitsandbytes, kernels): checked where installed
    # (tests/core/hardware/test_doctor.py installs both).
    return name.only is None or importlib.util.find_spec(name.only) is not None


def _id(name: PrivateName) -> str:
    return f"{name.path} ({name.library} {name.versions})" if name.versions else name.path


@pytest.mark.parametrize("name", PRIVATE_NAMES, ids=_id)
def test_each_private_name_still_exists_in_the_installed_library(name: PrivateName) -> None:
    if not present_here(name):
        where = (
            "the GPU suite"
            if name.only == CUDA_BUILD
            else "tests/core/hardware/test_doctor.py, with the wheel set up beside the venv"
        )
        pytest.skip(f"{name.path} exists only on {name.only} (checked where one is installed: {where})")
    if not in_installed_version(name):
        here = installed_version(name.library)
        where = (
            "tests/core/hardware/test_doctor.py, with the kernels 0.17.2 wheel beside the venv"
            if name.library == "kernels"
            else "the compatibility run (noxfile.py) with such a release"
        )
        pytest.skip(f"{name.path} exists in {name.library} {name.versions}, {here} is installed (checked in {where})")
    resolve(name)  # raises, naming the attribute, when the name is gone (a class flag may hold None)


def test_names_of_some_releases_are_checked_in_one_of_them() -> None:
    # A range that no version matches would skip its name everywhere: each range is checked for a real release.
    ranged = {n for n in PRIVATE_NAMES if n.versions}
    assert {n.path for n in ranged} >= {
        "transformers.integrations.hub_kernels._TRANSFORMERS_USE_HUB_KERNELS",
        "kernels.variants.resolve_variants",
        "kernels._internals.variants.resolve_variants",
    }
    # Where a name moved, the old and the new place together cover every release: nbhw finds one of them.
    for old, new in (("kernels.variants", "kernels._internals.variants"),):
        olds = {n.versions for n in ranged if n.module == old}
        news = {n.versions for n in ranged if n.module == new}
        assert olds == {"<0.19"} and news == {">=0.19"}
    # The USE_HUB_KERNELS switch: a bool before 5.25, a function since; one of the two entries applies here.
    switch = [n for n in PRIVATE_NAMES if n.attribute == "_kernels_enabled"]
    assert sorted(n.versions for n in switch) == ["<5.25", ">=5.25"]
    assert sum(in_installed_version(n) for n in switch) == 1


def test_an_instance_made_with_arguments_is_resolved() -> None:
    name = PrivateName("argparse", "Namespace(a=1, b='x').b", "x", "read", "3.11")
    assert resolve(name) == "x" and name.parts == ["argparse", "Namespace", "b"]
    with pytest.raises(AttributeError, match="'c'"):
        resolve(PrivateName("argparse", "Namespace(a=1).c", "x", "read", "3.11"))


def test_a_renamed_private_name_is_caught_by_name() -> None:
    gone = PrivateName("transformers.integrations.accelerate", "_get_device_map_renamed", "x", "call", "5.24.0")
    with pytest.raises(AttributeError, match="_get_device_map_renamed"):
        resolve(gone)
    gone_source = PrivateName("accelerate.state", "PartialState._prepare_backend_renamed", "x", "source", "1.15.0")
    with pytest.raises(AttributeError, match="_prepare_backend_renamed"):
        resolve(gone_source)


def private_uses() -> dict[str, set[str]]:
    """Private names nbhw reads from objects it did not define: attributes, getattr strings, imports."""
    defined: set[str] = set()
    used: dict[str, set[str]] = {}
    for path in sorted((ROOT / "nbhw").rglob("*.py")):
        where = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                defined.add(node.attr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                defined.add(node.target.id)
            for name in _private(node):
                used.setdefault(name, set()).add(where)
    return {k: v for k, v in used.items() if k not in defined}


def _private(node: ast.AST) -> list[str]:
    def is_private(text: object) -> bool:
        return isinstance(text, str) and text.startswith("_") and not text.startswith("__")

    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and is_private(node.attr):
        own = isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"}
        return [] if own else [node.attr]
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) in {"getattr", "hasattr"} and len(node.args) > 1:
        value = node.args[1].value if isinstance(node.args[1], ast.Constant) else None
        return [str(value)] if is_private(value) else []
    if isinstance(node, ast.ImportFrom) and node.module and not node.module.startswith("nbhw"):
        return [a.name for a in node.names if is_private(a.name)]
    return []


def test_every_private_name_nbhw_uses_is_in_the_registry() -> None:
    listed = {part for n in PRIVATE_NAMES for part in n.parts}
    unlisted = {name: sorted(files) for name, files in private_uses().items() if name not in listed}
    assert not unlisted, f"add these to nbhw/core/hf/private_names.py: {unlisted}"
    assert len(PRIVATE_NAMES) >= 26
