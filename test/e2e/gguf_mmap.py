"""A GGUF v3 writer and a lazy mmap reader of F32 tensors, the way llama.cpp
and gguf-py read: map the whole file, parse the header through the mapping,
and hand out tensors as views of it (bytes fault in when touched).

Kept here, not the `gguf` package, because the tests need only F32 tensors
and two metadata keys; the layout follows the GGUF spec (ggml docs/gguf.md):
magic, version 3, tensor and key counts, key/values, tensor infos (name,
dims in ggml order, type, offset from the data start), padding to
general.alignment, then each tensor padded to the alignment."""

import mmap
import struct

import numpy as np

GGML_F32 = 0
T_UINT32, T_STRING = 4, 8


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write(path, tensors, alignment: int = 32) -> None:
    """Write [(name, float32 ndarray)] as a GGUF file."""
    kv = _str("general.architecture") + struct.pack("<I", T_STRING) + _str("test")
    kv += _str("general.alignment") + struct.pack("<II", T_UINT32, alignment)
    info, off = b"", 0
    for name, a in tensors:
        assert a.dtype == np.float32
        info += _str(name) + struct.pack("<I", a.ndim) + b"".join(struct.pack("<Q", d) for d in a.shape[::-1])
        info += struct.pack("<IQ", GGML_F32, off)
        off += -(-a.nbytes // alignment) * alignment
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 2) + kv + info
    head += b"\0" * (-len(head) % alignment)
    with open(path, "wb") as f:
        f.write(head)
        for _, a in tensors:
            f.write(a.tobytes())
            f.write(b"\0" * (-a.nbytes % alignment))


def open_mmap(path) -> dict:
    """{name: read-only ndarray view of a private mapping of the file}."""
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, m, pos)
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        (n,) = take("<Q")
        s = m[pos:pos + n].decode()
        pos += n
        return s

    if m[:4] != b"GGUF":
        raise ValueError("not a GGUF file")
    pos = 4
    version, n_tensors, n_kv = take("<IQQ")
    if version != 3:
        raise ValueError(f"GGUF version {version}")
    alignment = 32
    for _ in range(n_kv):
        key = string()
        (typ,) = take("<I")
        if typ == T_STRING:
            val = string()
        elif typ == T_UINT32:
            (val,) = take("<I")
        else:
            raise ValueError(f"metadata type {typ} not supported here")
        if key == "general.alignment":
            alignment = val
    infos = []
    for _ in range(n_tensors):
        name = string()
        (nd,) = take("<I")
        dims = take(f"<{nd}Q")
        typ, off = take("<IQ")
        if typ != GGML_F32:
            raise ValueError(f"tensor {name}: type {typ} not supported here")
        infos.append((name, tuple(dims[::-1]), off))
    base = -(-pos // alignment) * alignment
    return {name: np.frombuffer(m, dtype=np.float32, count=int(np.prod(shape)), offset=base + off).reshape(shape)
            for name, shape, off in infos}
