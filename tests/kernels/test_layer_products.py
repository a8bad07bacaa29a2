"""A layer's products in our kernels (``kernels.LMatmul`` over csrc/lmatmul.h's form),
through the Python door: every kind against the form read back in NumPy
(tests/lform_reference.py) times the activations, on every ISA this CPU has, and the
refusals a caller can meet. The C parity test (tests/c/test_kernels.c) covers the ISAs
against a double-precision reference in detail."""

import numpy as np
import pytest

from dualpath.kernels import (
    LFORM_TYPES,
    LMatmul,
    ThreadPool,
    available_kernels,
    lform_bytes,
    lform_from_ggml,
    lform_rows,
)
from lform_reference import LAYOUT, dequantize

GGML_BYTES = {"Q4_K": 144, "Q6_K": 210, "Q5_0": 22, "Q8_0": 34, "Q4_0": 18}


def random_blocks(type_name: str, n: int, k: int, seed: int) -> np.ndarray:
    """Random GGML blocks of an (n, k) weight whose fp16 fields are finite and modest."""
    sb, size = LAYOUT[type_name][0], GGML_BYTES[type_name]
    raw = np.random.default_rng(seed).integers(0, 256, n * k // sb * size, dtype=np.uint8).reshape(-1, size)
    raw[:, 1::2] &= 0x3B  # every odd byte: a half's high byte (exponent below 15) where it is one
    return raw.reshape(-1)


def quantized(x: np.ndarray, block: int = 32) -> np.ndarray:
    """x as the kernels see it at int8: per block of 32 (or 256: ``LMatmul.per_256``),
    d = max|x| / 127, round half even."""
    b = x.reshape(x.shape[0], -1, block)
    d = np.abs(b).max(axis=2, keepdims=True) / np.float32(127)
    q = np.rint(b / np.where(d > 0, d, 1)).clip(-127, 127)
    return (q * d).reshape(x.shape).astype(np.float64)


@pytest.mark.parametrize("type_name", LFORM_TYPES)
@pytest.mark.parametrize("rows", [1, 5])
def test_every_kind_and_isa_multiplies_the_file_values(type_name, rows):
    n, k = 48, LAYOUT[type_name][0] * 2
    raw = random_blocks(type_name, n, k, seed=rows)
    form = np.empty(lform_bytes(type_name, n, k), np.uint8)
    lform_from_ggml(raw, type_name, (n, k), form)
    w = dequantize(form, type_name, (n, k)).astype(np.float64)
    x = np.random.default_rng(7).standard_normal((rows, k)).astype(np.float32)
    pool = ThreadPool(2)
    per_256 = []
    for int8 in (True, False):
        for kernel in available_kernels():
            out = np.full((rows, n), -7.0, np.float32)
            product = LMatmul([(type_name, form, out)], x, kernel, int8)
            product.run(rows, pool)
            per_256.append(product.per_256(rows))
            a = quantized(x, 256 if per_256[-1] else 32) if int8 else x.astype(np.float64)
            ref, mag = a @ w.T, np.abs(a) @ np.abs(w).T
            assert np.all(np.abs(out - ref) <= 2e-6 * mag + 1e-6), (kernel, int8)
    # one scale per 256 only for a prefill of Q4_K on the ISA that folds its scales (AVX2's)
    folds = {"avx2"} & set(available_kernels())
    assert sum(per_256) == (len(folds) if type_name == "Q4_K" and rows > 1 else 0)


def awkward_rows(rows: int, k: int, seed: int) -> np.ndarray:
    """(rows, k) f32 whose blocks of 32 probe the int8 quantization: random at scales from
    2^-100 to 2^100, exact ties (d a power of two, so x / d = m + 0.5), zeros and -0, the
    largest floats, and blocks whose d is subnormal."""
    rng = np.random.default_rng(seed)
    u = rng.uniform(-1, 1, (rows * k // 32, 32)).astype(np.float32)
    scale = np.ldexp(np.float32(1), rng.integers(-100, 100, len(u))).astype(np.float32)[:, None]
    ties = np.rint(u * 126) + np.where(u > 0, 0.5, -0.5).astype(np.float32)
    ties[:, 0] = 127
    signed_zeros = np.broadcast_to(np.where(np.arange(32) % 3, 0.0, -0.0).astype(np.float32), u.shape)
    kinds = (np.arange(len(u)) % 6)[:, None]
    choices = [u * scale, ties * scale, signed_zeros, u * np.float32(3.4e38), u * np.float32(1e-36), u]
    b = np.select([kinds == i for i in range(6)], choices)
    return b.reshape(rows, k).astype(np.float32)


def test_every_isas_int8_activations_are_the_rounded_f32_values():
    # An identity Q8_0 weight (d = 1, q = 1 on the diagonal) reads back d x q of every value:
    # d = max|x| / 127 and q = rint(x x (1 / d)) in f32, ties to even, as the reference does.
    rows, k = 1501, 32  # 47 KB of activations a task: quantized on the pool in 4 tasks
    raw = np.zeros((k, 34), np.uint8)
    raw[:, :2] = np.frombuffer(np.float16(1).tobytes(), np.uint8)
    raw[np.arange(k), 2 + np.arange(k)] = 1
    form = np.empty(lform_bytes("Q8_0", k, k), np.uint8)
    lform_from_ggml(raw.reshape(-1), "Q8_0", (k, k), form)
    x = awkward_rows(rows, k, seed=5)
    d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    want = d * np.rint(x * inv)
    pool = ThreadPool(2)
    for kernel in available_kernels():
        out = np.full((rows, k), -7.0, np.float32)
        LMatmul([("Q8_0", form, out)], x, kernel).run(rows, pool)
        np.testing.assert_array_equal(out, want, err_msg=kernel)


@pytest.mark.parametrize("type_name", ["Q4_K", "Q8_0"])
def test_products_quantized_on_the_pool_equal_the_callers(type_name):
    rows, n, k = 41, 64, 2048  # 328 KB of activations: tasks of 8 rows, the last of 1
    form = np.empty(lform_bytes(type_name, n, k), np.uint8)
    lform_from_ggml(random_blocks(type_name, n, k, seed=9), type_name, (n, k), form)
    x = awkward_rows(rows, k, seed=6)
    x = np.clip(x, -1e30, 1e30)  # finite outputs: no block of 3.4e38 times a weight
    pool = ThreadPool(2)
    for kernel in available_kernels():
        on_pool, on_caller = (np.full((rows, n), -7.0, np.float32) for _ in range(2))
        LMatmul([(type_name, form, on_pool)], x, kernel).run(rows, pool)
        LMatmul([(type_name, form, on_caller)], x, kernel).run(rows)
        assert np.isfinite(on_pool).all()
        np.testing.assert_array_equal(on_pool.view(np.uint32), on_caller.view(np.uint32), err_msg=kernel)


def test_weights_of_one_input_write_their_own_outputs_and_columns_of_a_wider_array():
    k = 256
    forms = {}
    for t, n in (("Q4_K", 32), ("Q8_0", 16)):
        forms[t] = np.empty(lform_bytes(t, n, k), np.uint8)
        lform_from_ggml(random_blocks(t, n, k, seed=n), t, (n, k), forms[t])
    x = np.random.default_rng(3).standard_normal((3, k)).astype(np.float32)
    wide = np.zeros((3, 64), np.float32)
    a, b = wide[:, :32], wide[:, 40:56]  # views: rows strided, values contiguous
    LMatmul([("Q4_K", forms["Q4_K"], a), ("Q8_0", forms["Q8_0"], b)], x).run(3)
    alone = np.zeros((3, 32), np.float32)
    LMatmul([("Q4_K", forms["Q4_K"], alone)], x).run(3)
    np.testing.assert_array_equal(a, alone)
    assert np.abs(b).sum() > 0 and not wide[:, 32:40].any() and not wide[:, 56:].any()


def test_reading_the_next_products_weights_ahead_changes_no_output_and_keeps_them_alive():
    """``read_ahead``: after each run on a pool its workers read the following product's
    first weight (up to the bytes asked) while they wait: the outputs stay the bits of a
    run without it, and the pool keeps those weights alive when nothing else does."""
    n, k = 256, 512
    forms = {}
    for t in ("Q4_K", "Q8_0"):
        forms[t] = np.empty(lform_bytes(t, n, k), np.uint8)
        lform_from_ggml(random_blocks(t, n, k, seed=len(t)), t, (n, k), forms[t])
    x = np.random.default_rng(4).standard_normal((1, k)).astype(np.float32)
    outs = {t: np.zeros((1, n), np.float32) for t in forms}
    first = LMatmul([("Q4_K", forms["Q4_K"], outs["Q4_K"])], x)
    second = LMatmul([("Q8_0", forms["Q8_0"], outs["Q8_0"])], x)
    alone = np.zeros((1, n), np.float32)
    LMatmul([("Q4_K", forms["Q4_K"], alone)], x).run(1)
    assert first.read_ahead_bytes == 0
    first.read_ahead(second, 1 << 20)
    assert first.read_ahead_bytes == forms["Q8_0"].nbytes  # the whole weight: smaller than asked
    first.read_ahead(second, 4096)
    assert first.read_ahead_bytes == 4096
    pool = ThreadPool(2)
    first.read_ahead(second, 1 << 20)
    del second, forms["Q8_0"]  # only first (and then the pool) holds the Q8_0 form now
    for _ in range(50):
        first.run(1, pool)
        np.testing.assert_array_equal(outs["Q4_K"], alone)
    first.read_ahead(None, 0)
    assert first.read_ahead_bytes == 0
    first.run(1, pool)  # the pool's region replaced by none: nothing left to read
    np.testing.assert_array_equal(outs["Q4_K"], alone)


def test_bad_products_are_refused_with_the_reason():
    k, n = 256, 16
    form = np.empty(lform_bytes("Q4_K", n, k), np.uint8)
    lform_from_ggml(random_blocks("Q4_K", n, k, 1), "Q4_K", (n, k), form)
    x, out = np.zeros((2, k), np.float32), np.zeros((2, n), np.float32)
    with pytest.raises(ValueError, match="no layer-product form"):
        LMatmul([("Q5_K", form, out)], x)
    with pytest.raises(ValueError, match="is not 16 x 256"):
        LMatmul([("Q4_K", form[:-1], out)], x)
    with pytest.raises(ValueError, match="writeable rows"):
        LMatmul([("Q4_K", form, np.zeros((3, n), np.float32))], x)
    with pytest.raises(ValueError, match="1 to 8"):
        LMatmul([("Q4_K", form, out)] * 9, x)
    mm = LMatmul([("Q4_K", form, out)], x)
    with pytest.raises(ValueError, match="outside 1..2"):
        mm.run(3)
    with pytest.raises(ValueError, match="multiple of 16"):
        lform_from_ggml(random_blocks("Q4_K", 24, k, 1), "Q4_K", (24, k), np.empty(10**5, np.uint8))
    with pytest.raises(ValueError, match="raw blocks or out"):  # the file's bytes cut short
        lform_from_ggml(random_blocks("Q4_K", n, k, 1)[:-1], "Q4_K", (n, k), np.empty(form.size, np.uint8))
    assert lform_bytes("Q6_K", 16, 32) == 0  # not whole superblocks


@pytest.mark.parametrize("type_name", LFORM_TYPES)
def test_a_tied_tables_rows_read_from_the_form_are_the_file_values(type_name):
    n, k = 64, LAYOUT[type_name][0]
    form = np.empty(lform_bytes(type_name, n, k), np.uint8)
    lform_from_ggml(random_blocks(type_name, n, k, seed=11), type_name, (n, k), form)
    ids = np.array([0, 17, 63, 17, 40], np.int64)
    out = np.zeros((len(ids), k), np.float32)
    lform_rows(form, type_name, (n, k), ids, out)
    want = dequantize(form, type_name, (n, k))[ids]
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
    before = out.copy()
    with pytest.raises(IndexError, match="token id 64 outside the table's 64 rows"):
        lform_rows(form, type_name, (n, k), np.array([3, 64], np.int64), out)
    assert np.array_equal(out, before)  # nothing written
