"""The usable-memory table of docs/reference/targets.md: each catalog entry's usable memory, the box's number, ECC,
and its source.

Run from the repository root: ``.venv/bin/python scripts/usable_table.py`` (tests/core/hardware/test_usable_memory.py
checks that the page holds exactly what it prints). It reads the catalog only: no torch, no device.
"""

from __future__ import annotations

import sys
from urllib.parse import urlparse

from nbhw.core.hardware.targets import Accelerator, catalog, parse_target

HEADERS = ("target", "usable memory", "box", "ECC", "how it was found", "source")
ECC = {
    "on": "on: 1/16 kept for ECC bits",
    "off": "off as it ships",
    "none": "none",
    "sideband": "HBM: kept outside the memory",
}


def _usable(a: Accelerator) -> str:
    """'14.75 GiB', with the figure 'T4 ECC off' plans for where ECC can be turned off."""
    per = " per device" if a.devices_per_card > 1 else ""
    if a.ecc != "on":
        return f"{a.usable_gib:g} GiB{per}"
    off = parse_target(f"{a.name} ECC off").accelerator
    return f"{a.usable_gib:g} GiB{per} (ECC off: {off.usable_gib:g})"


def _link(url: str) -> str:
    """A short markdown link: 'owner/repo#697', 'owner/repo L4_deviceQuery.py', or the site's name."""
    found = urlparse(url)
    parts = [p for p in found.path.split("/") if p]
    if found.netloc == "github.com" and len(parts) >= 4:
        where = f"{parts[0]}/{parts[1]}"
        text = f"{where}#{parts[3]}" if parts[2] in ("issues", "pull") else f"{where} {parts[-1]}"
    else:
        text = found.netloc.removeprefix("www.")
    return f"[{text}]({url})"


def row(a: Accelerator) -> list[str]:
    """One line of the table."""
    how = f"{a.usable_from}: {a.usable_basis}".replace("|", "/")
    return [a.name, _usable(a), a.box, ECC[a.ecc], how, _link(a.usable_source)]


def table() -> str:
    """The markdown table, one row per catalog entry in the catalog's order."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row(a)) + " |" for a in catalog()]
    return "\n".join(lines) + "\n"


def main() -> None:
    sys.stdout.write(table())


if __name__ == "__main__":
    main()
