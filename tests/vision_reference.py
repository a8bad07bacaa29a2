"""A NumPy reference of a projector file's image encoder, in float64, written from llama.cpp's
``tools/mtmd`` graphs (``clip_graph::build_inp``, ``build_vit``, ``models/siglip.cpp``,
``build_patch_merge_permute``): the yardstick the encoder's ONNX and kernel path is checked
against, itself checked against llama.cpp's ``mtmd`` (tests/models/test_mmproj.py, tests/vision/).

Shapes: an image (S, S, 3) uint8 of exactly the encoder's size S (so that no resize is in
play); P = S / patch_size patches a side, N = P * P in raster order (row by row); E the
encoder's width; the result (tokens, text_dim)."""

from __future__ import annotations

import ctypes
import math

import numpy as np

from dualpath.models.mmproj import VisionSpec


def load_weights(spec: VisionSpec) -> dict[str, np.ndarray]:
    """Every tensor of the file as float64, in the shapes ``expected_tensors`` gives."""
    import gguf

    out = {}
    for t in gguf.GGUFReader(spec.path).tensors:
        shape = spec.tensors[t.name][0]
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        out[t.name] = np.asarray(data, np.float64).reshape(shape)
    return out


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu_tanh(x: np.ndarray) -> np.ndarray:  # ggml_gelu
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _activation(spec: VisionSpec, x: np.ndarray) -> np.ndarray:
    if spec.activation == "gelu_quick":  # CLIP's quick_gelu
        return x / (1.0 + np.exp(-1.702 * x))
    if spec.activation == "silu":
        return x / (1.0 + np.exp(-x))
    return _gelu_tanh(x)


def _gelu_erf(x: np.ndarray) -> np.ndarray:  # torch's nn.GELU(), LLaVA's projector
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def encode(spec: VisionSpec, w: dict[str, np.ndarray], image: np.ndarray) -> np.ndarray:
    """The embeddings (tokens, text_dim) of ``image`` (S, S, 3) uint8. LLaVA's (``mlp``) as
    Hugging Face's CLIP computes them: the class row first, at position 0, every stored layer."""
    S, p, E, H = spec.image_size, spec.patch_size, spec.dim, spec.num_heads
    assert image.shape == (S, S, 3), image.shape
    P = S // p
    x = (image.astype(np.float64) / 255.0 - np.array(spec.image_mean)) / np.array(spec.image_std)
    # the patch embedding, a convolution of stride p: (P, P, 3 * p * p) patches times the kernel
    patches = x.reshape(P, p, P, p, 3).transpose(0, 2, 4, 1, 3).reshape(P * P, 3 * p * p)
    h = patches @ w["v.patch_embd.weight"].reshape(E, 3 * p * p).T + w.get("v.patch_embd.bias", 0.0)
    if spec.class_token:
        h = np.concatenate([w["v.class_embd"][None], h])
    h = h + w["v.position_embd.weight"]
    if spec.pre_norm:
        h = _layer_norm(h, w["v.pre_ln.weight"], w["v.pre_ln.bias"], spec.eps)
    up, down = ("ffn_down", "ffn_up") if spec.ffn_swapped else ("ffn_up", "ffn_down")
    hd = E // H
    for i in range(spec.num_layers):
        b = f"v.blk.{i}."
        a = _layer_norm(h, w[b + "ln1.weight"], w[b + "ln1.bias"], spec.eps)
        q, k, v = ((a @ w[b + n + ".weight"].T + w[b + n + ".bias"]).reshape(-1, H, hd).transpose(1, 0, 2)
                   for n in ("attn_q", "attn_k", "attn_v"))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
        s = np.exp(s - s.max(-1, keepdims=True))
        ctx = (s / s.sum(-1, keepdims=True)) @ v                       # (H, N, hd)
        h = h + ctx.transpose(1, 0, 2).reshape(-1, E) @ w[b + "attn_out.weight"].T + w[b + "attn_out.bias"]
        a = _layer_norm(h, w[b + "ln2.weight"], w[b + "ln2.bias"], spec.eps)
        f = _activation(spec, a @ w[b + up + ".weight"].T + w[b + up + ".bias"])
        h = h + f @ w[b + down + ".weight"].T + w[b + down + ".bias"]
    if spec.post_norm:
        h = _layer_norm(h, w["v.post_ln.weight"], w["v.post_ln.bias"], spec.eps)
    if spec.projector == "mlp":
        h = h[1:] if spec.class_token else h
        return _gelu_erf(h @ w["mm.0.weight"].T + w["mm.0.bias"]) @ w["mm.2.weight"].T + w["mm.2.bias"]
    m = spec.merge
    if spec.projector == "idefics3":
        # pixel shuffle: token (y, x) of the (P / m)^2 takes patches (m y + i, m x + j), i-major
        g = h.reshape(P // m, m, P // m, m, E).transpose(0, 2, 1, 3, 4).reshape(-1, m * m * E)
        return g @ w["mm.model.fc.weight"].T
    # gemma3: the m x m average of each block of patches, then an RMS norm and the (in, out) matrix
    g = h.reshape(P // m, m, P // m, m, E).mean(axis=(1, 3)).reshape(-1, E)
    g = g / np.sqrt((g ** 2).mean(-1, keepdims=True) + spec.eps) * w["mm.soft_emb_norm.weight"]
    return g @ w["mm.input_projection.weight"]


def mtmd_image_embeddings(text_path, mmproj_path, rgb: np.ndarray) -> list[np.ndarray]:
    """llama.cpp's ``mtmd``: the embeddings of each image chunk of a prompt with the image
    ``rgb`` (height, width, 3) uint8."""
    import pytest

    llama_cpp = pytest.importorskip("llama_cpp")
    from llama_cpp import mtmd_cpp as m

    llm = llama_cpp.Llama(str(text_path), n_ctx=1024, n_threads=2, verbose=False)
    ctx, bitmap, chunks, text = _mtmd_open(m, llm, mmproj_path, rgb, "describe " + m.mtmd_default_marker().decode())
    out = []
    try:
        assert m.mtmd_tokenize(ctx, chunks, ctypes.byref(text), (m.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
        for i in range(m.mtmd_input_chunks_size(chunks)):
            chunk = m.mtmd_input_chunks_get(chunks, i)
            if m.mtmd_input_chunk_get_type(chunk) != m.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                continue
            n = m.mtmd_input_chunk_get_n_tokens(chunk)
            assert m.mtmd_encode_chunk(ctx, chunk) == 0
            out.append(np.ctypeslib.as_array(m.mtmd_get_output_embd(ctx), shape=(n * llm.n_embd(),))
                       .reshape(n, -1).copy())
    finally:
        m.mtmd_input_chunks_free(chunks)
        m.mtmd_bitmap_free(bitmap)
        m.mtmd_free(ctx)
    return out


def mtmd_greedy(text_path, mmproj_path, rgb: np.ndarray, prompt: str, num: int):
    """llama.cpp's ``mtmd`` over ``prompt`` (its media marker where the image ``rgb`` goes),
    then ``num`` greedy steps: the prompt's layout as mtmd cut it (("text", ids) and
    ("image", embeddings) chunks in order), the logits at the prompt's last position and
    after each greedy token but the last (num, vocab), and the greedy tokens."""
    import pytest

    llama_cpp = pytest.importorskip("llama_cpp")
    from llama_cpp import mtmd_cpp as m

    llm = llama_cpp.Llama(str(text_path), n_ctx=1024, n_batch=512, n_threads=2, verbose=False)
    ctx, bitmap, chunks, text = _mtmd_open(m, llm, mmproj_path, rgb,
                                           prompt.replace("<image>", m.mtmd_default_marker().decode()))
    layout, rows, tokens = [], [], []
    try:
        assert m.mtmd_tokenize(ctx, chunks, ctypes.byref(text), (m.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
        past = 0  # chunk by chunk as mtmd_helper_eval_chunks would (which aborts on this build's text batches)
        for i in range(m.mtmd_input_chunks_size(chunks)):
            chunk = m.mtmd_input_chunks_get(chunks, i)
            if m.mtmd_input_chunk_get_type(chunk) == m.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                n = m.mtmd_input_chunk_get_n_tokens(chunk)
                assert m.mtmd_encode_chunk(ctx, chunk) == 0
                out = m.mtmd_get_output_embd(ctx)
                layout.append(("image", np.ctypeslib.as_array(out, shape=(n * llm.n_embd(),)).reshape(n, -1).copy()))
                new_past = llama_cpp.llama_pos(0)
                no_callback = m.mtmd_helper_post_decode_callback()
                assert m.mtmd_helper_decode_image_chunk(ctx, llm.ctx, chunk, out, past, 0, 512, ctypes.byref(new_past),
                                                        no_callback, None) == 0
                past = new_past.value
            else:
                count = ctypes.c_size_t()
                ids = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                layout.append(("text", [int(ids[j]) for j in range(count.value)]))
                _decode_tokens(llama_cpp, llm.ctx, layout[-1][1], past)
                past += count.value
        assert layout[-1][0] == "text"  # the logits below are the prompt's last token's
        vocab = llm.n_vocab()
        for _ in range(num):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,)).copy()
            rows.append(logits)
            tokens.append(int(logits.argmax()))
            _decode_tokens(llama_cpp, llm.ctx, tokens[-1:], past)
            past += 1
    finally:
        m.mtmd_input_chunks_free(chunks)
        m.mtmd_bitmap_free(bitmap)
        m.mtmd_free(ctx)
        llm.close()
    return layout, np.stack(rows), tokens


def _decode_tokens(llama_cpp, ctx, ids: list, pos0: int) -> None:
    """llama.cpp decodes ``ids`` of sequence 0 at positions pos0.., the last one's logits kept."""
    batch = llama_cpp.llama_batch_init(len(ids), 0, 1)
    try:
        for j, t in enumerate(ids):
            batch.token[j], batch.pos[j], batch.n_seq_id[j], batch.logits[j] = t, pos0 + j, 1, j == len(ids) - 1
            batch.seq_id[j][0] = 0
        batch.n_tokens = len(ids)
        assert llama_cpp.llama_decode(ctx, batch) == 0
    finally:
        llama_cpp.llama_batch_free(batch)


def _mtmd_open(m, llm, mmproj_path, rgb: np.ndarray, prompt: str):
    """``mtmd`` (the module ``m``) beside ``llm`` at 2 threads: (context, the bitmap of ``rgb``,
    an empty chunk list, ``prompt`` as its input text), the first three for the caller to free."""
    params = m.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings, params.warmup = False, 2, False, False
    ctx = m.mtmd_init_from_file(str(mmproj_path).encode(), llm.model, params)
    assert ctx, f"llama.cpp's mtmd refused {mmproj_path}"
    bitmap = m.mtmd_bitmap_init(rgb.shape[1], rgb.shape[0], (ctypes.c_uint8 * rgb.size).from_buffer_copy(rgb.tobytes()))
    text = m.mtmd_input_text()
    data = prompt.encode()
    text.text, text.text_len, text.add_special, text.parse_special = data, len(data), True, True
    return ctx, bitmap, m.mtmd_input_chunks_init(), text
