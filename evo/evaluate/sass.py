"""Facts from the binary: disassemble a cubin (cuobjdump, from the CUDA toolkit or its pip wheel) and count the
SASS instructions, so that a genome's PTX choices can be checked against what the compiler really emitted."""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


class SassUnavailable(RuntimeError):
    """No cuobjdump on this machine (pip install nvidia-cuda-cuobjdump)."""


def tool(name: str) -> str:
    """cuobjdump or nvdisasm: from the pip wheels (nvidia-cuda-cuobjdump/-nvdisasm) or a system CUDA toolkit."""
    import cuda.pathfinder as pathfinder
    for path in (pathfinder.find_nvidia_binary_utility(name), f"/usr/local/cuda/bin/{name}"):
        if path and Path(path).is_file():
            return path
    raise SassUnavailable(f"{name} not found; install nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm")


def disassemble(cubin: bytes) -> str:
    # cuobjdump runs nvdisasm for SASS; the wheels do not put it on PATH, so name it explicitly.
    env = {**os.environ, "NVDISASM_PATH": str(Path(tool("nvdisasm")).parent)}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        out = subprocess.run([tool("cuobjdump"), "--dump-sass", fh.name], capture_output=True, text=True,
                             timeout=60, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"cuobjdump failed: {out.stderr.strip()}")
    return out.stdout


def opcodes(sass: str) -> Counter:
    """Instruction mnemonics with modifiers (e.g. 'LDG.E.128.CONSTANT') and how often each occurs."""
    return Counter(m.group(1) for m in OPCODE.finditer(sass))
