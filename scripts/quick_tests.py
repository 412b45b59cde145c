"""Run the tests of the parts of nbhw you changed: the quick loop before the whole suite.

    .venv/bin/python scripts/quick_tests.py             # what git says changed (against HEAD, and untracked files)
    .venv/bin/python scripts/quick_tests.py nbhw/core/plan/run.py nbhw/ui   # or name the files or folders
    .venv/bin/python scripts/quick_tests.py --fast ...  # without the tests marked slow

tests/ mirrors the package, so a changed ``nbhw/core/plan/run.py`` runs ``tests/core/plan``; a changed test runs
its own folder. Anything else pytest takes (``-k``, ``-x``, ...) is passed on after ``--``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The top-level modules and where their tests are.
TOP = {
    "__init__.py": ["tests/magics"],
    "__main__.py": ["tests/commands"],
    "commands.py": ["tests/commands"],
    "magics.py": ["tests/magics"],
    "session.py": ["tests/magics", "tests/core/memory"],
    "_version.py": [],
}


def changed() -> list[str]:
    """Files git sees changed against HEAD, and new files it does not ignore."""
    diff = ["git", "diff", "--name-only", "HEAD"]
    new = ["git", "ls-files", "--others", "--exclude-standard"]
    found = [subprocess.run(c, cwd=ROOT, capture_output=True, text=True, check=True).stdout for c in (diff, new)]
    return sorted({name for text in found for name in text.split()})


def tests_for(path: str) -> list[str]:
    """The test folders of one changed file or folder (none for what has no tests of its own)."""
    parts = Path(path).parts
    if not parts or parts[0] not in ("nbhw", "tests"):
        return []
    if parts[0] == "tests":
        folder = Path(path) if (ROOT / path).is_dir() else Path(path).parent
        return [] if "support" in folder.parts else [str(folder)]
    inside = parts[1:]
    if len(inside) == 1 and inside[0] in TOP:
        return TOP[inside[0]]
    if inside and inside[0] == "labextension":
        return ["tests/browser"]
    folder = Path("tests", *inside) if (ROOT / path).is_dir() else Path("tests", *inside[:-1])
    return [str(folder)] if (ROOT / folder).is_dir() else []


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/quick_tests.py", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="changed files or folders (default: what git says changed)")
    parser.add_argument("--fast", action="store_true", help="leave out the tests marked slow")
    cut = argv.index("--") if "--" in argv else len(argv)
    args, rest = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    folders = sorted({t for p in (args.paths or changed()) for t in tests_for(p)})
    if not folders:
        print("no tests for these changes: run the whole suite (README's test command)", file=sys.stderr)
        return 0
    command = [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", *folders]
    command += ["-m", "not slow"] if args.fast else []
    command += rest
    print(" ".join(command[1:]), flush=True)
    return subprocess.run(command, cwd=ROOT, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
