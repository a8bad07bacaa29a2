"""``dualpath bench classifier``: the classifier's product in our kernels (``QMatmul``,
csrc/qmatmul.h) beside ONNX Runtime's ``MatMulNBits`` on the same 8-bit weights.

A model whose classifier is an 8-bit table (Q8_0, Q6_K, Q5_0, IQ4_NL) runs it in our
kernels over the cached form, read in place (``ModelSpec.classifier_in_kernels``). This
measures one decode row (1 x K by K x N) both ways, at accuracy level 4 (int8
activations) on the same number of threads, alternating: a bandwidth probe, ours, ONNX
Runtime's, per repeat, so the ratio of each repeat is taken within seconds (this
machine's speed drifts). Our GB/s count the bytes our kernel reads (the values and an
f32 scale a block); ONNX Runtime reads its packed copy, 10.7 or 12.8 bits a value
(docs/performance.md, memory). The default shapes are the classifiers of Gemma 3 270M
(Q8_0), Llama 3.2 1B and Qwen2.5 1.5B (Q6_K, blocks of 16 in our form).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from ..kernels import QMatmul, ThreadPool, default_kernel
from .common import ms_per_call as _ms
from .common import ort_session, write_json

SHAPES = "262144x640/32,128256x2048/16,151936x1536/16"


def _shapes(text: str) -> list[tuple[int, int, int]]:
    out = []
    for item in text.split(","):
        try:
            nk, bs = item.split("/")
            n, k = nk.split("x")
            shape = int(n), int(k), int(bs)
        except ValueError:
            raise ValueError(f"shape {item!r}: write rows x columns / block, e.g. 262144x640/32") from None
        if shape[2] not in (16, 32) or shape[1] % 32 or min(shape) < 1:
            raise ValueError(f"shape {item!r}: the block is 16 or 32 and the columns whole 32s")
        out.append(shape)
    return out


def _ort_session(w: np.ndarray, scales: np.ndarray, threads: int):
    from onnx import TensorProto, helper

    n, nb, bs = w.shape
    node = helper.make_node("MatMulNBits", ["x", "w", "s"], ["y"], domain="com.microsoft", K=nb * bs, N=n,
                            bits=8, block_size=bs, accuracy_level=4)
    graph = helper.make_graph([node], "classifier",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, nb * bs])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
                              initializer=[helper.make_tensor("w", TensorProto.UINT8, w.shape, w.tobytes(), raw=True),
                                           helper.make_tensor("s", TensorProto.FLOAT, scales.shape, scales.tobytes(),
                                                              raw=True)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    return ort_session(model, threads)


def measure(n: int, k: int, bs: int, threads: int, repeats: int, kernel: str | None = None) -> dict:
    """One shape (n rows x k columns in blocks of bs), ours and ONNX Runtime's (see the
    module docstring); ONNX Runtime runs on its global pool where the process has one, as
    a model's graph parts do."""
    rng = np.random.default_rng(0)
    w = rng.integers(0, 256, (n, k // bs, bs), dtype=np.uint8)
    scales = (rng.random(n * k // bs, dtype=np.float32) * 0.01).astype(np.float32)
    x = rng.standard_normal((1, k)).astype(np.float32)
    out = np.zeros((1, n), np.float32)
    pool = ThreadPool(threads)
    ours = QMatmul(w, scales, x, out, kernel)
    sess = _ort_session(w, scales, threads)
    probe = np.ones(max(w.nbytes, 256 << 20) // 8, np.uint64)
    nbytes = w.nbytes + scales.nbytes
    feeds = {"x": x}
    ort_out = sess.run(None, feeds)[0]
    ours.run(1, pool)
    scale = float(np.abs(ort_out).max())
    rows = []
    for _ in range(repeats):
        t = time.perf_counter()
        pool.read(probe)
        bw = probe.nbytes / (time.perf_counter() - t) / 1e9
        a = _ms(lambda: ours.run(1, pool), 5)
        b = _ms(lambda: sess.run(None, feeds), 5)
        rows.append((a, b, bw))
    a = statistics.median(r[0] for r in rows)
    b = statistics.median(r[1] for r in rows)
    return {"rows": n, "cols": k, "block": bs, "threads": threads, "kernel": kernel or default_kernel(),
            "ours_ms": a, "ort_ms": b, "ort_over_ours": statistics.median(r[1] / r[0] for r in rows),
            "ours_gb_per_s": nbytes / a / 1e6, "bandwidth_gb_per_s": statistics.median(r[2] for r in rows),
            "ours_mib": nbytes / (1 << 20),
            "max_abs_diff_rel": float(np.abs(out - ort_out).max() / scale) if scale else 0.0}


def cmd_bench_classifier(args) -> int:
    res = [measure(n, k, bs, args.threads, args.repeats, args.kernel) for n, k, bs in args.shapes]
    print(f"{'shape':>18} {'kernel':>7} {'ours ms':>8} {'ORT ms':>7} {'ORT/ours':>8} {'ours GB/s':>9} "
          f"{'bw GB/s':>7} {'ours MiB':>8} {'max diff':>8}")
    for r in res:
        print(f"{r['rows']:>9}x{r['cols']}/{r['block']:<3} {r['kernel']:>7} {r['ours_ms']:>8.2f} {r['ort_ms']:>7.2f} "
              f"{r['ort_over_ours']:>7.2f}x {r['ours_gb_per_s']:>9.1f} {r['bandwidth_gb_per_s']:>7.1f} "
              f"{r['ours_mib']:>8.1f} {r['max_abs_diff_rel']:>8.1e}")
    print(f"one decode row, {args.threads} threads, medians of {args.repeats} (5 calls each); ORT: MatMulNBits "
          "8 bits, accuracy level 4, over its packed copy; bw: a read of 256 MiB on the same threads; max diff: "
          "largest |ours - ORT| over the largest |ORT|")
    write_json(args.json, res)
    return 0


def add_parser(bs) -> None:
    c = bs.add_parser("classifier", help="the classifier's product in our kernels beside ONNX Runtime's MatMulNBits")
    c.add_argument("--shapes", default=SHAPES, type=_shapes,
                   help=f"rows x columns / block, comma-separated (default {SHAPES}: Gemma 3 270M, Llama 3.2 1B, "
                        "Qwen2.5 1.5B)")
    c.add_argument("-t", "--threads", type=int, default=2)
    c.add_argument("--kernel", help="force a kernel ISA (default: the dispatched one)")
    c.add_argument("-r", "--repeats", type=int, default=9)
    c.add_argument("--json")
    c.set_defaults(func=cmd_bench_classifier)
