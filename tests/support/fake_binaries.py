"""Fakes for the pre-flight tests: tiny ELF shared libraries, CUDA fat binaries, installed distributions, a HF cache.

The ELF files are real enough for ``readelf``/``nm``: section headers, ``.dynsym``/``.dynstr``, a ``.gnu.hash``
table laid out like ld's, ``.dynamic`` with DT_NEEDED/DT_SONAME/DT_RUNPATH, and any extra section
(``.nv_fatbin``, ``.rodata``). They are never loaded; the checks only read them, which is the point.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

from nbhw.core.hardware import elf

SHT_PROGBITS, SHT_STRTAB, SHT_DYNAMIC = 1, 3, 6


class _Strings:
    def __init__(self) -> None:
        self.data = bytearray(b"\0")
        self.index: dict[str, int] = {}

    def add(self, text: str) -> int:
        if text not in self.index:
            self.index[text] = len(self.data)
            self.data += text.encode() + b"\0"
        return self.index[text]


def _gnu_hash_table(defined: Sequence[str], symoffset: int, nbuckets: int = 4) -> tuple[bytes, list[str]]:
    """A .gnu.hash section for the defined symbols, and the order they must have in .dynsym (by bucket)."""
    ordered = sorted(defined, key=lambda n: elf.gnu_hash(n.encode()) % nbuckets)
    buckets = [0] * nbuckets
    chains = []
    for i, name in enumerate(ordered):
        h = elf.gnu_hash(name.encode())
        b = h % nbuckets
        if buckets[b] == 0:
            buckets[b] = symoffset + i
        last = i + 1 == len(ordered) or elf.gnu_hash(ordered[i + 1].encode()) % nbuckets != b
        chains.append((h & ~1) | (1 if last else 0))
    bloom = [0xFFFFFFFFFFFFFFFF]  # every bit set: the reader never consults the bloom filter
    out = struct.pack("<IIII", nbuckets, symoffset, len(bloom), 6)
    out += b"".join(struct.pack("<Q", w) for w in bloom)
    out += b"".join(struct.pack("<I", x) for x in buckets)
    out += b"".join(struct.pack("<I", x & 0xFFFFFFFF) for x in chains)
    return out, ordered


def write_elf(
    path: Path,
    *,
    needed: Iterable[str] = (),
    soname: str | None = None,
    runpath: str | None = None,
    defined: Iterable[str] = (),
    undefined: Iterable[str] = (),
    weak_undefined: Iterable[str] = (),
    sections: dict[str, bytes] | None = None,
) -> Path:
    """Write a minimal x86_64 ELF shared object that declares these dynamic facts."""
    dynstr = _Strings()
    undefined_list = sorted(set(undefined)) + sorted(set(weak_undefined))
    weak = set(weak_undefined)
    symoffset = 1 + len(undefined_list)
    gnu_hash, defined_order = _gnu_hash_table(sorted(set(defined)), symoffset)
    syms = [struct.pack("<IBBHQQ", 0, 0, 0, 0, 0, 0)]
    for name in undefined_list:
        bind = 2 if name in weak else 1
        syms.append(struct.pack("<IBBHQQ", dynstr.add(name), (bind << 4) | 2, 0, 0, 0, 0))
    for name in defined_order:  # "defined" = any section index but SHN_UNDEF; .text (the last but one) here
        syms.append(struct.pack("<IBBHQQ", dynstr.add(name), (1 << 4) | 2, 0, 5 + len(sections or {}), 0x1000, 16))
    dyn_entries = [(1, dynstr.add(n)) for n in needed]
    if soname:
        dyn_entries.append((14, dynstr.add(soname)))
    if runpath:
        dyn_entries.append((29, dynstr.add(runpath)))
    dyn_entries.append((0, 0))
    dynamic = b"".join(struct.pack("<qQ", t, v) for t, v in dyn_entries)

    shstr = _Strings()
    # (name, type, data, link, entsize); section indices: 1 .dynsym, 2 .dynstr, 3 .gnu.hash, 4 .dynamic, ...
    body = [
        (".dynsym", elf.SHT_DYNSYM, b"".join(syms), 2, 24),
        (".dynstr", SHT_STRTAB, bytes(dynstr.data), 0, 0),
        (".gnu.hash", elf.SHT_GNU_HASH, gnu_hash, 1, 0),
        (".dynamic", SHT_DYNAMIC, dynamic, 2, 16),
    ]
    for name, data in (sections or {}).items():
        body.append((name, SHT_PROGBITS, data, 0, 0))
    body.append((".text", SHT_PROGBITS, b"\xc3", 0, 0))
    body.append((".shstrtab", SHT_STRTAB, b"", 0, 0))
    names = [shstr.add(n) for n, *_ in body]
    blob = bytearray(b"\0" * 64)
    offsets = []
    for name, _t, section_data, _l, _e in body:
        data = bytes(shstr.data) if name == ".shstrtab" else section_data
        while len(blob) % 8:
            blob += b"\0"
        offsets.append((len(blob), len(data)))
        blob += data
    while len(blob) % 8:
        blob += b"\0"
    shoff = len(blob)
    blob += b"\0" * 64  # the null section header
    for name_off, (_n, stype, _d, link, entsize), (off, size) in zip(names, body, offsets, strict=True):
        blob += struct.pack("<IIQQQQIIQQ", name_off, stype, 2, 0, off, size, link, 0, 8, entsize)
    header = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8
    header += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 56, 0, 64, len(body) + 1, len(body))
    blob[:64] = header
    path.write_bytes(bytes(blob))
    return path


def fatbin(entries: Iterable[tuple[str, int, str]]) -> bytes:
    """A .nv_fatbin container holding empty code objects: ('sm' | 'compute', 90, 'a' | 'f' | '')."""
    body = b""
    for kind, arch, suffix in entries:
        flags = 0x11 | {"a": elf.ARCH_SPECIFIC_FLAG, "f": elf.FAMILY_SPECIFIC_FLAG, "": 0}[suffix]
        payload = b"\0" * 8
        head = struct.pack(
            "<HHIQIIHHI",
            elf.FATBIN_CUBIN if kind == "sm" else elf.FATBIN_PTX,
            0x101,
            64,
            len(payload),
            0,
            0,
            8,
            1,
            arch,
        )
        head += b"\0" * 8 + struct.pack("<Q", flags) + b"\0" * 16
        body += head + payload
    return struct.pack("<IHHQ", elf.FATBIN_MAGIC, 1, 16, len(body)) + body


def write_distribution(
    site: Path,
    name: str,
    version: str,
    files: dict[str, bytes | Path],
    *,
    requires: Iterable[str] = (),
    direct_url: str | None = None,
) -> Path:
    """An installed distribution in site (dist-info + files), as pip leaves it; importlib.metadata reads it."""
    site.mkdir(parents=True, exist_ok=True)
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(meta) + "\n")
    record = []
    for rel, content in files.items():
        target = site / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            target.write_bytes(content.read_bytes())
        else:
            target.write_bytes(content)
        record.append(f"{rel},,")
    record.append(f"{info.name}/METADATA,,")
    (info / "RECORD").write_text("\n".join(record) + "\n")
    if direct_url:
        (info / "direct_url.json").write_text(f'{{"url": "{direct_url}", "archive_info": {{}}}}')
    return info
