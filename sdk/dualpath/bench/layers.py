"""``dualpath bench layers``: a layer's products in our kernels (``LMatmul`` over the
16-row form of the file's blocks, csrc/lmatmul.h) beside ONNX Runtime's ``MatMulNBits``
over its packed copy of the same weights, as the graphs ran them before.

For each matrix of one layer of the file whose type our kernels take
(``quants.kernel_form``), one decode row (1 x K by K x N) and one prefill chunk (``--rows``
rows) both ways, at accuracy level 4 (int8 activations) on the same threads, alternating
ours and ONNX Runtime's per repeat so that each repeat's ratio is taken within seconds
(this machine's speed drifts). ONNX Runtime's graph is what the builder made for such a
matrix: MatMulNBits, and for the types with mins (Q4_K) the block sums of x times the
mins subtracted (``builder.linear``). Our GB/s count the form's bytes (the file's bits).

A matrix of one layer fits in the last-level cache, so the repeated decode row reads it
from there. The streamed figure runs the decode row over copies of the form
(``STREAM_BYTES`` of them) in turn, each read from DRAM as a decode step reads its layers.
"""

from __future__ import annotations

import statistics

import numpy as np

from ..kernels import LMatmul, ThreadPool, default_kernel
from .common import ms_per_call as _ms
from .common import ort_session, write_json


def _ort_session(nb, shape: tuple[int, int], threads: int):
    """MatMulNBits over ``nb`` (quants.NBits), with the mins' correction where it has mins."""
    from onnx import TensorProto, helper, numpy_helper

    n, k = shape
    bs = nb.block_size
    inputs = ["x", "w", "s"] + (["z"] if nb.zero_points is not None else [])
    inits = [numpy_helper.from_array(nb.blob.reshape(n, k // bs, -1), "w"), numpy_helper.from_array(nb.scales, "s")]
    if nb.zero_points is not None:
        inits.append(numpy_helper.from_array(nb.zero_points, "z"))
    y = "y0" if nb.mins is not None else "y"
    nodes = [helper.make_node("MatMulNBits", inputs, [y], domain="com.microsoft", K=k, N=n, bits=nb.bits,
                              block_size=bs, accuracy_level=4)]
    if nb.mins is not None:  # y0 - blocksum(x) @ mins^T, as builder.linear
        inits += [numpy_helper.from_array(np.array([0, k // bs, bs], np.int64), "shape"),
                  numpy_helper.from_array(np.array([2], np.int64), "axes"),
                  numpy_helper.from_array(np.ascontiguousarray(nb.mins, np.float32), "mins")]
        nodes += [helper.make_node("Reshape", ["x", "shape"], ["xb"]),
                  helper.make_node("ReduceSum", ["xb", "axes"], ["xs"], keepdims=0),
                  helper.make_node("Gemm", ["xs", "mins", "y0"], ["y"], transB=1, alpha=-1.0, beta=1.0)]
    graph = helper.make_graph(nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["R", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["R", n])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    return ort_session(model, threads)


def layer_matrices(path: str, layer: int | None) -> tuple[int, list]:
    """(layer, [(name, GGML type, (N, K), raw blocks)]) of the file's matrices our kernels
    take, in layer ``layer`` (None: the middle one)."""
    import gguf

    from ..models.quants import kernel_form

    reader = gguf.GGUFReader(path)
    layers = {int(t.name.split(".")[1]) for t in reader.tensors if t.name.startswith("blk.")}
    if not layers:
        raise ValueError(f"{path} has no layers (blk.N tensors)")
    layer = sorted(layers)[len(layers) // 2] if layer is None else layer
    if layer not in layers:
        raise ValueError(f"layer {layer} is not in {path} (it has 0..{max(layers)})")
    out = []
    for t in reader.tensors:
        key = t.name.removesuffix(".weight")
        shape = tuple(int(x) for x in reversed([int(n) for n in t.shape]))
        if key.startswith(f"blk.{layer}.") and kernel_form(key, t.tensor_type.name, shape):
            out.append((key, t.tensor_type.name, shape, np.asarray(t.data, np.uint8).reshape(-1)))
    return layer, out


STREAM_BYTES = 128 << 20
"""Bytes of the copies a streamed decode row runs through: several times a laptop's or a
server's last-level cache, so every row comes from DRAM."""


def _streamed_ms(type_name: str, form: np.ndarray, x: np.ndarray, n: int, pool, repeats: int,
                 kernel: str | None, stream_bytes: int) -> float:
    """Median ms of one decode row over each of enough copies of ``form`` to fill
    ``stream_bytes``, run in turn (each from DRAM, as a decode step's layers)."""
    out = np.zeros((1, n), np.float32)
    copies = max(2, -(-stream_bytes // form.nbytes))
    mms = [LMatmul([(type_name, form.copy(), out)], x, kernel) for _ in range(copies)]

    def once() -> None:
        for mm in mms:
            mm.run(1, pool)

    once()
    return statistics.median(_ms(once, 1) for _ in range(repeats)) / copies


def measure(name: str, type_name: str, shape: tuple[int, int], raw: np.ndarray, rows: int, threads: int,
            repeats: int, kernel: str | None = None, stream_bytes: int = STREAM_BYTES) -> dict:
    """One matrix, one row count: ours and ONNX Runtime's (see the module docstring); for
    one row, ours streamed too."""
    from ..models.quants import repack, to_kernel_form

    n, k = shape
    form = to_kernel_form(raw, type_name, shape)
    sess = _ort_session(repack(raw, type_name, shape), shape, threads)
    x = np.random.default_rng(0).standard_normal((rows, k)).astype(np.float32)
    out = np.zeros((rows, n), np.float32)
    pool = ThreadPool(threads)
    ours = LMatmul([(type_name, form, out)], x, kernel)
    feeds = {"x": x}
    theirs = sess.run(None, feeds)[0]
    ours.run(rows, pool)
    scale = float(np.abs(theirs).max())
    inner = 20 if rows == 1 else 3
    times = [(_ms(lambda: ours.run(rows, pool), inner), _ms(lambda: sess.run(None, feeds), inner))
             for _ in range(repeats)]
    a = statistics.median(t[0] for t in times)
    streamed = _streamed_ms(type_name, form, x, n, pool, repeats, kernel, stream_bytes) if rows == 1 else None
    return {"matrix": name, "type": type_name, "rows": n, "cols": k, "act_rows": rows, "threads": threads,
            "kernel": kernel or default_kernel(), "ours_ms": a, "ort_ms": statistics.median(t[1] for t in times),
            "ort_over_ours": statistics.median(t[1] / t[0] for t in times), "ours_mib": form.nbytes / (1 << 20),
            "file_mib": raw.nbytes / (1 << 20), "ours_gb_per_s": form.nbytes / a / 1e6,
            "streamed_ms": streamed, "streamed_gb_per_s": form.nbytes / streamed / 1e6 if streamed else None,
            "max_abs_diff_rel": float(np.abs(out - theirs).max() / scale) if scale else 0.0}


def cmd_bench_layers(args) -> int:
    layer, mats = layer_matrices(args.model, args.layer)
    if not mats:
        print(f"layer {layer} of {args.model} has no matrix of a type our kernels take")
        return 1
    res = [measure(name, t, shape, raw, rows, args.threads, args.repeats, args.kernel)
           for name, t, shape, raw in mats for rows in (1, args.rows)]
    print(f"{'matrix':>22} {'type':>5} {'N x K':>12} {'rows':>5} {'ours ms':>8} {'ORT ms':>7} {'ORT/ours':>8} "
          f"{'ours GB/s':>9} {'streamed':>8} {'MiB':>6} {'max diff':>8}")
    for r in res:
        streamed = f"{r['streamed_gb_per_s']:>8.1f}" if r["streamed_gb_per_s"] else f"{'':>8}"
        print(f"{r['matrix']:>22} {r['type']:>5} {r['rows']:>6}x{r['cols']:<5} {r['act_rows']:>5} "
              f"{r['ours_ms']:>8.3f} {r['ort_ms']:>7.3f} {r['ort_over_ours']:>7.2f}x {r['ours_gb_per_s']:>9.1f} "
              f"{streamed} {r['ours_mib']:>6.2f} {r['max_abs_diff_rel']:>8.1e}")
    print(f"layer {layer}, {args.threads} threads, kernel {res[0]['kernel']}, medians of {args.repeats}; ORT: "
          "MatMulNBits at accuracy level 4 over its packed copy (with the mins' Gemm for Q4_K); streamed: ours, "
          f"GB/s, over {STREAM_BYTES >> 20} MiB of copies in turn (from DRAM); MiB: our form (the file's bytes); "
          "max diff: largest |ours - ORT| over the largest |ORT|")
    write_json(args.json, res)
    return 0


def add_parser(bs) -> None:
    c = bs.add_parser("layers", help="a layer's products in our kernels beside ONNX Runtime's MatMulNBits")
    c.add_argument("-m", "--model", required=True, help="a GGUF file")
    c.add_argument("--layer", type=int, help="which layer (default: the middle one)")
    c.add_argument("--rows", type=int, default=128, help="rows of the prefill-shaped product (default 128)")
    c.add_argument("-t", "--threads", type=int, default=2)
    c.add_argument("--kernel", help="force a kernel ISA (default: the dispatched one)")
    c.add_argument("-r", "--repeats", type=int, default=5)
    c.add_argument("--json")
    c.set_defaults(func=cmd_bench_layers)
