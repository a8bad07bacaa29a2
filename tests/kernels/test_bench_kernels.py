"""`dualpath bench kernels` measures what it says: every layout and both ceilings, each
rate set against the bandwidth measured in the same run, and the FMA peak that frames
the arithmetic."""

import statistics

import pytest

from dualpath.bench.kernels import HEAD_DIM, NUM_HEADS, NUM_KV_HEADS, run_kernel_bench
from dualpath.kernels import ThreadPool, available_kernels


def test_rows_cover_layouts_and_ceilings():
    res = run_kernel_bench(contexts=(256, 1000), threads=(1, 2), repeats=1, llc_bytes=1 << 20,
                           cached_context=512, bandwidth_bytes=16 << 20)
    rows = {(r["threads"], r["context"], r["layout"]): r for r in res["rows"]}
    for n in (1, 2):
        assert res["bandwidth"][n] > 0
        for ctx in (256, 1000):
            for layout in ("sequential", "random"):
                assert (n, ctx, layout) in rows
        assert rows[(n, 1000, "1 head/kv")]["query_heads"] == NUM_KV_HEADS  # longest context only
        assert (n, 256, "1 head/kv") not in rows
        assert rows[(n, 512, "cached")]["layers_rotated"] == 1
    for r in res["rows"]:
        kv_bytes = r["context"] * NUM_KV_HEADS * HEAD_DIM * 2 * 2
        assert r["gb_per_s"] > 0
        assert abs(r["gb_per_s"] - kv_bytes / (r["us_per_layer"] * 1e-6) / 1e9) < 1e-6 * r["gb_per_s"]
        # the share is the median over kernel repeats, each against the probe run just before it
        assert len(r["shares"]) == 1 and r["share_of_bandwidth"] == r["shares"][0]
        assert abs(r["share_of_bandwidth"] - r["gb_per_s"] / r["bandwidth_gb_per_s"]) < 1e-9
        assert r["query_heads"] in (NUM_HEADS, NUM_KV_HEADS)
    # random pages: one span per 16-token page; sequential: one span
    assert rows[(1, 1000, "random")]["spans"] == 63 and rows[(1, 1000, "sequential")]["spans"] == 1


def test_q8_rows_count_the_bytes_of_int8_values_and_their_scales():
    res = run_kernel_bench(contexts=(1000,), threads=(1,), repeats=1, llc_bytes=1 << 20, cached_context=512,
                           bandwidth_bytes=16 << 20, kv_dtypes=("f16", "q8"))
    rows = {(r["context"], r["layout"], r["kv_dtype"]): r for r in res["rows"]}
    for layout in ("sequential", "random", "1 head/kv"):
        f16, q8 = rows[(1000, layout, "f16")], rows[(1000, layout, "q8")]
        assert f16["kv_bytes_per_layer"] == 1000 * NUM_KV_HEADS * HEAD_DIM * 2 * 2
        assert q8["kv_bytes_per_layer"] == 1000 * NUM_KV_HEADS * (HEAD_DIM + 4) * 2  # + an f32 scale per row
        expected_gb_per_s = q8["kv_bytes_per_layer"] / (q8["us_per_layer"] * 1e-6) / 1e9
        assert abs(q8["gb_per_s"] - expected_gb_per_s) < 1e-6 * q8["gb_per_s"]
        assert f16["spans"] == q8["spans"]
    assert rows[(512, "cached", "q8")]["layers_rotated"] == 1
    group = NUM_HEADS // NUM_KV_HEADS
    assert res["flops_per_kv_byte"]["f16"] == group
    assert res["flops_per_kv_byte"]["q8"] == pytest.approx(4 * group * HEAD_DIM / (2 * (HEAD_DIM + 4)))


def test_fma_peak_counts_every_thread():
    # flops are counted, not estimated: linear in rounds, one probe per thread, per ISA
    for kernel in available_kernels():
        one = ThreadPool(1).fma(1000, kernel)
        assert one > 0 and one % 1000 == 0
        assert ThreadPool(1).fma(3000, kernel) == 3 * one
        assert ThreadPool(2).fma(1000, kernel) == 2 * one
        assert ThreadPool(1).fma(0, kernel) == 0
    with pytest.raises(ValueError, match="iters"):
        ThreadPool(1).fma(-1)
    with pytest.raises(ValueError, match="not available"):
        ThreadPool(1).fma(10, "sse9")


def test_arithmetic_ceiling_is_fma_peak_over_group():
    res = run_kernel_bench(contexts=(256,), threads=(1,), repeats=3, llc_bytes=1 << 20, ceilings=False,
                           bandwidth_bytes=16 << 20)
    for r in res["rows"]:  # one share per kernel repeat, each against its own probe
        assert len(r["shares"]) == 3 and r["share_of_bandwidth"] == statistics.median(r["shares"])
    group = NUM_HEADS // NUM_KV_HEADS
    assert res["fma_gflops"][1] > 0
    assert res["arithmetic_ceiling_gb_per_s"][1] == res["fma_gflops"][1] / group


def test_every_shape_gets_its_rows_and_its_own_bytes():
    from dualpath.bench.kernels import MHA, Shape

    shapes = (Shape(8, 2, 64), MHA)
    res = run_kernel_bench(contexts=(300,), threads=(1,), repeats=1, llc_bytes=1 << 20, cached_context=256,
                           bandwidth_bytes=16 << 20, shapes=shapes)
    rows = {(r["shape"], r["layout"]): r for r in res["rows"]}
    gqa, mha = rows[("8/2x64", "sequential")], rows[("6/6x48", "sequential")]
    assert gqa["kv_bytes_per_layer"] == 300 * 2 * 64 * 2 * 2 and gqa["query_heads"] == 8
    assert mha["kv_bytes_per_layer"] == 300 * 6 * 48 * 2 * 2 and mha["query_heads"] == 6
    assert ("8/2x64", "1 head/kv") in rows and ("6/6x48", "1 head/kv") not in rows  # MHA: that is the row itself
    assert {("8/2x64", "cached"), ("6/6x48", "cached"), ("6/6x48", "random")} <= set(rows)
    assert res["flops_per_kv_byte_by_shape"]["6/6x48"]["f16"] == 1  # one FMA per f16 value
    assert res["flops_per_kv_byte_by_shape"]["8/2x64"]["f16"] == 4
    with pytest.raises(ValueError, match="multiple"):
        Shape.parse("6/4x64")
