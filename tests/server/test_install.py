"""README's install path, in a fresh venv: build nbhw's wheel, install it; the server and JupyterLab find it enabled."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def nbhw_targets() -> list[object]:
    from nbhw.core.hardware.targets import catalog

    return list(catalog())


def venv_package(venv: Path) -> Path:
    (site,) = venv.glob("lib/python*/site-packages")
    return site / "nbhw"


def run(*args: str | Path, env: dict[str, str], cwd: Path) -> str:
    proc = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return ANSI.sub("", proc.stdout + proc.stderr)


@pytest.mark.slow
def test_pip_install_into_a_fresh_venv_enables_the_extension(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    # A bare folder as cwd and no PYTHONPATH (either would import the work tree, not what pip installed);
    # no user or env-var Jupyter config.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("JUPYTER")}
    env.update(JUPYTER_CONFIG_DIR=str(tmp_path / "user-config"), JUPYTER_DATA_DIR=str(tmp_path / "user-data"))

    run(sys.executable, "-m", "venv", "--without-pip", venv, env=env, cwd=tmp_path)
    # The test environment's packages (jupyter_server, torch, hatchling, ...) are seen through a .pth line rather
    # than installed again; the new venv's own site-packages come first, so `import nbhw` finds what pip installed.
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", env=env, cwd=tmp_path).strip()
    shared = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    Path(site, "test-environment.pth").write_text("\n".join(shared) + "\n", encoding="utf-8")
    # As README says: a wheel built from the checkout, then installed (here without its dependencies, seen above).
    dist = tmp_path / "dist"
    wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, ROOT]
    run(*wheel, env=env, cwd=tmp_path)
    (built,) = dist.glob("nbhw-*.whl")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--ignore-installed"]
    run(*pip, "--no-cache-dir", built, env=env, cwd=tmp_path)

    config = venv / "etc" / "jupyter" / "jupyter_server_config.d" / "nbhw.json"
    assert json.loads(config.read_text(encoding="utf-8")) == {"ServerApp": {"jpserver_extensions": {"nbhw": True}}}
    where = run(python, "-c", "import nbhw; print(nbhw.__file__)", env=env, cwd=tmp_path).strip()
    assert Path(where).is_relative_to(venv), where
    # The accelerator catalog is package data: the wheel carries it, and nbhw.targets() reads it from there.
    catalog = "import nbhw; t = nbhw.targets(); print(len(t.rows), nbhw.core.hardware.targets._raw()['schema'])"
    assert run(python, "-c", catalog, env=env, cwd=tmp_path).split() == [str(len(nbhw_targets())), "1"]
    assert (venv_package(venv) / "core" / "hardware" / "catalog.json").is_file()

    listed = run(python, "-m", "jupyter_server", "extension", "list", env=env, cwd=tmp_path)
    section = listed.split(f"Config dir: {venv / 'etc' / 'jupyter'}")[1].split("Config dir:")[0]
    assert re.search(r"^\s+nbhw enabled$", section, re.M), listed
    assert re.search(r"^\s+nbhw \S+ OK$", section, re.M), listed

    # The panel's front-end extension ("Insert cell below") lands where JupyterLab and Notebook 7 look for it.
    labext = venv / "share" / "jupyter" / "labextensions" / "nbhw"
    entry = json.loads((labext / "package.json").read_text(encoding="utf-8"))["jupyterlab"]["_build"]["load"]
    assert (labext / entry).is_file()
    lab = "import sys; from jupyterlab.labextensions import main; sys.argv = ['jupyter-labextension', 'list']; main()"
    found = run(python, "-c", lab, env=env, cwd=tmp_path)
    assert re.search(r"nbhw v\S+ enabled OK \(python, nbhw\)", found), found
