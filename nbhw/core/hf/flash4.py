"""Which GPUs the installed flash-attn-4 runs on, read from its own source (never imported: it needs CUDA).

transformers' compatibility matrix holds only FlashAttention 4's floor (compute capability 9, Hopper). The package
itself refuses other GPUs at the first forward: ``_flash_attn_fwd`` in ``flash_attn/cute/interface.py`` asserts
``arch // 10 in [...]``, a list that grew between releases (see :data:`SINCE`).
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "flash-attn-4"
# The compute-capability majors flash-attn-4 added after its first betas (which ran on 9.x, 10.x, 11.x only), and
# the first release with them: 4.0.0b5 (2026-03-23) holds Dao-AILab/flash-attention#2329 "SM120 forward pass
# (Blackwell GeForce / DGX Spark)", which changed the assert to [8, 9, 10, 11, 12]; 4.0.0b4's interface.py says
# "Unsupported compute capability. Supported: 9.x, 10.x, 11.x". The Hub kernel kernels-community/flash-attn4 took
# the same change on 2026-04-10 (huggingface/kernels-community#533, "update to 4.0.0.beta8").
SINCE = {8: "4.0.0b5", 12: "4.0.0b5"}
FIRST = (9, 10, 11)


@dataclass
class Installed:
    """The installed flash-attn-4: its version and the compute-capability majors its forward pass accepts."""

    version: str
    majors: tuple[int, ...]
    source: str


def _interface() -> Path | None:
    spec = importlib.util.find_spec("flash_attn")  # a top-level name: nothing is imported
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / "cute" / "interface.py"
        if path.is_file():
            return path
    return None


def _asserted_majors(tree: ast.AST) -> tuple[int, ...] | None:
    """The list in ``assert arch // 10 in [...]`` inside ``_flash_attn_fwd``."""
    for fn in ast.walk(tree):
        if not (isinstance(fn, ast.FunctionDef) and fn.name == "_flash_attn_fwd"):
            continue
        for node in ast.walk(fn):
            test = node.test if isinstance(node, ast.Assert) else None
            if isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.In) and "arch" in ast.unparse(test.left):
                try:
                    return tuple(sorted(ast.literal_eval(test.comparators[0])))
                except ValueError:
                    return None
    return None


def installed() -> Installed | None:
    """The flash-attn-4 installed here, with the GPUs it accepts; None when it is not installed or unreadable."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version(PACKAGE)
    except PackageNotFoundError:
        return None
    path = _interface()
    majors = None if path is None else _asserted_majors(ast.parse(path.read_text()))
    return None if path is None or majors is None else Installed(found, majors, str(path))


def since(major: int) -> str | None:
    """The first flash-attn-4 release that runs on compute capability ``major``.x (None: the first betas did)."""
    return SINCE.get(major)
