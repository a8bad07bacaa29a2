"""What one step of the runner reads and writes: its buffers, allocated once (the plan's
arrays, laid out by the scheduler, and the activations), the IOBindings of the ONNX parts over them, the
token embedding, and our attention kernels' stepper between the parts.

A step's rows are the sequences' new tokens back to back (T of them); R rows of those
want logits. Every buffer is sized for the largest step (``max_step_tokens`` tokens,
``max_num_seqs`` sequences) and never moves, so a step allocates no Python objects per
layer and nothing is rebound but the sizes that changed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..kernels import ArenaStepper, LMatmul, QMatmul, lform_rows, read_rows
from ..kernels import embed as _embed
from ..models.quants import gather_rows
from ..models.spec import ModelConfig, ModelSpec, Weight
from ..platform.topology import smallest_l2_bytes
from ..scheduler.step import StepArrays
from .ort_sessions import SessionSet, can_unidle


class StepBuffers:
    """Every array a step reads or writes, allocated once (T = ``max_step_tokens``): the
    step's plan arrays (``StepArrays``, which the scheduler fills) and the activations."""

    def __init__(self, cfg: ModelConfig, arrays: StepArrays):
        T = self.max_step_tokens = arrays.max_step_tokens
        self.max_context_tokens = arrays.max_context_tokens
        # The plan, as the scheduler lays it out (scheduler/step.py): read here, never written.
        self.ids = arrays.ids                                   # (T,)
        self.positions = arrays.positions                       # (T,)
        self.rows = arrays.rows                                 # (R,) rows whose logits are wanted
        self.slots = arrays.slots                               # (T, 3) where new tokens go
        self.spans = arrays.spans                               # (max_spans, 3) kernel view, back to back
        self.seqs = arrays.seqs                                 # (S, 5) row0, n, pos0, span0, num_spans
        self.h_a = np.zeros((T, cfg.dim), np.float32)           # (T, dim) residual, ping
        self.h_b = np.zeros((T, cfg.dim), np.float32)           # (T, dim) residual, pong
        self.q = np.zeros((T, cfg.q_dim), np.float32)           # (T, num_heads * head_dim)
        self.k = np.zeros((T, cfg.kv_dim), np.float32)          # (T, num_kv_heads * head_dim)
        self.v = np.zeros((T, cfg.kv_dim), np.float32)          # (T, num_kv_heads * head_dim)
        self.attn = np.zeros((T, cfg.q_dim), np.float32)        # (T, num_heads * head_dim)
        self.logits = np.zeros((T, cfg.vocab_size), np.float32)  # (R, vocab)
        self.hidden = np.zeros((T, cfg.dim), np.float32)        # (R, dim) final-normed hidden state of the rows
        self._crossing: dict[tuple[str, int], np.ndarray] = {}

    def crossing(self, name: str, width: int) -> np.ndarray:
        """(T, width) f32 for a tensor between a graph and our products (``PartFile.shapes``):
        one per name and width, shared by the parts (which run one after the other, and
        whose graphs name their tensors alike). Its pages are touched only by the steps
        that use its rows: a prefill chunk's, like ONNX Runtime's own buffers."""
        key = (name, width)
        if key not in self._crossing:
            self._crossing[key] = np.zeros((self.max_step_tokens, width), np.float32)
        return self._crossing[key]


class KernelRun:
    """One step of our products in a session set's plan (``graph.parts.KernelStep``): the
    rows it multiplies are set by ``StepBinding.resize``."""

    __slots__ = ("mm", "per_row", "rows", "pool")

    def __init__(self, mm: LMatmul, per_row: bool, pool):
        self.mm, self.per_row, self.pool = mm, per_row, pool
        self.rows = 0

    def run(self) -> None:
        self.mm.run(self.rows, self.pool)


def read_ahead_bytes(l2_bytes: int | None) -> int:
    """Bytes of the next product's weights that the pool's workers read while the calling
    thread runs the graph parts between two products (``LMatmul.read_ahead``): half the
    smallest L2 cache (a worker reads into its own, and the rest holds what it works on),
    256 KiB where sysfs does not say, and between 64 and 1,024 KiB.
    A quarter and half of the cache gained alike, the whole of it nothing (docs/performance-log.md)."""
    half = (l2_bytes or 512 << 10) // 2
    return max(64 << 10, min(1 << 20, half))


@functools.cache
def this_machines_read_ahead() -> int:
    """``read_ahead_bytes`` of this machine's caches, read from sysfs once, when the first
    step's products are bound (not at import: most commands never run a step)."""
    return read_ahead_bytes(smallest_l2_bytes())


class StepBinding:
    """IOBindings of every graph of one session set over the runner's buffers, and our
    products between them, as one plan.

    One per session set, reused by every step: a step of another size (T tokens, R
    rows wanted) rebinds only the names whose first dimension changed (ONNX Runtime
    replaces a name bound again on the same IOBinding), so steps that mix decodes and
    prefill chunks of any size create no binding objects. The buffers never move, so
    nothing else is ever rebound."""

    # Names every part may have -> (StepBuffers attribute, dims before the rows, per row, dtype)
    _NAMED = {"attn": ("attn", (), False, np.float32), "positions": ("positions", (1,), False, np.int64),
              "q": ("q", (1,), False, np.float32), "k": ("k", (1,), False, np.float32),
              "v": ("v", (), False, np.float32), "rows": ("rows", (), True, np.int64),
              "hidden": ("hidden", (), True, np.float32), "logits": ("logits", (), True, np.float32)}

    def __init__(self, buf: StepBuffers, num_layers: int, sessions: SessionSet, spec: ModelSpec | None = None,
                 pool=None, kernel: str | None = None, int8_act: bool = True):
        self.sessions = sessions
        self.bindings = [sess.io_binding() for sess in sessions]
        # (bind method, name, element type, dims before the rows, dims after, data pointer)
        self._per_token: list[tuple] = []  # names with T rows
        self._per_row: list[tuple] = []    # names with R rows (the last part's)
        self._kernels: list[KernelRun] = []
        self.plan: list[tuple[Callable[[Any], Any], Any, int]] = []
        """(run, its argument, layer) in order, built once: after run(argument), attention of
        ``layer`` when it is not -1. A step creates no objects per layer."""
        h = [buf.h_a, buf.h_b]  # the part's residual in, and out (parts swap them)

        def array(name: str, shapes: dict) -> tuple[np.ndarray, tuple, bool]:
            """The buffer of ``name``: (array, dims before the rows, per row)."""
            if name in ("h", "h_out"):
                return h[name == "h_out"], (), False
            if name in self._NAMED:
                attr, lead, per_row, _ = self._NAMED[name]
                return getattr(buf, attr), lead, per_row
            rows, width = shapes[name]
            return buf.crossing(name, width), (), rows == "R"

        def products(steps, shapes: dict) -> None:
            for step in steps:
                if spec is None:
                    raise ValueError("a part with our kernels' products needs the model spec")
                x, _, per_row = array(step.input, shapes)
                outs = [(spec.weights[w].source_type, spec.weights[w].data, array(o, shapes)[0])
                        for w, o in zip(step.weights, step.outputs)]
                run = KernelRun(LMatmul(outs, x, kernel, int8_act), per_row, pool)
                self._kernels.append(run)
                self.plan.append((KernelRun.run, run, -1))

        L = num_layers
        for part, sess, b in zip(sessions.parts, sessions, self.bindings):
            products(part.before, part.shapes)
            for output, names in ((False, sess.get_inputs()), (True, sess.get_outputs())):
                for n in names:
                    arr, lead, per_row = array(n.name, part.shapes)
                    entry = (b.bind_output if output else b.bind_input, n.name,
                             np.int64 if arr.dtype == np.int64 else np.float32, list(lead), list(arr.shape[1:]),
                             arr.ctypes.data)
                    (self._per_row if per_row else self._per_token).append(entry)
            self.plan.append((sess.run_with_iobinding, b, -1))
            products(part.after, part.shapes)
            if part.last and part.index < L:  # attention after the part's last step
                self.plan[-1] = self.plan[-1][:2] + (part.index,)
            if part.last and 0 < part.index < L:
                h.reverse()
        for k, following in zip(self._kernels, self._kernels[1:]):
            k.mm.read_ahead(following.mm, this_machines_read_ahead())
        self._ids, self._h0 = buf.ids, buf.h_a
        self.num_tokens = self.num_rows = 0  # nothing bound yet
        self.ids: np.ndarray = self._ids[:0]  # (T,) the bound step's token ids
        self.h0: np.ndarray = self._h0[:0]    # (T, dim) its first residual

    def read_ahead_around(self, classifier: Classifier | None) -> None:
        """The step's last product reads ahead the classifier's weights, and the classifier
        the first product's (the next step's), where the classifier is in our layer form."""
        if self._kernels and classifier is not None and isinstance(classifier.mm, LMatmul):
            ahead = this_machines_read_ahead()
            self._kernels[-1].mm.read_ahead(classifier.mm, ahead)
            classifier.mm.read_ahead(self._kernels[0].mm, ahead)

    def resize(self, num_tokens: int, num_rows: int) -> None:
        """Bind for a step of ``num_tokens`` tokens and ``num_rows`` logits rows: only the
        names whose size changed since the last step."""
        if num_tokens != self.num_tokens:
            for bind, key, elem, lead, tail, ptr in self._per_token:
                bind(key, "cpu", 0, elem, lead + [num_tokens] + tail, ptr)
            self.num_tokens = num_tokens
            self.ids = self._ids[:num_tokens]  # (T,)
            self.h0 = self._h0[:num_tokens]    # (T, dim)
        if num_rows != self.num_rows:
            for bind, key, elem, lead, tail, ptr in self._per_row:
                bind(key, "cpu", 0, elem, lead + [num_rows] + tail, ptr)
            self.num_rows = num_rows
        for k in self._kernels:
            k.rows = num_rows if k.per_row else num_tokens


class TokenEmbedding:
    """Token ids to the first residual: our kernel gathers f32, Q8_0 and Q4_0 tables,
    NumPy's gather every other type; then the family's scale (Gemma: sqrt(dim), in f32
    as llama.cpp).

    With the ``entry`` the table's arrays live in, a step's rows are read from its file
    (``read_rows``) into buffers of ``max_tokens`` rows, not through the mapping: pages
    are mapped a folio at a time (up to 2 MiB), so a prompt of random ids mapped most of
    a large table: a second resident copy of the one ONNX Runtime packed for a tied
    classifier (docs/performance-log.md)."""

    _PARTS = ("data", "scales", "zero_points", "mins")

    def __init__(self, weight: Weight, embed_scale: float, max_tokens: int = 0, entry=None):
        self._w = weight
        self._fast = weight.dtype in ("f32", "q8_0", "q4_0") and not weight.kernel_form
        self._scale = np.float32(embed_scale)
        arrays = {k: getattr(weight, k) for k in self._PARTS if getattr(weight, k) is not None}
        # A table in our kernels' form is the classifier's too, read whole every step through
        # the mapping: its rows are read there as well.
        where = ({k: entry.file_offset(a) for k, a in arrays.items()}
                 if entry is not None and max_tokens and not weight.kernel_form else {})
        self._reads = None
        if where and all(v is not None for v in where.values()):
            vocab = weight.data.shape[0]
            # (fd, offset, row bytes, the rows' buffer shaped like the table's first max_tokens rows)
            self._reads = [(fd, off, arrays[k].nbytes // vocab,
                            np.empty((max_tokens,) + arrays[k].reshape(vocab, -1).shape[1:], arrays[k].dtype))
                           for k, (fd, off) in where.items()]
            rows = {k: r[3] for k, r in zip(where, self._reads)}
            self._rows_w = Weight(weight.name, weight.dtype, (max_tokens, weight.shape[1]),
                                  rows["data"].reshape((max_tokens,) + weight.data.shape[1:]),
                                  rows["scales"].reshape(-1) if "scales" in rows else None,
                                  bits=weight.bits, block_size=weight.block_size,
                                  zero_points=rows["zero_points"].reshape(-1) if "zero_points" in rows else None,
                                  mins=rows.get("mins"))
            self._arange = np.arange(max_tokens, dtype=np.int64)

    def __call__(self, ids: np.ndarray, out: np.ndarray) -> None:
        """Write the rows of ``ids`` (T,) into ``out`` (T, dim)."""
        e = self._w
        if self._reads is not None:
            vocab = e.data.shape[0]
            for fd, off, row_bytes, buf in self._reads:
                read_rows(fd, off, row_bytes, vocab, ids, buf)
            e, ids = self._rows_w, self._arange[:len(ids)]
        if e.kernel_form:
            lform_rows(e.data, e.source_type, e.shape, ids, out)
        elif self._fast:
            _embed(ids, e.data, e.scales, e.dtype, out)
        else:
            if e.scales is None:
                raise ValueError(f"embedding table {e.name} ({e.dtype}) has no scales")
            gather_rows(e.data, e.scales, e.zero_points, e.mins, e.bits, e.block_size, ids, out)
        if self._scale != 1.0:
            np.multiply(out, self._scale, out=out)


class Classifier:
    """The classifier in our kernels (``ModelSpec.classifier_in_kernels``): logits[:R] =
    hidden[:R] @ W^T over the file's blocks in our kernels' form (``LMatmul``), or over the
    cached 8-bit form of the types that have none (``QMatmul``), read in place, then the
    family's final soft-cap (Gemma 2). int8 activations at ONNX Runtime's accuracy level 4,
    as its MatMulNBits would have quantized them; f32 below."""

    def __init__(self, spec: ModelSpec, buf: StepBuffers, accuracy_level: int, kernel: str | None):
        w = spec.output
        int8 = accuracy_level == 4
        if w.kernel_form:
            self._mm = LMatmul([(w.source_type, w.data, buf.logits)], buf.hidden, kernel, int8)
        else:
            self._mm = QMatmul(w.data, w.scales, buf.hidden, buf.logits, kernel, int8)
        self._cap = np.float32(spec.config.final_softcap)
        self._logits = buf.logits

    @property
    def mm(self):
        """The product (``LMatmul`` or ``QMatmul``)."""
        return self._mm

    def __call__(self, num_rows: int, pool) -> None:
        """Logits of the step's ``num_rows`` rows, on ``pool`` (None: this thread)."""
        self._mm.run(num_rows, pool)
        if self._cap > 0:  # cap * tanh(logits / cap)
            z = self._logits[:num_rows]
            np.multiply(z, 1 / self._cap, out=z)
            np.tanh(z, out=z)
            np.multiply(z, self._cap, out=z)


def kernel_stepper(buf: StepBuffers, arena, cfg: ModelConfig, prefetch_degree: int, kernel: str | None,
                   pool, sessions: SessionSet) -> ArenaStepper:
    """Our attention between the parts of ``sessions``, over ``buf`` and the KV ``arena``,
    run on our kernels' ``pool`` (ONNX Runtime has its own: same thread count and cores).

    Decode attention is split over our pool when ONNX Runtime's workers leave the cores
    between the parts (per-part pools, or no spinning), or yield them to our workers
    (the shared pool's, which spin on after a Run: under SCHED_IDLE while our pool's
    jobs run, where the process may take them out of it again). Where they spin on and
    cannot yield, our workers would only contend with them, and a decode runs on the
    calling thread (docs/performance.md has the measurements). Prefill always uses the pool.
    """
    # How each layer attends: the family's scale and soft-cap, sliding windows per layer.
    windows = np.array([cfg.layer_window(i) for i in range(cfg.num_layers)], np.int64)
    yields = bool(sessions.spinning_workers) and can_unidle()
    if yields:
        pool.set_yielders(sessions.spinning_workers)
    return ArenaStepper(arena, buf.q, buf.k, buf.v, buf.attn, buf.slots, buf.spans,
                        cfg.attention_scale, prefetch_degree, pool, kernel, buf.seqs,
                        softcap=cfg.attn_softcap, windows=windows,
                        decode_on_caller=not sessions.idle_between_runs and not yields)
