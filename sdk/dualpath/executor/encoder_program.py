"""An encoder's graph as it runs (graph/parts.py ``EncoderGraph``): ONNX Runtime's graphs over
IOBindings and, between them, the layer products in our kernels (``LMatmul``, the file's
blocks read in place, activations quantized per block of 32 as llama.cpp does) and the
attention in our kernels (``EncAttention``, over the packed texts).

Every tensor that crosses between two steps has a buffer of (max_rows, width) f32, made
once. Names are unique per layer, so buffers are shared by lifetime: a tensor takes a buffer
of its width that no later step reads, and a 6-layer MiniLM needs 7 buffers, not 50. A batch
of N rows uses each buffer's first N rows (the pages it never reaches stay untouched).
"""

from __future__ import annotations

import threading

import numpy as np

from ..graph.parts import AttentionStep, EncoderGraph, KernelStep
from ..kernels import EncAttention, LMatmul, ThreadPool
from ..models.spec import ModelSpec
from .ort_sessions import can_unidle, create_sessions, global_pool_exists

OUTPUT = "hidden"
"""The graph's output: the last layer's states (N, dim)."""


def share_buffers(graph: EncoderGraph) -> dict[str, int]:
    """Crossing tensor -> index of its buffer: a tensor takes a free buffer of its width (one
    whose tensor no later step reads) or a new one. A step's outputs never share with its
    inputs (those are freed only after the step)."""
    steps = [(s.input,) if isinstance(s, KernelStep) else s.inputs for s in graph.steps]
    outs = [s.outputs for s in graph.steps]
    last: dict[str, int] = {}
    for i, names in enumerate(steps):
        for n in names:
            last[n] = i
    index: dict[str, int] = {}
    widths: list[int] = []
    free: list[int] = []
    for i, names in enumerate(steps):
        for n in outs[i]:
            if n not in graph.shapes:
                continue  # the graph's output
            width = graph.shapes[n][1]
            b = next((b for b in free if widths[b] == width), None)
            if b is None:
                widths.append(width)
                b = len(widths) - 1
            else:
                free.remove(b)
            index[n] = b
        free += [index[n] for n in names if n in index and last[n] == i]
    return index


class EncoderProgram:
    """``run(feeds, n)``: the encoder's states (n, dim) of a batch of n packed tokens, from its
    graph inputs ``feeds`` (graph/encoder.py: x, pad, unpad, mask, cos/sin; ``starts``, the
    texts' first rows and n, (B + 1,) int64, for our attention), with
    ``num_threads`` threads: ONNX Runtime's and our kernels' pool on the same cores, ORT's
    spinning workers yielding to our pool's jobs where the process may make them. Threads
that call it at once take turns. An image encoder's output (graph/vision.py) is ``out_rows``
rows of ``out_width``, not the n rows of the model's width."""

    def __init__(self, spec: ModelSpec, graph: EncoderGraph, num_threads: int, max_rows: int,
                 int8_act: bool = True, kernel: str | None = None, out_width: int | None = None,
                 lend: bool = False):
        self.graph = graph
        ours = [s for s in graph.steps if isinstance(s, (KernelStep, AttentionStep))]
        self.lends_threads = lend and num_threads > 1 and any(isinstance(s, KernelStep) for s in ours)
        """Whether the encoder can lend threads to other work (``ThreadPool.active``): asked for
        (``lend``), and its products are ours. ONNX Runtime's parts (norms, activations, the patch
        product) then run on the calling thread alone, in pools of their own that never spin,
        unless ORT's global pool exists already (an earlier model's): they share that one."""
        if self.lends_threads and not global_pool_exists():
            self.sessions = create_sessions(graph.parts, 1, spinning=False, per_session_pools=True,
                                            entry=spec.entry, prepack_float=True)
        else:
            self.sessions = create_sessions(graph.parts, num_threads, spinning=True, entry=spec.entry,
                                            prepack_float=True)
        self.pool = ThreadPool(num_threads) if ours else None
        if self.pool is not None and self.sessions.spinning_workers and can_unidle():
            self.pool.set_yielders(self.sessions.spinning_workers)
        index = share_buffers(graph)
        widths: dict[int, int] = {b: graph.shapes[n][1] for n, b in index.items()}
        self.buffers = [np.zeros((max_rows, widths[b]), np.float32) for b in range(len(widths))]
        self._buf = {n: self.buffers[b] for n, b in index.items()}
        self.dim = out_width or spec.config.dim
        self.padded = any("pad" in p.inputs for p in graph.parts)
        """Whether attention is ONNX Runtime's over texts padded to the longest (feeds pad, unpad
        and mask), not ours over the packed texts (feed ``starts``)."""
        self._plan: list = []  # (session, binding, part), an LMatmul or an EncAttention, in order
        self._rows = 0  # the rows the bindings were made for
        self._lock = threading.Lock()  # one batch at a time: every batch runs through the same buffers
        sessions = iter(self.sessions)
        for step in graph.steps:
            if isinstance(step, KernelStep):
                outs = [(spec.weights[w].source_type, spec.weights[w].data, self._buf[o])
                        for w, o in zip(step.weights, step.outputs)]
                self._plan.append(LMatmul(outs, self._buf[step.input], kernel, int8_act))
            elif isinstance(step, AttentionStep):
                q, k, v = (self._buf[n] for n in step.inputs)
                self._plan.append(EncAttention(q, k, v, self._buf[step.outputs[0]], step.num_heads, step.scale,
                                               kernel))
            else:
                session = next(sessions)
                self._plan.append((session, session.io_binding(), step))

    def run(self, feeds: dict[str, np.ndarray], n: int, out_rows: int | None = None) -> np.ndarray:
        return run_pieces(self.pieces(feeds, n, out_rows))

    def pieces(self, feeds: dict[str, np.ndarray], n: int, out_rows: int | None = None):
        """``run`` a piece at a time: a generator that yields after each of the plan's steps
        (a graph, a product, an attention) and returns the states. It holds the program from
        its first piece until it ends or is closed (another batch's pieces wait)."""
        with self._lock:
            return (yield from self._pieces(feeds, n, n if out_rows is None else out_rows))

    def _pieces(self, feeds: dict[str, np.ndarray], n: int, out_rows: int):
        hidden = np.empty((out_rows, self.dim), np.float32)
        rebind = n != self._rows  # the crossing buffers never move: bound again only for another n
        self._rows = n
        for step in self._plan:
            if isinstance(step, LMatmul):
                step.run(n, self.pool)
                yield
                continue
            if isinstance(step, EncAttention):
                step.run(feeds["starts"], self.pool)
                yield
                continue
            session, binding, part = step
            for name in part.inputs:
                if name in feeds:
                    feeds[name] = np.ascontiguousarray(feeds[name])  # (kept alive through the run)
                    _bind(binding.bind_input, name, feeds[name])
                elif rebind:
                    _bind(binding.bind_input, name, self._buf[name][:n])
            for name in part.outputs:
                if name == OUTPUT:
                    _bind(binding.bind_output, name, hidden)
                elif rebind:
                    _bind(binding.bind_output, name, self._buf[name][:n])
            session.run_with_iobinding(binding)
            yield
        return hidden


def run_pieces(pieces):
    """Run a generator of pieces (``EncoderProgram.pieces``) to its end: what it returns."""
    while True:
        try:
            next(pieces)
        except StopIteration as done:
            return done.value


def _bind(bind, name: str, a: np.ndarray) -> None:
    """``a`` (C-contiguous) bound in place, by address: no OrtValue made per call."""
    bind(name, "cpu", 0, a.dtype, a.shape, a.ctypes.data)
