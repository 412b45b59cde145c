"""Packages installed while the kernel runs: the doctor names a package installed again under its import, and a
quantization method whose package was installed after transformers asked about it says to restart, not to install.

Packages are installed as pip leaves them (a ``.dist-info`` folder and the files, in a folder on ``sys.path``)
while this process runs, and in a real kernel by ``%pip install`` itself (local wheels, ``--target`` a folder of the
test's own, so the venv is untouched); the modules are real modules, imported where the test says so."""

from __future__ import annotations

import os
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nbhw
from nbhw.core.advice import quantization
from nbhw.core.hardware import doctor, since_start
from tests.support.fake_binaries import write_distribution
from tests.support.kernel import Kernel, shown

MODULE = "nbhw_demo_pkg"


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path that pip installs into; the doctor's kept result forgotten before and after."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    doctor.forget_recent()
    yield folder
    doctor.forget_recent()
    sys.modules.pop(MODULE, None)


def install(site: Path, name: str, version: str) -> Path:
    """pip's result: the distribution's files and its .dist-info, written now."""
    return write_distribution(site, name, version, {f"{name}/__init__.py": f"__version__ = {version!r}\n".encode()})


def changed(result: Any) -> list[Any]:
    return [f for f in result.findings if f.id.endswith(":changed-since-import")]


def test_a_package_installed_again_under_its_import_is_named_with_both_versions(site: Path) -> None:
    install(site, MODULE, "1.0")
    __import__(MODULE)
    assert changed(doctor.doctor()) == []  # installed after the start, but the version imported is the one there
    for old in site.glob("*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    install(site, MODULE, "2.0")  # pip install -U: the new folder, the old module still running
    result = doctor.doctor()
    (finding,) = changed(result)
    assert finding.id == f"{MODULE}:changed-since-import" and finding.severity == "warning"
    assert f"{MODULE} 2.0 was installed at " in finding.what and f"the {MODULE} it imported before, 1.0" in finding.what
    assert finding.fix == since_start.RESTART and finding.evidence == (str(site / f"{MODULE}-2.0.dist-info"),)
    check = {c.name: c for c in result.checks}[since_start.CHECK]
    assert check.status == "finding" and MODULE in check.detail
    text = result.text()
    assert f"! {MODULE}:changed-since-import (warning, fails at import)" in text and "fix: restart the kernel" in text
    # Every plan carries it: whatever the cell loads runs beside the old module.
    assert any(f"pre-flight warning ({MODULE}:changed-since-import)" in n for n in nbhw.plan().notes)


def test_a_version_installed_before_the_process_started_is_not_named(site: Path) -> None:
    install(site, MODULE, "1.0")
    __import__(MODULE)
    install(site, MODULE, "2.0")
    info = site / f"{MODULE}-2.0.dist-info"
    (site / f"{MODULE}-1.0.dist-info").rename(site / "elsewhere")  # only 2.0 is installed now
    assert changed(doctor.doctor()), "installed while running: named"
    before = since_start.process_started() - 60
    os.utime(info, (before, before))
    os.utime(site, None)  # the folder changed: scanned again
    result = doctor.doctor()
    assert changed(result) == [] and {c.name: c.status for c in result.checks}[since_start.CHECK] == "ok"


def test_the_scan_is_kept_until_a_folder_on_the_path_changes(site: Path) -> None:
    first = since_start.installed()
    assert since_start.installed() is first  # nothing changed: the same scan
    install(site, MODULE, "3.0")
    again = since_start.installed()
    assert again is not first and again[MODULE].version == "3.0" and again[MODULE].name == MODULE
    assert since_start.installed_after_start(MODULE) == again[MODULE]
    assert since_start.installed_after_start("no-such-package") is None


def fouroversix(advice: Any) -> Any:
    return next(r for r in advice.rows if r.method == "fouroversix").here


def test_a_package_installed_after_transformers_asked_says_restart_not_pip_install(site: Path) -> None:
    from transformers.utils import import_utils

    if import_utils.is_fouroversix_available():
        pytest.skip("fouroversix is installed here: transformers already found it")
    before = fouroversix(quantization.advise())
    assert before.status == "needs a package" and before.fix == "pip install fouroversix --no-build-isolation"
    install(site, "fouroversix", "1.0.0")
    assert import_utils.is_fouroversix_available() is False  # transformers keeps its first answer
    after = fouroversix(quantization.advise())
    assert after.status == "needs a package" and after.fix == since_start.RESTART
    assert "once the kernel restarts (the packages are installed)" in after.why
    assert after.notes[0] == (
        "fouroversix 1.0.0 is installed now, but transformers keeps its first answer to is_fouroversix_available() "
        "(False) until the kernel restarts"
    )
    assert "fouroversix" not in sys.modules  # found by transformers' own check, asked again; never imported
    sys.modules.pop("fouroversix", None)


def wheel(folder: Path, name: str, version: str) -> Path:
    """A pure-Python wheel of one module whose ``__version__`` is ``version``, for pip to install."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: nbhw-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


@pytest.mark.slow
def test_in_a_kernel_pip_install_leads_the_doctor_and_the_quantization_table_to_say_restart(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    pip = f"%pip install -q --no-deps --no-index --upgrade --target {site}"
    old, new, four = (wheel(tmp_path, MODULE, "1.0"), wheel(tmp_path, MODULE, "2.0"),
                      wheel(tmp_path, "fouroversix", "1.0.0"))  # fmt: skip
    kernel = Kernel()
    try:
        kernel.run(f"import sys\nsys.path.insert(0, {str(site)!r})\n%load_ext nbhw")
        kernel.run(f"{pip} {old}", timeout=120)
        out, _ = kernel.run(f"import nbhw, {MODULE}\nprint({MODULE}.__version__)\n"
                            "print(nbhw.quantization().row('fouroversix').here.fix)", timeout=120)  # fmt: skip
        assert out.splitlines() == ["1.0", "pip install fouroversix --no-build-isolation"]
        kernel.run(f"{pip} {new} {four}", timeout=120)
        _, messages = kernel.run("%hw doctor")
        doctor_text = shown(messages)
        out, _ = kernel.run("row = nbhw.quantization().row('fouroversix').here\nprint(row.fix)\nprint(row.notes[0])\n"
                            f"print({MODULE}.__version__, 'fouroversix' in sys.modules)", timeout=120)  # fmt: skip
    finally:
        kernel.close()
    assert f"! {MODULE}:changed-since-import (warning, fails at import)" in doctor_text
    assert f"{MODULE} 2.0 was installed at " in doctor_text and "it imported before, 1.0, is still" in doctor_text
    assert "installed while running  finding" in doctor_text
    fix, note, still = out.splitlines()
    assert fix == since_start.RESTART and still == "1.0 False"
    assert note == ("fouroversix 1.0.0 is installed now, but transformers keeps its first answer to "
                    "is_fouroversix_available() (False) until the kernel restarts")  # fmt: skip
