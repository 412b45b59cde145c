"""Build nbhw's JupyterLab / Notebook 7 extension from js/ into nbhw/labextension/ (committed, so installing nbhw
never needs Node). Run it after changing anything under js/; it needs node >= 20 and npm:

    .venv/bin/python scripts/build_labextension.py

It installs the pinned builder (npm ci), builds against the JupyterLab installed in this Python, writes the
install.json that `jupyter labextension list` reads, and records a hash of the sources in js/build.sha256 so a test
can tell when the committed build is older than js/.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JS = ROOT / "js"
OUT = ROOT / "nbhw" / "labextension"
INSTALL = {
    "packageManager": "python",
    "packageName": "nbhw",
    "uninstallInstructions": "Use your Python package manager (pip, conda, etc.) to uninstall the package nbhw",
}


def sources() -> list[Path]:
    """The files the build is made from."""
    return [JS / "package.json", JS / "package-lock.json", *sorted((JS / "src").rglob("*.js"))]


def source_hash() -> str:
    """One hash over the sources' paths and bytes."""
    digest = hashlib.sha256()
    for path in sources():
        digest.update(path.relative_to(JS).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def main() -> int:
    npm = shutil.which("npm")
    if npm is None:
        print("build_labextension: npm not found (install Node.js 20 or newer)", file=sys.stderr)
        return 1
    subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=JS, check=True)
    import jupyterlab
    from jupyter_builder.federated_extensions import build_labextension

    # The core package of the JupyterLab in this Python: the builder would otherwise look it up online.
    core = Path(jupyterlab.__file__).parent / "staging" / "package.json"
    build_labextension(str(JS), core_package_file=str(core))
    (OUT / "install.json").write_text(json.dumps(INSTALL, indent=2) + "\n")
    (JS / "build.sha256").write_text(source_hash() + "\n")
    print(f"built {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
