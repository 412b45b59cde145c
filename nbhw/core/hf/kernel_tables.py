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
from typing import Any

from nbhw.core.hf.library_source import library_file

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


@lru_cache(maxsize=4)
def _read_mapping(path: str, mtime: float) -> KernelMapping:
    source = f"transformers/{HUB_KERNELS_FILE}:_build_kernel_mapping"
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    mapping = _mapping_dict(tree)
    if mapping is None:
        return KernelMapping([], source, "no _build_kernel_mapping dict in this transformers' hub_kernels.py")
    entries = []
    for key, value in zip(mapping.keys, mapping.values, strict=True):
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            entries.extend(_entries(key.value, value))
    return KernelMapping(entries, source)


def default_mapping() -> KernelMapping:
    """The layers ``use_kernels=True`` would swap, per device key, read from transformers' own source."""
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


def hub_kernels_enabled() -> tuple[bool, str]:
    """transformers' USE_HUB_KERNELS switch as it read it at import, and the value it read."""
    from transformers.integrations import hub_kernels  # lazy: import nbhw and %load_ext nbhw stay free of transformers

    # lazy: import nbhw and %load_ext nbhw stay free of transformers
    from transformers.utils import ENV_VARS_TRUE_VALUES

    value = str(getattr(hub_kernels, "_TRANSFORMERS_USE_HUB_KERNELS", "YES"))
    return value.upper() in ENV_VARS_TRUE_VALUES, value
