"""Identity of a compiled kernel, so that an edit which changes the source but not the binary is never timed twice
and replay can answer for it.

The identity is a hash over the cubin's ELF sections rather than over SASS text: cuobjdump's SASS leaves out data
(the literal constant bank, initialized globals) and resource attributes, and costs a subprocess. The ELF hash covers
the code (.text.<kernel>, whose header also carries the register count), constants, initialized data, shared memory
sizes and the .nv.info attributes (parameter layout, max threads, barriers), plus the ELF flags (arch). It skips
what cannot change execution but may carry provenance: notes (.note.*: toolkit and options) and debug sections
(.debug_*: line info and source names when present; we compile without -lineinfo). NVRTC's output was found to be
byte-for-byte stable across file names and comment-only edits, so this is the conservative choice, not a fix.
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
import struct
from typing import Mapping

from ..types import BuildInfo, EvalResult, canonical_json

# Special registers that read clocks, timers, performance counters or the SM/warp a thread landed on.
SASS_TIMER = re.compile(r"\bSR_(CLOCK\w*|GLOBALTIMER\w*|VIRTUALSMID|VIRTID|SMID|NSMID|PM\d\w*)")


class NotACubin(ValueError):
    """The bytes are not a 64-bit little-endian ELF (a bug upstream, never a candidate's failure)."""


def identity(cubin: bytes) -> str:
    """A stable hash of everything in a cubin that can change what the kernel does."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        raise NotACubin("expected a 64-bit little-endian ELF cubin")
    e_flags, = struct.unpack_from("<I", cubin, 0x30)
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    digest = hashlib.sha256(struct.pack("<I", e_flags))
    for name_off, sh_type, flags, _addr, offset, size, link, info, align, entsize in headers[1:]:
        name = cubin[names_at + name_off:cubin.index(b"\0", names_at + name_off)]
        if name.startswith((b".note", b".debug", b".rela.debug", b".rel.debug")):
            continue
        contents = b"" if sh_type == 8 else cubin[offset:offset + size]   # SHT_NOBITS holds only a size
        digest.update(struct.pack("<IIQQIIQQ", len(name), sh_type, flags, size, link, info, align, entsize))
        digest.update(name + hashlib.sha256(contents).digest())
    return digest.hexdigest()[:32]


def launch_identity(genes: Mapping[str, object], cubins: Mapping[str, bytes]) -> str:
    """What the GPU worker runs: the binaries per dtype plus the genes (they choose the launch geometry)."""
    payload = canonical_json({"genes": dict(genes), "binaries": {dt: identity(b) for dt, b in cubins.items()}})
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def timer_reads(sass: str) -> list[str]:
    """Clock, timer and SM-id special registers the disassembly reads: the backstop behind the static check."""
    return sorted({m.group(0) for m in SASS_TIMER.finditer(sass)})


class SeenBinaries:
    """The first result for each launch identity, so that a binary-identical candidate is answered, not re-run."""

    def __init__(self) -> None:
        self._first: dict[str, EvalResult] = {}

    def reuse(self, candidate_id: str, key: str, build: Mapping[str, BuildInfo]) -> EvalResult | None:
        """The first result under key, as this candidate's (with its own build report), or None."""
        first = self._first.get(key)
        if first is None:
            return None
        return dataclasses.replace(first, candidate_id=candidate_id, gpu_s=0.0, build=dict(build),
                                   message=f"binary-identical to {first.candidate_id}, not re-run")

    def remember(self, key: str, result: EvalResult) -> None:
        self._first.setdefault(key, result)

    def forget(self) -> None:
        """Drop every remembered result: the next evaluation of any binary runs on the GPU again."""
        self._first.clear()
