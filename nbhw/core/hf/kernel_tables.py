"""transformers' Hub-kernel tables, read from the installed transformers even when the ``kernels`` package is absent.

``hub_kernels._build_kernel_mapping`` (the layers ``use_kernels=True`` swaps) is defined only when a ``kernels``
version within transformers' range is installed, and ``FLASH_ATTN_KERNEL_FALLBACK`` is computed at import for the
platform this torch was built for. So nbhw reads both from transformers' source with ``ast`` (never executing it):
the same file transformers would run, including the branch for the platform you are not on.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from nbhw.core.hf.library_source import function_source, library_file

# The kernels package trusts this Hub org without allow_all_kernels=True (transformers' docs and the comments
# around hub_kernels.ALLOW_ALL_KERNELS); the check itself lives in `kernels`, which may not be installed.
TRUSTED_ORG = "kernels-community"

HUB_KERNELS_FILE = "integrations/hub_kernels.py"
FLASH_UTILS_FILE = "modeling_flash_attention_utils.py"


@dataclass
class KernelEntry:
    """One (layer, device) pair of the default kernel mapping."""

    layer: str
    device: str
    repos: list[str]
    modes: list[str] = field(default_factory=list)
    condition: str | None = None


@dataclass
class KernelMapping:
    """The default mapping as read, where from, and why it could not be read (``entries`` empty then)."""

    entries: list[KernelEntry]
    source: str
    problem: str | None = None

    def for_device(self, device: str) -> list[KernelEntry]:
        """The entries for one device key (cuda, rocm, xpu, npu, mps, cpu, ...)."""
        return [e for e in self.entries if e.device == device]


def _call_name(node: ast.expr) -> str:
    return ast.unparse(node.func) if isinstance(node, ast.Call) else ""


def _kw(call: ast.Call, name: str) -> Any:
    for kw in call.keywords:
        if kw.arg == name:
            try:
                return ast.literal_eval(kw.value)
            except ValueError:
                return ast.unparse(kw.value)
    return None


def _repo(node: ast.expr) -> str | None:
    """'org/repo:Layer' from LayerRepository(repo_id=..., layer_name=...)."""
    if not isinstance(node, ast.Call):
        return None
    repo_id = _kw(node, "repo_id")
    layer = _kw(node, "layer_name")
    if repo_id is None:
        return None
    return f"{repo_id}:{layer}" if layer else str(repo_id)


def _device(node: ast.expr) -> tuple[str | None, str | None]:
    """A device key: "cuda", or Device(type="cuda", properties=CUDAProperties(min_capability=.., ...))."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value, None
    if isinstance(node, ast.Call) and _call_name(node).endswith("Device"):
        props = next((kw.value for kw in node.keywords if kw.arg == "properties"), None)
        condition = None
        if isinstance(props, ast.Call):
            low, high = _kw(props, "min_capability"), _kw(props, "max_capability")
            condition = f"capability {low}" if low == high else f"capability {low}..{high}"
        return _kw(node, "type"), condition
    return None, None


def _modes(node: ast.expr) -> list[str]:
    return [m.lower() for m in re.findall(r"Mode\.(\w+)", ast.unparse(node))]


def _entries(layer: str, value: ast.expr) -> list[KernelEntry]:
    if not isinstance(value, ast.Dict):
        return []
    found = []
    for key, repo_node in zip(value.keys, value.values, strict=True):
        if key is None:
            continue
        device, condition = _device(key)
        if device is None:
            continue
        if isinstance(repo_node, ast.Dict):
            by_mode = [(k, v) for k, v in zip(repo_node.keys, repo_node.values, strict=True) if k is not None]
            repos = sorted({r for _, v in by_mode if (r := _repo(v))})
            modes = sorted({m for k, _ in by_mode for m in _modes(k)})
        else:
            repo = _repo(repo_node)
            repos, modes = ([repo] if repo else []), []
        found.append(KernelEntry(layer, device, repos, modes, condition))
    return found


def _mapping_dict(tree: ast.AST) -> ast.Dict | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "_build_kernel_mapping":
            for inner in ast.walk(node):
                if isinstance(inner, ast.AnnAssign | ast.Assign) and isinstance(inner.value, ast.Dict):
                    return inner.value
    return None


def _builder(tree: ast.AST) -> ast.FunctionDef | None:
    return next(
        (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_build_kernel_mapping"), None
    )


def _only_a_literal(builder: ast.FunctionDef) -> bool:
    """Whether the builder is its dict literal and a return (what ast can read): no loop, call or item added."""
    own = [s for s in builder.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return all(isinstance(s, ast.Assign | ast.AnnAssign | ast.Return) for s in own) and not any(
        isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store) for n in ast.walk(builder)
    )


@lru_cache(maxsize=4)
def _read_mapping(path: str, mtime: float) -> KernelMapping:
    source = f"transformers/{HUB_KERNELS_FILE}:_build_kernel_mapping"
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    mapping = _mapping_dict(tree)
    builder = _builder(tree)
    if mapping is None or builder is None:
        return KernelMapping([], source, "no _build_kernel_mapping dict in this transformers' hub_kernels.py")
    if not _only_a_literal(builder):
        # transformers >= 5.25 adds entries in loops and helper calls: a literal read would miss most of them.
        return KernelMapping([], source, "the mapping is built by code, not written as one literal, and the kernels "
                             "package transformers needs to build it is not usable here: unknown")  # fmt: skip
    entries = []
    for key, value in zip(mapping.keys, mapping.values, strict=True):
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            entries.extend(_entries(key.value, value))
    return KernelMapping(entries, source)


def _device_key(device: Any) -> tuple[str, str | None]:
    """A mapping key as nbhw names it: "cuda", or Device(type="cuda", properties=...) with its capability range."""
    if isinstance(device, str):
        return device, None
    props = getattr(device, "properties", None)
    low, high = getattr(props, "min_capability", None), getattr(props, "max_capability", None)
    condition = None if props is None else (f"capability {low}" if low == high else f"capability {low}..{high}")
    return str(getattr(device, "type", device)), condition


def _repo_name(repo: Any) -> str | None:
    repo_id = getattr(repo, "_repo_id", None) or getattr(repo, "repo_id", None)
    layer = getattr(repo, "layer_name", None)
    return None if repo_id is None else (f"{repo_id}:{layer}" if layer else str(repo_id))


def _mode_names(mode: Any) -> list[str]:
    name = str(getattr(mode, "name", None) or mode)
    return [m.lower() for m in name.removeprefix("Mode.").split("|") if m]


def _built_entries(built: dict[str, dict[Any, Any]]) -> list[KernelEntry]:
    found = []
    for layer, devices in built.items():
        for device, value in devices.items():
            kind, condition = _device_key(device)
            by_mode = value if isinstance(value, dict) else {}
            repos = sorted({r for v in (by_mode.values() if by_mode else [value]) if (r := _repo_name(v))})
            modes = sorted({m for mode in by_mode for m in _mode_names(mode)} - {"torch_compile"})
            found.append(KernelEntry(layer, kind, repos, modes, condition))
    return found


def _mapping_by_running() -> KernelMapping | None:
    """transformers' own mapping builder run (it only makes LayerRepository objects: no download); None when the
    kernels package it needs is not usable here."""
    from transformers.integrations import hub_kernels  # lazy: import nbhw and %load_ext nbhw stay free of transformers

    build = getattr(hub_kernels, "get_kernel_mapping_transformers", None) or getattr(
        hub_kernels, "_build_kernel_mapping", None
    )
    if build is None:
        return None
    try:
        built = build()
    except Exception:  # a builder that fails here: read the source instead
        return None
    return KernelMapping(_built_entries(built), f"transformers/{HUB_KERNELS_FILE}:{build.__name__}() (run)")


def default_mapping() -> KernelMapping:
    """The layers ``use_kernels=True`` would swap, per device key: transformers' own builder run where the kernels
    package lets it be defined, else read from its source (unknown where the source builds it in code)."""
    ran = _mapping_by_running()
    if ran is not None:
        return ran
    path = library_file("transformers", HUB_KERNELS_FILE)
    if path is None:
        return KernelMapping([], HUB_KERNELS_FILE, "transformers' hub_kernels.py was not found")
    try:
        return _read_mapping(str(path), os.path.getmtime(path))
    except (OSError, SyntaxError, ValueError) as exc:
        return KernelMapping([], str(path), f"could not read the mapping: {type(exc).__name__}: {exc}")


def kernel_config_devices() -> list[str]:
    """The device keys ``KernelConfig`` accepts, from transformers."""
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.utils.kernel_config import KERNELS_SUPPORTED_DEVICE_TYPES

    return list(KERNELS_SUPPORTED_DEVICE_TYPES)


def _fallback_from_source(rocm: bool) -> dict[str, str] | None:
    path = library_file("transformers", FLASH_UTILS_FILE)
    if path is None:
        return None
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "FLASH_ATTN_KERNEL_FALLBACK" for t in node.targets)
            and isinstance(node.value, ast.Dict)
        ):
            table = {}
            for key, node_value in zip(node.value.keys, node.value.values, strict=True):
                value = node_value
                if isinstance(value, ast.IfExp) and "is_rocm_platform" in ast.unparse(value.test):
                    value = value.body if rocm else value.orelse
                if isinstance(key, ast.Constant) and isinstance(value, ast.Constant):
                    table[str(key.value)] = str(value.value)
            return table
    return None


def flash_kernel_fallback(rocm: bool) -> dict[str, str]:
    """FLASH_ATTN_KERNEL_FALLBACK (flash_attention_N -> Hub repo) as transformers builds it on a ROCm or other torch."""
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.modeling_flash_attention_utils import FLASH_ATTN_KERNEL_FALLBACK

    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.utils.import_utils import is_rocm_platform

    if bool(is_rocm_platform()) == rocm:
        return dict(FLASH_ATTN_KERNEL_FALLBACK)
    # The table was computed for this torch's platform at import; the other platform's branch is in the source.
    try:
        return _fallback_from_source(rocm) or dict(FLASH_ATTN_KERNEL_FALLBACK)
    except (OSError, SyntaxError):
        return dict(FLASH_ATTN_KERNEL_FALLBACK)


def flash_kernel_fallback_in_source(rocm: bool) -> dict[str, str]:
    """FLASH_ATTN_KERNEL_FALLBACK read from transformers' source only (no transformers import); {} if unreadable."""
    try:
        return _fallback_from_source(rocm) or {}
    except (OSError, SyntaxError):
        return {}


def flash_kernel_devices() -> dict[str, tuple[str, ...]]:
    """FLASH_ATTN_KERNEL_DEVICES: the devices each Hub flash kernel ships builds for (unlisted: everywhere)."""
    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.modeling_flash_attention_utils import FLASH_ATTN_KERNEL_DEVICES

    return {k: tuple(v) for k, v in FLASH_ATTN_KERNEL_DEVICES.items()}


_MARKS = re.compile(r"use_kernel_(?:forward_from_hub|func_from_hub|func_from_hub_with_fallback)\(\s*[\"'](\w+)[\"']")


def model_kernel_layers(model_class: Any) -> list[str]:
    """The layer names a model's modeling file marks for Hub kernels (``@use_kernel_forward_from_hub("RMSNorm")``)."""
    module = sys.modules.get(getattr(model_class, "__module__", ""))
    path = getattr(module, "__file__", None)
    if not path:
        return []
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return []
    return sorted(set(_MARKS.findall(text)))


def kernelize_refuses(device_type: str) -> str | None:
    """The error the kernels package's own device check raises when kernelize meets ``device_type`` (None when it
    accepts it). Run, not copied: ``kernels._internals.layer.kernelize._validate_device_type``."""
    import importlib  # lazy: kernels is heavy, and only a plan with use_kernels asks

    check = None
    for where in ("kernels._internals.layer.kernelize", "kernels.layer.kernelize"):  # kernels >= 0.19, older
        try:
            check = getattr(importlib.import_module(where), "_validate_device_type", None)
        except ImportError:
            continue
        if check is not None:
            break
    if check is None:
        return None  # no such check in this kernels: transformers' own checks decide
    try:
        check(device_type)
    except ValueError as exc:
        return str(exc)
    return None


def swapped_layers(model_class: Any, device_type: str) -> list[str]:
    """The layers of ``model_class`` that the default mapping has a kernel for on ``device_type``."""
    marked = set(model_kernel_layers(model_class))
    return sorted({e.layer for e in default_mapping().for_device(device_type) if e.layer in marked and e.repos})


def hub_offline() -> bool:
    """Whether huggingface_hub is in offline mode in this process (HF_HUB_OFFLINE): the flag kernels passes as
    ``local_files_only`` when a load fetches a Hub kernel."""
    from huggingface_hub import constants  # lazy: import nbhw and %load_ext nbhw stay free of the Hub client

    return bool(constants.HF_HUB_OFFLINE)


def uncached_kernel_repos(model_class: Any, device_type: str) -> list[str] | None:
    """The Hub kernel repositories ``use_kernels=True`` would fetch for ``model_class`` on ``device_type`` that have
    no version in the local cache, as kernels' own cache reader sees it (an offline load of those fails); None when
    this kernels has no such reader (unknown)."""
    try:  # lazy: kernels is heavy, and only an offline plan with use_kernels asks
        from kernels._internals._versions import _get_available_versions
    except ImportError:
        return None
    marked = set(model_kernel_layers(model_class))
    entries = default_mapping().for_device(device_type)
    repos = sorted({r.split(":")[0] for e in entries if e.layer in marked for r in e.repos})
    return [r for r in repos if not _get_available_versions(r, local_files_only=True)]


def hub_kernels_enabled() -> tuple[bool, str]:
    """transformers' USE_HUB_KERNELS switch as ``from_pretrained`` reads it now, and the value it reads."""
    from transformers.integrations import hub_kernels  # lazy: import nbhw and %load_ext nbhw stay free of transformers

    switch = getattr(hub_kernels, "_kernels_enabled", True)
    if callable(switch):  # transformers >= 5.25 reads the variable at each load
        return bool(switch()), os.environ.get("USE_HUB_KERNELS", "YES")
    # Before 5.25 transformers read it once, at import.
    return bool(switch), str(getattr(hub_kernels, "_TRANSFORMERS_USE_HUB_KERNELS", "YES"))


# ---------------------------------------------------------------- what use_kernels=None means


MODELING_FILE = "modeling_utils.py"
FROM_PRETRAINED = "PreTrainedModel.from_pretrained"


@dataclass(frozen=True)
class KernelsDefault:
    """What ``from_pretrained`` does with ``use_kernels`` when the call doesn't pass it.

    ``value`` is None when nbhw could not read it from the installed transformers (``why`` says what it found).
    ``gated``: the default is on unless the USE_HUB_KERNELS switch turns Hub kernels off.
    """

    value: bool | None
    why: str
    gated: bool = False


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _popped_default(tree: ast.AST) -> tuple[bool, Any]:
    """(found, default) of ``use_kernels = kwargs.pop("use_kernels", DEFAULT)``."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and any(_is_name(t, "use_kernels") for t in node.targets)):
            continue
        call = node.value
        if isinstance(call, ast.Call) and _call_name(call).endswith(".pop") and len(call.args) == 2:
            first, second = call.args
            if isinstance(first, ast.Constant) and first.value == "use_kernels" and isinstance(second, ast.Constant):
                return True, second.value
    return False, None


def _none_becomes(tree: ast.AST) -> tuple[bool, Any]:
    """(found, value) of ``if use_kernels is None: use_kernels = VALUE`` (an ``elif`` too)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        test = node.test
        is_none = (
            isinstance(test, ast.Compare) and _is_name(test.left, "use_kernels") and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Is) and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value is None
        )  # fmt: skip
        if not is_none:
            continue
        for stmt in node.body:
            if (
                isinstance(stmt, ast.Assign) and any(_is_name(t, "use_kernels") for t in stmt.targets)
                and isinstance(stmt.value, ast.Constant)
            ):  # fmt: skip
                return True, stmt.value.value
        return True, ...  # a branch for None whose outcome isn't a constant
    return False, None


def _gated(tree: ast.AST) -> bool:
    """Whether the load asks ``_kernels_enabled()`` (the USE_HUB_KERNELS switch) before it decides."""
    return any(isinstance(n, ast.Call) and _call_name(n).split(".")[-1] == "_kernels_enabled" for n in ast.walk(tree))


def kernels_default_in(source: str) -> KernelsDefault:
    """``use_kernels``' default, read from the source of ``from_pretrained``; unknown where the shape is new."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return KernelsDefault(None, f"the load's source could not be parsed: {exc}")
    found, popped = _popped_default(tree)
    if not found:
        return KernelsDefault(None, "the load no longer pops use_kernels from its keywords as nbhw knows")
    branch, becomes = _none_becomes(tree)
    if popped is None and branch and isinstance(becomes, bool):
        gated = _gated(tree)
        switch = " unless the USE_HUB_KERNELS environment variable turns Hub kernels off" if gated else ""
        return KernelsDefault(becomes, f"transformers turns use_kernels=None into {becomes} at load{switch}", gated)
    if isinstance(popped, bool) and not branch:
        return KernelsDefault(popped, f"transformers' load defaults to use_kernels={popped}")
    return KernelsDefault(None, f"the load's use_kernels default is {popped!r}, then decided in a way nbhw "
                                "can't read")  # fmt: skip


@lru_cache(maxsize=4)
def _read_kernels_default(path: str, mtime: float) -> KernelsDefault:
    source = function_source(Path(path), FROM_PRETRAINED)
    if source is None:
        return KernelsDefault(None, f"{FROM_PRETRAINED} was not found in transformers' {MODELING_FILE}")
    return kernels_default_in(source)


def kernels_default() -> KernelsDefault:
    """What the installed transformers' ``from_pretrained`` does when ``use_kernels`` is not passed, here and now.

    Read from its source (never executed); the USE_HUB_KERNELS switch is read as transformers reads it.
    """
    path = library_file("transformers", MODELING_FILE)
    if path is None:
        return KernelsDefault(None, f"transformers' {MODELING_FILE} was not found")
    try:
        found = _read_kernels_default(str(path), os.path.getmtime(path))
    except (OSError, UnicodeDecodeError) as exc:
        return KernelsDefault(None, f"transformers' {MODELING_FILE} could not be read: {exc}")
    if found.value and found.gated:
        enabled, value = hub_kernels_enabled()
        if not enabled:
            return KernelsDefault(False, f"USE_HUB_KERNELS={value} turns Hub kernels off, so use_kernels=None "
                                         "becomes False", gated=True)  # fmt: skip
    return found
