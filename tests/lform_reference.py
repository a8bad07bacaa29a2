"""The 16-row form of csrc/lmatmul.h read back in NumPy, from the layout its header
documents: the oracle the loader's tests check a converted weight against (the C
kernels are checked against dp_repack_ggml's values in tests/c/)."""

import numpy as np

# type -> (values per superblock, header bytes, unit bytes, offset z)
LAYOUT = {"Q4_K": (256, 320, 256, 0), "Q6_K": (256, 288, 384, 32), "Q5_0": (32, 32, 320, 16),
          "Q8_0": (32, 32, 512, 128), "Q4_0": (32, 32, 256, 8)}


def _steps_to_values(v: np.ndarray) -> np.ndarray:
    """(..., 8 steps, 16 rows, 4) -> (..., 16 rows, 32 values): step j holds values 4j..4j+3."""
    return np.moveaxis(v, -2, -3).reshape(*v.shape[:-3], 16, 32)


def dequantize(form: np.ndarray, type_name: str, shape: tuple[int, int]) -> np.ndarray:
    """(N, K) float32 values of a weight in the form, computed as gguf-py dequantizes
    the file's blocks (the same f32 operations in the same order)."""
    N, K = shape
    sb, header, unit, z = LAYOUT[type_name]
    G, nsb, units = N // 16, K // sb, sb // 32
    f = np.asarray(form, np.uint8).reshape(G, nsb, header + units * unit)
    hdr, u = f[..., :header], f[..., header:].reshape(G, nsb, units, unit)
    if type_name == "Q8_0":
        q = _steps_to_values(u[..., :512].reshape(G, nsb, units, 8, 16, 4)).astype(np.int32)
    else:
        nib = u[..., :256].reshape(G, nsb, units, 4, 16, 4)  # chunk c: steps 2c (low), 2c + 1 (high)
        q = _steps_to_values(np.stack([nib & 15, nib >> 4], axis=4).reshape(G, nsb, units, 8, 16, 4))
        q = q.astype(np.int32)
        if type_name == "Q5_0":  # bit 4l + i of word j
            bits = np.unpackbits(u[..., 256:320].reshape(G, nsb, units, 8, 8), axis=-1, bitorder="little")
            q |= _steps_to_values(bits.reshape(G, nsb, units, 8, 16, 4)).astype(np.int32) << 4
        elif type_name == "Q6_K":  # bits 2s..2s+1 of byte 64h + 4l + i: step 4h + s
            p = u[..., 256:384].reshape(G, nsb, units, 2, 1, 16, 4)
            crumbs = (p >> (2 * np.arange(4).reshape(4, 1, 1))) & 3
            q |= _steps_to_values(crumbs.reshape(G, nsb, units, 8, 16, 4)).astype(np.int32) << 4
    d = hdr[..., :32].copy().view(np.float16).astype(np.float32)  # (G, nsb, 16 rows)
    q = q.astype(np.float32)  # (G, nsb, units, 16 rows, 32)
    if type_name == "Q4_K":
        dmin = hdr[..., 32:64].copy().view(np.float16).astype(np.float32)
        sc = hdr[..., 64:192].reshape(G, nsb, 8, 16).astype(np.float32)
        m = hdr[..., 192:320].reshape(G, nsb, 8, 16).astype(np.float32)
        vals = (d[:, :, None, :] * sc)[..., None] * q - (dmin[:, :, None, :] * m)[..., None]
    elif type_name == "Q6_K":
        sc = hdr[..., 32:288].view(np.int8).reshape(G, nsb, 8, 2, 16).astype(np.float32)  # (block, half, row)
        scale = (d[:, :, None, None, :] * sc).transpose(0, 1, 2, 4, 3)  # (G, nsb, block, row, half)
        vals = (np.repeat(scale, 16, axis=-1) * (q - np.float32(z))).astype(np.float32)
    else:
        vals = d[:, :, None, :, None] * (q - np.float32(z))
    # (G, nsb, units, 16 rows, 32) -> (N, K)
    return np.ascontiguousarray(vals.astype(np.float32).transpose(0, 3, 1, 2, 4).reshape(N, K))
