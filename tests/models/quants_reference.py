"""The NumPy oracle of models/quants.py's compiled ``repack`` (the ``repack_ggml`` kernel).

Integers are read with gguf-py's own unpacking: the block's scales are overwritten so
that ``gguf.quants.dequantize`` returns the integers themselves (d = 1, sc = 1, min = 0),
so no bit layout of a block is written here beyond the fields' byte offsets. Scales and
mins are the products gguf-py computes, in fp32; the zero points are np.rint of dm / s.
"""

from __future__ import annotations

import numpy as np

from dualpath.models import quants
from dualpath.models.quants import NBits

_F16_ONE = np.array([1.0], np.float16).view(np.uint8)  # (2,)


def pack(u: np.ndarray, bits: int) -> np.ndarray:
    """uint8 values (..., block) < 2^bits -> MatMulNBits bytes (..., block * bits / 8)."""
    if bits == 8:
        return np.ascontiguousarray(u, dtype=np.uint8)
    per = 8 // bits
    out = np.zeros(u.shape[:-1] + (u.shape[-1] // per,), np.uint8)
    for i in range(per):
        out |= (u[..., i::per].astype(np.uint8) << np.uint8(bits * i))
    return out


def _ints(blocks: np.ndarray, qtype, patch: dict[tuple[int, int], np.ndarray]) -> np.ndarray:
    """gguf-py's dequantization of ``blocks`` (n, type_size) with byte ranges
    ``(start, stop)`` overwritten."""
    import gguf

    b = blocks.copy()
    for (start, stop), value in patch.items():
        b[:, start:stop] = value
    return gguf.quants.dequantize(b, qtype)  # (n, block)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32)  # (n, 1)


def repack_reference(raw: np.ndarray, type_name: str, shape: tuple[int, int]) -> NBits:
    """What ``quants.repack`` must return for GGML blocks ``raw``, computed with NumPy."""
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    block, type_size = gguf.constants.GGML_QUANT_SIZES[qtype]
    QK = gguf.constants.QK_K
    rows, cols = shape
    blocks = np.asarray(raw, dtype=np.uint8).reshape(-1, type_size)  # (rows * cols / block, type_size)
    one, zero = _F16_ONE, np.zeros(2, np.uint8)

    if type_name in ("Q8_0", "Q5_0", "IQ4_NL", "Q4_0"):
        q = _ints(blocks, qtype, {(0, 2): one})  # d = 1: the signed integers
        bits = 4 if type_name == "Q4_0" else 8
        u = q + (8 if bits == 4 else 128)
        return NBits(bits, block, pack(_u8(u, rows, cols, block), bits), _f16(blocks, 0).reshape(-1))
    if type_name == "Q6_K":
        sc_at = QK // 2 + QK // 4
        q = _ints(blocks, qtype, {(sc_at, sc_at + QK // 16): np.uint8(1), (type_size - 2, type_size): one})
        sc = blocks[:, sc_at:sc_at + QK // 16].view(np.int8).astype(np.float32)  # (n, 16)
        s = _f16(blocks, type_size - 2) * sc
        return NBits(8, 16, _u8(q + 128, rows, cols, 16), s.reshape(-1))
    if type_name == "Q3_K":
        sc_at = QK // 8 + QK // 4
        # 12 scale bytes all meaning sc = 33 (sc - 32 = 1): low nibbles 1, high 2-bit fields 2.
        unit = np.array([0x11] * 8 + [0xAA] * 4, np.uint8)
        q = _ints(blocks, qtype, {(sc_at, sc_at + 12): unit, (type_size - 2, type_size): one})
        # q = 1 everywhere (2-bit fields 01, high-mask bits set): x = d * (sc - 32).
        s = _ints(blocks, qtype, {(0, QK // 8): np.uint8(0xFF), (QK // 8, sc_at): np.uint8(0x55)})[:, ::16]
        return NBits(4, 16, pack(_u8(q + 8, rows, cols, 16), 4), s.reshape(-1))

    # x = s * q - dm: read the unsigned q with scale 1 and min 0, then s and dm.
    if type_name in ("Q4_K", "Q5_K"):
        unit = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1], np.uint8)  # sc = 1, m = 0 for all 8
        q = _ints(blocks, qtype, {(0, 2): one, (2, 4): zero, (4, 16): unit})
        sc, m = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:16].copy())
        s = _f16(blocks, 0) * sc.astype(np.float32)   # (n, 8)
        dm = _f16(blocks, 2) * m.astype(np.float32)   # (n, 8)
        sub = 32
    elif type_name in ("Q4_1", "Q5_1"):
        q = _ints(blocks, qtype, {(0, 2): one, (2, 4): zero})
        s, dm = _f16(blocks, 0), -_f16(blocks, 2)  # x = d * q + m
        sub = block
    elif type_name == "Q2_K":
        q = _ints(blocks, qtype, {(0, QK // 16): np.uint8(0x01), (type_size - 4, type_size - 2): one,
                                  (type_size - 2, type_size): zero})
        sc = blocks[:, :QK // 16]
        s = _f16(blocks, type_size - 4) * (sc & np.uint8(0x0F)).astype(np.float32)   # (n, 16)
        dm = _f16(blocks, type_size - 2) * (sc >> np.uint8(4)).astype(np.float32)    # (n, 16)
        sub = 16
    else:
        raise ValueError(f"no MatMulNBits mapping for {type_name}")
    nb = cols // sub
    s, dm = s.reshape(rows, nb).astype(np.float32), dm.reshape(rows, nb).astype(np.float32)
    u = _u8(q, rows, cols, sub)  # (rows, nb, sub)
    # Integer zero points z = round(dm / s) (in [0, 2^bits - 1]): MatMulNBits computes
    # s * (q - z) ~ x; the rest of x = s * q - dm, i.e. z * s - dm per block (small: at
    # most s / 2 unless dm / s is out of range), is the graph's blocksum correction.
    # 5-bit types take 8 bits (one zero point a byte), the others 4 (two a byte).
    bits = 8 if type_name in quants.MINS_TYPES else 4
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(s != 0, np.rint(dm / np.where(s != 0, s, np.float32(1))), 0)
    z = np.clip(z, 0, 2 ** bits - 1).astype(np.uint8)  # (rows, nb)
    mins = (dm - z.astype(np.float32) * s).astype(np.float32)
    per = 8 // bits
    zp = pack(np.pad(z, ((0, 0), (0, -nb % per))), bits).reshape(-1)  # (rows * ceil(nb / per),)
    return NBits(bits, sub, pack(u, bits), s.reshape(-1), zero_points=zp, mins=mins)


def _u8(values: np.ndarray, rows: int, cols: int, sub: int) -> np.ndarray:
    """Small non-negative integers held in floats -> uint8 (rows, cols / sub, sub)."""
    return np.ascontiguousarray(values.reshape(rows, cols // sub, sub).astype(np.uint8))
