"""Facts from the binary: disassemble a cubin (cuobjdump, from the CUDA toolkit or its pip wheel) and count the
SASS instructions, so that a genome's PTX choices can be checked against what the compiler really emitted."""
from __future__ import annotations

import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


class SassUnavailable(RuntimeError):
    """No cuobjdump on this machine (pip install nvidia-cuda-cuobjdump)."""


def cuobjdump() -> str:
    import cuda.pathfinder as pathfinder
    for path in (pathfinder.find_nvidia_binary_utility("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"):
        if path and Path(path).is_file():
            return path
    raise SassUnavailable("cuobjdump not found; install nvidia-cuda-cuobjdump")


def disassemble(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        out = subprocess.run([cuobjdump(), "--dump-sass", fh.name], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"cuobjdump failed: {out.stderr.strip()}")
    return out.stdout


def opcodes(sass: str) -> Counter:
    """Instruction mnemonics with modifiers (e.g. 'LDG.E.128.CONSTANT') and how often each occurs."""
    return Counter(m.group(1) for m in OPCODE.finditer(sass))
