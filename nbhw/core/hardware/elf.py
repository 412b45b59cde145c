"""What a shared library needs and offers, read from its ELF file without loading it.

Loading a broken extension is what crashes (``undefined symbol``, ``cannot open shared object file``, a kernel
with no code for this GPU), so nbhw reads the file instead: the dynamic section (``DT_NEEDED`` libraries), the
dynamic symbol table (what it imports and exports), the GNU hash table (to look a name up the way ``ld.so``
does, without reading every symbol) and the CUDA fat binary (``.nv_fatbin``: which ``sm_XY`` cubins and
``compute_XY`` PTX it carries, what ``cuobjdump --list-elf/--list-ptx`` prints).

Only 64-bit little-endian ELF is read (Linux x86_64 and aarch64, where these wheels exist); anything else
raises :class:`ElfError`. Formats: the System V gABI and the LSB for ``.gnu.hash``; the fat binary header is
NVIDIA's ``fatbinary_section.h`` (``fatBinaryHeader``: magic 0xBA55ED50, version, header size, fat size), the
entry layout is as cuobjdump reads it (kind 1 = PTX, 2 = cubin; ``arch`` at offset 28), checked here against
cuobjdump 13 on real libraries (FINDINGS.md).
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

ELF_MAGIC = b"\x7fELF"
SHT_DYNSYM, SHT_DYNAMIC, SHT_GNU_HASH = 11, 6, 0x6FFFFFF6
DT_NULL, DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 14, 15, 29
STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 1, 2, 10
STV_HIDDEN, STV_INTERNAL = 2, 1
SHN_UNDEF = 0
FATBIN_MAGIC = 0xBA55ED50
FATBIN_PTX, FATBIN_CUBIN = 1, 2
_SYM = struct.Struct("<IBBHQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_FATBIN_HEADER = struct.Struct("<IHHQ")
_FATBIN_ENTRY = struct.Struct("<HHIQIIHHI")  # kind, _, header size, payload size, _, _, minor, major, arch


class ElfError(ValueError):
    """The file is not an ELF shared library nbhw can read."""


@dataclass(frozen=True)
class GpuCode:
    """One CUDA code object in a fat binary: a cubin for ``sm_XY[a|f]`` or PTX for ``compute_XY[a|f]``."""

    kind: str  # "sm" (cubin, runs as is) or "compute" (PTX, compiled by the driver at load)
    arch: int  # 90 for sm_90, 120 for sm_120
    suffix: str = ""  # "a" (this exact GPU only) or "f" (its family); "" for neither

    @property
    def name(self) -> str:
        """'sm_90a', 'compute_120'."""
        return f"{self.kind}_{self.arch}{self.suffix}"


@dataclass(frozen=True)
class Dynamic:
    """A shared library's dynamic section: the libraries it needs, its own name, where it looks."""

    needed: tuple[str, ...]
    soname: str | None
    runpath: tuple[str, ...]


@dataclass(frozen=True)
class _Section:
    type: int
    offset: int
    size: int
    link: int
    entsize: int


class _Reader:
    """An mmapped ELF file: sections by name and type, strings, symbols."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as f:
            try:
                self.data: mmap.mmap | bytes = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # an empty file cannot be mapped
                self.data = b""
        self._parse_header()

    def _parse_header(self) -> None:
        d = self.data
        if len(d) < 64 or d[:4] != ELF_MAGIC:
            raise ElfError(f"{self.path}: not an ELF file")
        if d[4] != 2 or d[5] != 1:
            raise ElfError(f"{self.path}: only 64-bit little-endian ELF is read (class {d[4]}, data {d[5]})")
        (shoff,) = struct.unpack_from("<Q", d, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
        if shoff == 0 or shnum == 0 or shentsize != _SHDR.size or shoff + shnum * shentsize > len(d):
            raise ElfError(f"{self.path}: no section headers")
        self.sections: list[_Section] = []
        self.names: dict[str, _Section] = {}
        raw = [_SHDR.unpack_from(d, shoff + i * shentsize) for i in range(shnum)]
        for _name, stype, _flags, _addr, offset, size, link, _info, _align, entsize in raw:
            self.sections.append(_Section(stype, offset, size, link, entsize))
        names = self.sections[shstrndx] if shstrndx < shnum else None
        for (name_off, *_), section in zip(raw, self.sections, strict=True):
            if names is not None:
                self.names[self.string(names, name_off)] = section

    def close(self) -> None:
        if isinstance(self.data, mmap.mmap):
            self.data.close()

    def string(self, table: _Section, offset: int) -> str:
        start = table.offset + offset
        end = self.data.find(b"\0", start, table.offset + table.size)
        return bytes(self.data[start : end if end >= 0 else table.offset + table.size]).decode("utf-8", "replace")

    def of_type(self, stype: int) -> _Section | None:
        return next((s for s in self.sections if s.type == stype), None)

    def symbols(self) -> Iterator[tuple[str, int, int, int]]:
        """(name, binding, visibility, section index) of every dynamic symbol."""
        dynsym = self.of_type(SHT_DYNSYM)
        if dynsym is None:
            return
        strtab = self.sections[dynsym.link]
        count = dynsym.size // _SYM.size
        for i in range(1, count):  # entry 0 is the null symbol
            name, info, other, shndx, _value, _size = _SYM.unpack_from(self.data, dynsym.offset + i * _SYM.size)
            yield self.string(strtab, name), info >> 4, other & 3, shndx

    def dynamic(self) -> list[tuple[int, int]]:
        section = self.of_type(SHT_DYNAMIC)
        if section is None:
            return []
        entries = []
        for off in range(section.offset, section.offset + section.size, 16):
            tag, value = struct.unpack_from("<qQ", self.data, off)
            if tag == DT_NULL:
                break
            entries.append((tag, value))
        return entries


def _dynamic_strings(reader: _Reader) -> tuple[tuple[str, ...], str | None, tuple[str, ...]]:
    dynamic = reader.of_type(SHT_DYNAMIC)
    if dynamic is None:
        return (), None, ()
    strtab = reader.sections[dynamic.link]
    needed: list[str] = []
    soname: str | None = None
    runpath: list[str] = []
    for tag, value in reader.dynamic():
        if tag == DT_NEEDED:
            needed.append(reader.string(strtab, value))
        elif tag == DT_SONAME:
            soname = reader.string(strtab, value)
        elif tag in (DT_RPATH, DT_RUNPATH):
            runpath.extend(p for p in reader.string(strtab, value).split(":") if p)
    return tuple(needed), soname, tuple(runpath)


def _undefined(reader: _Reader) -> frozenset[str]:
    # A weak undefined reference resolves to 0 when missing; only strong ones make dlopen fail.
    return frozenset(
        name for name, bind, _vis, shndx in reader.symbols() if shndx == SHN_UNDEF and bind == STB_GLOBAL and name
    )


# Bits of a fat binary entry's 64-bit flags word that mark arch- and family-specific code. Read by building one
# kernel with nvcc 13.0 for sm_90 / sm_90a / sm_100a / sm_100f / sm_120a / sm_120f / compute_90a / compute_120f
# and reading the entries (FINDINGS.md, "fat binary"): 0x100000 is 'a', 0x200000 is 'f'. cuobjdump 13 names an
# 'f' cubin without its suffix (sm_100f lists as sm_100); it shows 'a' cubins and both PTX suffixes.
ARCH_SPECIFIC_FLAG = 0x100000
FAMILY_SPECIFIC_FLAG = 0x200000


def _suffix(flags: int) -> str:
    if flags & ARCH_SPECIFIC_FLAG:
        return "a"
    if flags & FAMILY_SPECIFIC_FLAG:
        return "f"
    return ""


def fatbin_entries(data: bytes | mmap.mmap, start: int, size: int) -> Iterator[tuple[int, int, int, int]]:
    """(kind, arch, flags, entry offset) of every code object in the fat binaries between start and start+size."""
    pos, end = start, start + size
    while pos + _FATBIN_HEADER.size <= end:
        magic, _version, header_size, fat_size = _FATBIN_HEADER.unpack_from(data, pos)
        if magic != FATBIN_MAGIC:
            # Containers are 8-byte aligned inside the section; skip padding between them.
            pos += 8
            continue
        entry, container_end = pos + header_size, min(pos + header_size + fat_size, end)
        while entry + _FATBIN_ENTRY.size + 16 <= container_end:
            kind, _, entry_header, payload, _, _, _minor, _major, arch = _FATBIN_ENTRY.unpack_from(data, entry)
            if entry_header == 0:
                break
            (flags,) = struct.unpack_from("<Q", data, entry + 40)
            yield kind, arch, flags, entry
            entry += entry_header + payload
        pos = pos + header_size + fat_size


def _gpu_code(reader: _Reader) -> tuple[tuple[GpuCode, ...], bool]:
    section = reader.names.get(".nv_fatbin")
    if section is None or section.size == 0:
        return (), False
    found: set[GpuCode] = set()
    for kind, arch, flags, _entry in fatbin_entries(reader.data, section.offset, section.size):
        if kind in (FATBIN_PTX, FATBIN_CUBIN):
            found.add(GpuCode("compute" if kind == FATBIN_PTX else "sm", arch, _suffix(flags)))
    return tuple(sorted(found, key=lambda c: (c.arch, c.kind, c.suffix))), True


def _key(path: str | os.PathLike[str]) -> tuple[str, int, float]:
    # The size and mtime are part of every cache key: a reinstalled wheel is read again.
    real = os.path.realpath(path)
    st = os.stat(real)
    return real, st.st_size, st.st_mtime


@lru_cache(maxsize=256)
def _dynamic(path: str, size: int, mtime: float) -> Dynamic:
    reader = _Reader(path)
    try:
        return Dynamic(*_dynamic_strings(reader))
    finally:
        reader.close()


@lru_cache(maxsize=64)
def _undefined_cached(path: str, size: int, mtime: float) -> frozenset[str]:
    reader = _Reader(path)
    try:
        return _undefined(reader)
    finally:
        reader.close()


@lru_cache(maxsize=64)
def _gpu_code_cached(path: str, size: int, mtime: float) -> tuple[GpuCode, ...] | None:
    reader = _Reader(path)
    try:
        code, has_fatbin = _gpu_code(reader)
        return code if has_fatbin else None
    finally:
        reader.close()


def dynamic(path: str | os.PathLike[str]) -> Dynamic:
    """DT_NEEDED, DT_SONAME and DT_RUNPATH/DT_RPATH of the library at path."""
    return _dynamic(*_key(path))


def undefined_symbols(path: str | os.PathLike[str]) -> frozenset[str]:
    """The strong undefined symbols of the library: loading fails if no library in its scope defines one."""
    return _undefined_cached(*_key(path))


def gpu_code(path: str | os.PathLike[str]) -> tuple[GpuCode, ...] | None:
    """The CUDA cubins and PTX in the library's fat binary; None when it has no ``.nv_fatbin`` section."""
    return _gpu_code_cached(*_key(path))


# ---------------------------------------------------------------- exported names, looked up like ld.so does


def gnu_hash(name: bytes) -> int:
    """The GNU symbol hash (h = h * 33 + c, from 5381), as ld.so computes it for ``.gnu.hash``."""
    h = 5381
    for c in name:
        h = (h * 33 + c) & 0xFFFFFFFF
    return h


class Exports:
    """Answers 'does this library export NAME?' from its ``.gnu.hash`` table, or a scan when it has none."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._reader = _Reader(path)
        self._scanned: frozenset[str] | None = None
        self._table = self._gnu_table()

    def close(self) -> None:
        self._reader.close()

    def _gnu_table(self) -> tuple[int, int, int, int, int, int] | None:
        section = self._reader.of_type(SHT_GNU_HASH)
        dynsym = self._reader.of_type(SHT_DYNSYM)
        if section is None or dynsym is None:
            return None
        nbuckets, symoffset, bloom_size, _shift = struct.unpack_from("<IIII", self._reader.data, section.offset)
        buckets = section.offset + 16 + bloom_size * 8
        chains = buckets + nbuckets * 4
        return nbuckets, symoffset, buckets, chains, dynsym.offset, dynsym.link

    def _defines(self, bind: int, vis: int, shndx: int) -> bool:
        return (
            shndx != SHN_UNDEF
            and bind in (STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE)
            and vis
            not in (
                STV_HIDDEN,
                STV_INTERNAL,
            )
        )

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if self._table is None:
            if self._scanned is None:
                self._scanned = frozenset(n for n, b, v, s in self._reader.symbols() if self._defines(b, v, s))
            return name in self._scanned
        nbuckets, symoffset, buckets, chains, dynsym, strndx = self._table
        if nbuckets == 0:
            return False
        data, wanted = self._reader.data, name.encode()
        h = gnu_hash(wanted)
        (index,) = struct.unpack_from("<I", data, buckets + (h % nbuckets) * 4)
        if index < symoffset:
            return False
        strtab = self._reader.sections[strndx]
        while True:
            (chain_hash,) = struct.unpack_from("<I", data, chains + (index - symoffset) * 4)
            if (chain_hash | 1) == (h | 1):
                st_name, info, other, shndx, _v, _s = _SYM.unpack_from(data, dynsym + index * _SYM.size)
                if self._reader.string(strtab, st_name) == name and self._defines(info >> 4, other & 3, shndx):
                    return True
            if chain_hash & 1:  # the last symbol of this bucket's chain
                return False
            index += 1


@lru_cache(maxsize=64)
def _exports(path: str, size: int, mtime: float) -> Exports:
    return Exports(path)


def exports(path: str | os.PathLike[str]) -> Exports:
    """The export table of the library at path (cached; the file stays mapped, read-only)."""
    return _exports(*_key(path))


def section_matches(path: str | os.PathLike[str], section: str, pattern: re.Pattern[bytes]) -> list[str]:
    """Every first group of pattern found in the named section (e.g. a string constant in .rodata)."""
    reader = _Reader(os.fspath(path))
    try:
        found = reader.names.get(section)
        if found is None:
            return []
        end = found.offset + found.size
        return [m.group(1).decode("ascii", "replace") for m in pattern.finditer(reader.data, found.offset, end)]
    finally:
        reader.close()
