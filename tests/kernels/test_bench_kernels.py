"""`dualpath bench kernels` measures what it says: every layout and both ceilings, each
rate set against the bandwidth measured in the same run."""

from dualpath.bench_kernels import HEAD_DIM, NUM_HEADS, NUM_KV_HEADS, run_kernel_bench


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
        assert abs(r["share_of_bandwidth"] - r["gb_per_s"] / res["bandwidth"][r["threads"]]) < 1e-9
        assert r["query_heads"] in (NUM_HEADS, NUM_KV_HEADS)
    # random pages: one span per 16-token page; sequential: one span
    assert rows[(1, 1000, "random")]["spans"] == 63 and rows[(1, 1000, "sequential")]["spans"] == 1
