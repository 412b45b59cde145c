"""The compatibility run: the tests that read library decisions, against three sets of the libraries nbhw reads.

    .venv/bin/nox -s "compat(libraries='pinned')" # scripts/constraints.txt: what CI runs
    .venv/bin/nox -s "compat(libraries='newest')" # the newest release of transformers, accelerate, peft and kernels
    .venv/bin/nox -s "compat(libraries='floors')" # the oldest versions pyproject.toml declares

Run it whenever you touch code that reads torch, transformers, accelerate, peft or kernels; README's
"Compatibility" section holds the last result per library. torch stays at the CPU build scripts/setup.sh installs
(2.13.0): other torch builds on the package index are CUDA builds of several GB.
"""

from __future__ import annotations

import re
from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

TORCH = "torch==2.13.0"
# The libraries nbhw reads decisions from, as pyproject.toml names them.
READ = ("transformers", "accelerate", "peft", "kernels")
# The tests that read library decisions: device choice, attention rules, kernels, quantization gates, private
# names, dry runs, caches, target plans, the defaults of from_pretrained and continuous batching's sizing.
TESTS = (
    "tests/core/advice/test_library_defaults.py",
    "tests/core/hf/test_choice.py",
    "tests/core/hf/test_private_names.py",
    "tests/core/advice/test_attention.py",
    "tests/core/advice/test_quantization.py",
    "tests/core/plan/test_target_plans.py",
    "tests/core/plan/test_dryrun.py",
    "tests/core/plan/test_cache_implementation.py",
    "tests/core/plan/test_placement.py",
    "tests/core/serve/test_serve.py",
)


def floors() -> list[str]:
    """``name==version`` for each library nbhw reads, at the floor pyproject.toml declares."""
    text = (ROOT / "pyproject.toml").read_text()
    found = []
    for name in READ:
        m = re.search(rf'"{name}(?:\[[^\]]*\])?\s*(>=|==)\s*([0-9][^",;]*)"', text)
        if m:
            found.append(f"{name}=={m.group(2)}")
    return found


SETS = {
    "pinned": ["-c", "scripts/constraints.txt"],
    "newest": ["--upgrade", *READ],
    "floors": floors(),
}


@nox.session
@nox.parametrize("libraries", list(SETS))
def compat(session: nox.Session, libraries: str) -> None:
    """The library-reading tests against one set of versions (pinned, newest or floors)."""
    session.install(TORCH)
    session.install("-c", "scripts/constraints.txt", "-e", ".[test]")
    if libraries != "pinned":
        session.install(*SETS[libraries])
    dists = ROOT / ".venv" / "nbhw-test-dists"  # the wheels scripts/setup.sh test sets up beside its venv
    if dists.is_dir():
        session.env["NBHW_TEST_DISTS"] = str(dists)
    session.run("python", "-c", _VERSIONS)
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", *TESTS, *session.posargs)


_VERSIONS = (
    "import importlib.metadata as m; "
    f"print('versions:', ', '.join(f'{{n}} {{m.version(n)}}' for n in {(*READ, 'torch')!r}))"
)
