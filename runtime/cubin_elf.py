"""What a cubin says about its kernels, read from its ELF without a GPU or a CUDA tool.

A cubin is a 64-bit little-endian ELF file. Its kernels are the global
functions of the symbol table marked ``STO_CUDA_ENTRY`` (``st_other & 0x10``);
the section ``.nv.info.<kernel>`` holds that kernel's attributes as records of
a format byte, an attribute byte and a 16-bit value (or, for the format
``EIFMT_SVAL``, the payload's size and then the payload). One
``EIATTR_KPARAM_INFO`` record per parameter gives its ordinal, its offset in the
parameter buffer and (bits 18..31 of its last word) its size in bytes: what the
driver reports as ``cuKernelGetParamInfo`` / cuda.core's ``arguments_info``.

runtime/cuda_graph.py checks a plan against it when it loads an artifact (before
any GPU work), and tests/cuda/test_cubin.py checks that what ``bendc compile``
records agrees with it.
"""
from __future__ import annotations

import struct

SHT_SYMTAB = 2
STT_FUNC = 2
STO_CUDA_ENTRY = 0x10
EIFMT_SVAL = 4
EIATTR_KPARAM_INFO = 0x17
INFO_PREFIX = ".nv.info."


class CubinUnreadable(ValueError):
    """Bytes that are not a cubin this reader understands."""


def _sections(data: bytes) -> list[tuple[str, int, int, int, int]]:
    """(name, type, file offset, size, link) of every section."""
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2 or data[5] != 1:
        raise CubinUnreadable("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = []
    for index in range(shnum):
        name, kind, _, _, offset, size, link = struct.unpack_from("<IIQQQQI", data, shoff + index * shentsize)
        raw.append((name, kind, offset, size, link))
    names_offset = raw[shstrndx][2]
    return [(_string(data, names_offset + name), kind, offset, size, link) for name, kind, offset, size, link in raw]


def _string(data: bytes, offset: int) -> str:
    return data[offset:data.index(b"\0", offset)].decode()


def entry_symbols(data: bytes) -> list[str]:
    """The kernels (entry functions) a cubin defines."""
    sections = _sections(data)
    entries = []
    for _, kind, offset, size, link in sections:
        if kind != SHT_SYMTAB:
            continue
        strings = sections[link][2]
        for start in range(offset, offset + size, 24):
            name, info, other = struct.unpack_from("<IBB", data, start)
            if info & 0xF == STT_FUNC and other & STO_CUDA_ENTRY:
                entries.append(_string(data, strings + name))
    return entries


def kernel_parameters(data: bytes, entry: str) -> list[tuple[int, int]]:
    """(offset, size) in bytes of each parameter of kernel ``entry``, in ordinal order."""
    for name, _, offset, size, _ in _sections(data):
        if name == INFO_PREFIX + entry:
            return _kparams(data[offset:offset + size], entry)
    raise CubinUnreadable(f"the cubin has no {INFO_PREFIX}{entry} section")


def _kparams(info: bytes, entry: str) -> list[tuple[int, int]]:
    found: dict[int, tuple[int, int]] = {}
    position = 0
    while position + 4 <= len(info):
        form, attribute, value = struct.unpack_from("<BBH", info, position)
        position += 4
        if form != EIFMT_SVAL:
            continue
        payload = info[position:position + value]
        position += value
        if attribute == EIATTR_KPARAM_INFO:
            _, ordinal, offset, flags = struct.unpack_from("<IHHI", payload)
            found[ordinal] = (offset, flags >> 18)
    if sorted(found) != list(range(len(found))):
        raise CubinUnreadable(f"{entry}: parameter ordinals {sorted(found)} are not 0..n-1")
    return [found[k] for k in range(len(found))]
