"""GGML block types -> ONNX Runtime ``MatMulNBits`` (domain ``com.microsoft``).

What ``MatMulNBits`` accepts, as the pinned onnxruntime 1.32 CPU provider computes it
(found with one node, A = identity so that Y = W^T shows every dequantized weight;
accuracy_level 0 or 1, K up to 256):

* ``bits`` 2, 4 and 8 all run; ``block_size`` 16, 32, 64 and 128 all run, for each.
* B is uint8 ``(N, K / block_size, block_size * bits / 8)``; within a byte the
  elements come low bits first (4-bit: element 2m in the low nibble of byte m;
  2-bit: element 4m + i in bits 2i..2i+1).
* scales: float32 ``(N * K / block_size,)``.
* No zero points: value = (q - 2^(bits-1)) * scale (offset 2, 8, 128), bit for bit.
* uint8 zero points (packed like B, ``N * ceil(K / block_size * bits / 8)`` bytes):
  value = (q - zp) * scale, bit for bit.
* float zero points (float32 ``(N * K / block_size,)``, the scales' type): value =
  q * scale - zp * scale, each product rounded to fp32 (bit for bit; it is *not*
  (q - zp) * scale, which differs in the last bits). Accepted for 2 and
  4 bits. For 8 bits the CPU provider refuses the model at session creation:
  "MatMulNBits on CPU does not support 8-bit weights with floating-point zero
  points; use uint8 zero points".
* accuracy_level 4 (int8 activations, our default for speed) makes the *product*
  approximate; the mappings below are about the dequantized values, which are the same at any
  accuracy level.

The mappings (x = the value ``gguf.quants.dequantize`` computes, in fp32; q = the
stored integer; s, dm = per-block scale and min, products in fp32 exactly as gguf-py):

=======  ==========================  ============================================  ==========
type     x                           MatMulNBits form                              exactness
=======  ==========================  ============================================  ==========
Q8_0     d * q                       8-bit, block 32, u = q + 128                  exact
Q4_0     d * (n - 8)                 4-bit, block 32, u = n                        exact
Q5_0     d * (q - 16)                8-bit, block 32, u = q + 112                  exact
IQ4_NL   d * kvalues[n]              8-bit, block 32, u = kvalues[n] + 128         exact
Q6_K     (d * sc) * (q - 32)         8-bit, block 16, s = d * sc, u = q + 96       exact
Q3_K     (d * (sc - 32)) * q         4-bit, block 16, s = d * (sc - 32), u = q + 8 exact
Q4_K     (d * sc) * q - dmin * m     4-bit, block 32, u = q, uint8 zero point      exact terms
Q4_1     d * q + m                   z = round(dm / s) in [0, 15] (s * (q - z)),   (at most one
Q2_K     (d * sc) * q - dmin * m     4-bit, block 16, as Q4_K                      rounding of
                                     plus ``mins`` dm - z s (N, K/block): the      dm - z s)
                                     graph subtracts blocksum(x) @ mins^T
Q5_K     (d * sc) * q - dmin * m     8-bit, block 32, as Q4_K with 8-bit zero      as Q4_K
Q5_1     d * q + m                   points z = round(dm / s) in [0, 255]
=======  ==========================  ============================================  ==========

Why not float zero points for Q4_K, Q4_1 and Q2_K (value = q * s - zp * s, which the
CPU provider accepts for 2 and 4 bits): the provider has no fast kernel for them and
dequantizes the matrix on every call, and 2-bit weights in blocks of 16 are as slow
(docs/performance.md); so these types are stored as 4-bit blocks with integer (uint8)
zero points, which are fast, and the per-block remainder dm - z s goes through the same
blocksum correction as Q5_K's mins. The zero point is the nearest integer to dm / s, so
that remainder is small: with int8 activations (accuracy_level 4) only the MatMulNBits
part sees quantized activations, as llama.cpp's dot products do, and a large remainder
(8 * s, with the implicit offset) measurably worsened agreement with llama.cpp on a
Q4_K_M file. The integer part is exact; the min term dm - z s is exact
when it fits fp32 (s and dm have at most 17 significant bits: every random block of
tests/models/test_quants.py), else one rounding. Q2_K's 2-bit values take 4 bits (its
weights double in memory: 2.6 -> 4.6 bits per value with the scales). Q5_K and Q5_1 need 5 bits plus a min (and
8-bit float zero points are refused): they take 8 bits, with uint8 zero points the same
way (one a byte).

The conversion is compiled code (``repack_ggml``, cython_ext/csrc/ggml_repack.c: the
block layouts, the fp32 products and the zero points z rounded half to even, as here).
Its oracle lives with the tests (tests/models/quants_reference.py): gguf-py's own
dequantization of each block with its scales overwritten (d = 1, sc = 1, min = 0), so
that it returns the integers themselves; the two agree byte for byte.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..kernels import GGML_TYPES, LFORM_TYPES, ggml_layout, lform_bytes, lform_from_ggml, repack_ggml

EXACT_TYPES = ("Q8_0", "Q4_0", "Q5_0", "IQ4_NL", "Q6_K", "Q3_K")
OFFSET_MIN_TYPES = ("Q4_K", "Q4_1", "Q2_K")
"""4-bit with integer zero points, the remainder of the min as ``mins``."""
MINS_TYPES = ("Q5_K", "Q5_1")
"""The same with 8 bits (5-bit values)."""
NBITS_TYPES = GGML_TYPES
"""The types ``repack`` converts: csrc/ggml_repack.c's table (the groups above cover it)."""

@dataclass
class NBits:
    """One weight in MatMulNBits form (see the module docstring)."""

    bits: int
    block_size: int
    blob: np.ndarray
    """uint8 (rows, cols / block_size, block_size * bits / 8)."""
    scales: np.ndarray
    """float32 (rows * cols / block_size,)."""
    zero_points: np.ndarray | None = None
    """uint8 (rows * ceil(cols / block_size * bits / 8),), packed like ``blob``, each row
    padded to whole bytes; or None (offset 2^(bits-1))."""
    mins: np.ndarray | None = None
    """float32 (rows, cols / block_size): subtracted as blocksum(x) @ mins^T, or None."""


def block_size(type_name: str) -> int:
    """Values per GGML block of ``type_name`` (csrc/ggml_repack.c's table)."""
    return ggml_layout(type_name)["block"]


def unpack(blob: np.ndarray, bits: int) -> np.ndarray:
    """MatMulNBits bytes (..., block * bits / 8) -> uint8 values (..., block)."""
    if bits == 8:
        return blob
    per = 8 // bits
    out = np.empty(blob.shape[:-1] + (blob.shape[-1] * per,), np.uint8)
    for i in range(per):
        out[..., i::per] = (blob >> np.uint8(bits * i)) & np.uint8((1 << bits) - 1)
    return out


def dequantize(w: NBits, shape: tuple[int, int]) -> np.ndarray:
    """The float32 ``shape`` matrix ONNX Runtime computes with (the formulas above)."""
    out = np.empty(shape, np.float32)
    gather_rows(w.blob, w.scales, w.zero_points, w.mins, w.bits, w.block_size, np.arange(shape[0]), out)
    return out


def repack(raw: np.ndarray, type_name: str, shape: tuple[int, int]) -> NBits:
    """GGML blocks ``raw`` (uint8, any shape holding ``shape``'s bytes) -> NBits.

    ``shape[1]`` must be a multiple of the type's block (checked by the caller)."""
    layout = ggml_layout(type_name)
    bits, sub = layout["bits"], layout["block_size"]
    rows, cols = shape
    nb = cols // sub
    blob = np.empty((rows, nb, sub * bits // 8), np.uint8)
    scales = np.empty(rows * nb, np.float32)
    zero_points = mins = None
    if layout["zero_points"]:  # uint8, each row padded to whole bytes; mins (rows, nb)
        zero_points, mins = np.empty(rows * (-(-nb * bits // 8)), np.uint8), np.empty((rows, nb), np.float32)
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    repack_ggml(raw, type_name, (rows, cols), blob, scales, zero_points, mins)
    return NBits(bits, sub, blob, scales, zero_points=zero_points, mins=mins)


def gather_rows(blob: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, mins: np.ndarray | None,
                bits: int, block_size: int, ids: np.ndarray, out: np.ndarray) -> None:
    """Rows ``ids`` (T,) of a MatMulNBits weight (blob (rows, nb, block * bits / 8)),
    dequantized as ONNX Runtime computes them, into ``out`` (T, cols) f32: (q - zp) * s
    - mins per block. The embedding lookup of a quantized ``token_embd`` (a few NumPy
    calls per step) and, over every row, ``dequantize``."""
    rows, nb = blob.shape[0], blob.shape[1]
    u = unpack(blob[ids], bits).astype(np.float32)                       # (T, nb, block)
    if zero_points is None:
        u -= np.float32(2 ** (bits - 1))
    else:  # uint8, packed like the blob, each row padded to whole bytes
        zp = unpack(zero_points.reshape(rows, -1)[ids], bits)[:, :nb]
        u -= zp[:, :, None].astype(np.float32)
    u *= scales.reshape(rows, nb)[ids][:, :, None]
    if mins is not None:
        u -= mins[ids][:, :, None]
    out[:len(ids)] = u.reshape(len(ids), -1)


KERNEL_MATRICES = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
"""A layer's matrices that our kernels multiply when their type has a form (``kernel_form``)."""


def kernel_form(key: str, type_name: str, shape: tuple[int, ...], classifier: bool = False) -> bool:
    """Whether weight ``key`` (``blk.3.ffn_up``) of GGML ``type_name`` and ``shape`` (out, in)
    is kept in the 16-row form our kernels multiply (csrc/lmatmul.h): a layer's matrix, or the
    ``classifier`` (``output``, or the ``token_embd`` tied to it), of Q4_K, Q6_K, Q5_0, Q8_0
    or Q4_0 whose rows are whole groups of 16. ONNX Runtime packs those types at 7-13.5 bits
    a value against the file's 4.5-8.5, and our 8-bit classifier form took 9-10
    (docs/performance.md)."""
    parts = key.split(".")
    named = classifier or (len(parts) == 3 and parts[0] == "blk" and parts[2] in KERNEL_MATRICES)
    return (named and type_name in LFORM_TYPES and len(shape) == 2
            and lform_bytes(type_name, shape[0], shape[1]) > 0)


FORM_THREADS_BYTES = 4 << 20
"""A weight's form at least this large is made by several threads (its groups of 16 rows
split between them; ``lform_from_ggml`` releases the GIL): on one core this step was most of
a first load's conversion (docs/performance-log.md, figures moved from code comments)."""


def to_kernel_form(raw: np.ndarray, type_name: str, shape: tuple[int, int]) -> np.ndarray:
    """The file's blocks of a ``kernel_form`` weight rearranged into that form (uint8, 1-D)."""
    n, k = shape
    out = np.empty(lform_bytes(type_name, n, k), np.uint8)
    src = np.ascontiguousarray(raw, np.uint8).reshape(-1)
    groups = n // 16
    parts = min(os.cpu_count() or 1, 4, groups) if out.nbytes >= FORM_THREADS_BYTES else 1
    if parts <= 1:
        lform_from_ggml(src, type_name, shape, out)
        return out
    row_bytes, group_bytes = src.nbytes // n, out.nbytes // groups
    cuts = [groups * i // parts for i in range(parts + 1)]

    def part(i: int) -> None:
        g0, g1 = cuts[i], cuts[i + 1]
        lform_from_ggml(src[16 * g0 * row_bytes:16 * g1 * row_bytes], type_name, (16 * (g1 - g0), k),
                        out[g0 * group_bytes:g1 * group_bytes])

    with ThreadPoolExecutor(parts) as ex:
        list(ex.map(part, range(parts)))  # (list: a part's error is raised here)
    return out
