"""An encoder cut at its products and its attention (graph/parts.py ``encoder_graph``,
executor/encoder_program.py): a quantized file's layer matrices and every file's attention run
in our kernels between ONNX Runtime's graphs; the crossing buffers shared by lifetime never
hold two live tensors."""

from __future__ import annotations

import numpy as np
import pytest

from dualpath import LLM
from dualpath.executor.encoder_program import share_buffers
from dualpath.executor.memory_plan import ACTIVATION_FLOATS, encoder_parts
from dualpath.graph.parts import AttentionStep, KernelStep, encoder_graph
from dualpath.models.synth import synth_gguf

MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down")


@pytest.fixture(scope="module", params=["Q8_0", "F16"])
def llm(request, tmp_path_factory):
    path = synth_gguf(tmp_path_factory.mktemp("program") / f"bert-tiny-{request.param}.gguf", "bert-tiny",
                      request.param)
    return LLM(path)


def test_a_quantized_encoder_runs_every_layer_matrix_in_our_kernels(llm):
    graph = encoder_graph(llm.spec, 4)
    products = [s for s in graph.steps if isinstance(s, KernelStep)]
    named = sorted(w for s in products for w in s.weights)
    layers = llm.spec.config.num_layers
    attention = [s for s in graph.steps if isinstance(s, AttentionStep)]
    assert len(attention) == layers and all(s.num_heads == llm.spec.config.num_heads for s in attention)
    assert all("pad" not in p.inputs and "mask" not in p.inputs for p in graph.parts)  # no padding anywhere
    h, d, _ = ACTIVATION_FLOATS  # and no (heads, context) scores per token in the plan
    cfg = llm.spec.config
    assert encoder_parts(llm.spec, 512)["activations"] == 512 * 4 * (h * cfg.hidden_dim + d * cfg.dim)
    if llm.spec.weights["blk.0.attn_q"].source_type == "Q8_0":
        assert named == sorted(f"blk.{i}.{m}" for i in range(layers) for m in MATRICES)
        assert [len(s.weights) for s in products[:1]] == [3]  # q, k, v: one product, activations quantized once
        assert len(graph.parts) == 4 * layers + 1  # norms, biases and GELU between them
        # counted at their form's bytes, not as ONNX Runtime's packed copies
        form_bytes = sum(llm.spec.weights[w].data.nbytes for w in named)
        assert form_bytes <= encoder_parts(llm.spec, 512)["weights"] < 2 * form_bytes
    else:  # ONNX Runtime's products: one graph from each attention to the next
        assert named == [] and len(graph.parts) == layers + 1


def test_buffers_shared_by_lifetime_never_hold_two_live_tensors(llm):
    graph = encoder_graph(llm.spec, 4)
    index = share_buffers(graph)
    assert set(index) == set(graph.shapes)
    reads = [(s.input,) if isinstance(s, KernelStep) else s.inputs for s in graph.steps]
    life: dict[str, tuple[int, int]] = {}
    for i, s in enumerate(graph.steps):
        for n in s.outputs:
            life[n] = (i, i)
    for i, names in enumerate(reads):
        for n in names:
            if n in life:
                life[n] = (life[n][0], i)
    for a in index:
        for b in index:
            if a < b and index[a] == index[b]:
                (a0, a1), (b0, b1) = life[a], life[b]
                assert a1 < b0 or b1 < a0, f"{a} and {b} share a buffer while both live"
                assert graph.shapes[a][1] == graph.shapes[b][1]
    if graph.shapes:  # q, k, v before and after their biases, attention's output, the residual ...
        assert len(set(index.values())) <= min(10, len(index) - 1)


def test_a_text_gives_the_same_vector_alone_and_in_a_batch(llm):
    rng = np.random.default_rng(0)
    vocab = llm.spec.config.vocab_size
    texts = [[101] + rng.integers(200, vocab, n).tolist() + [102] for n in (3, 120, 17, 60, 1)]
    together = llm.encoder.embed(texts, "mean")
    for ids, v in zip(texts, together):
        (alone,) = llm.encoder.embed([ids], "mean")
        np.testing.assert_allclose(v, alone, atol=2e-5)


def test_threads_embedding_at_once_take_turns(llm):
    """The program's buffers are shared by every batch: calls from several threads must not
    mix their rows (each gets what it gets alone)."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(1)
    vocab = llm.spec.config.vocab_size
    batches = [[[101] + rng.integers(200, vocab, n).tolist() + [102] for n in rng.integers(1, 100, 6)]
               for _ in range(8)]
    alone = [np.stack(llm.encoder.embed(b, "mean")) for b in batches]
    with ThreadPoolExecutor(4) as ex:
        together = list(ex.map(lambda b: np.stack(llm.encoder.embed(b, "mean")), batches))
    for a, t in zip(alone, together):
        np.testing.assert_array_equal(a, t)


def test_every_kernel_isa_gives_the_same_vectors(llm):
    """runtime.kernel_isa reaches the encoder's attention and products: each ISA the machine
    runs (the generic reference among them) embeds as the default does: to f32 rounding with
    float products; with int8 activations a rounding that moves a value across a step of
    the quantizer shows, so there the vectors' cosine is the measure."""
    from dualpath.config import load_config, with_overrides
    from dualpath.kernels import available_kernels

    rng = np.random.default_rng(2)
    vocab = llm.spec.config.vocab_size
    texts = [[101] + rng.integers(200, vocab, n).tolist() + [102] for n in (1, 14, 15, 40, 126)]
    want = np.stack(llm.encoder.embed(texts, "mean"))
    for isa in available_kernels():
        other = LLM(llm.spec.path, with_overrides(load_config(None), {"runtime.kernel_isa": isa}))
        assert other.encoder._program._plan and any(
            type(s).__name__ == "EncAttention" for s in other.encoder._program._plan)
        got = np.stack(other.encoder.embed(texts, "mean"))
        if llm.spec.weights["blk.0.attn_q"].source_type == "F16":
            np.testing.assert_allclose(got, want, atol=3e-5, err_msg=isa)
        assert np.sum(got * want, axis=1).min() >= 0.99999, isa  # unit vectors
