"""llama.cpp's side of ``dualpath bench e2e|quality|memory|embed``, and the check of its build.

Run by path with the interpreter of an environment that has llama-cpp-python
(``harness.run_peer_script``): this one by default, or another with its own build of
llama.cpp (``--peer-python``; ``examples/peers/setup_llamacpp_env.sh`` makes one for
the full ISA of this CPU and one for a laptop's). That environment need not have
dualpath, so this file imports only the standard library at the top; each function
imports llama_cpp and numpy (a dependency of llama-cpp-python) where it needs them.
dualpath imports it too (``llamacpp.py``), for the rule that judges a build:

* ``probe``: llama-cpp-python's version and llama.cpp's system info line (its build);
* ``vocab_size``: the model's vocabulary as llama.cpp reads it (for the prompt's ids);
* ``measure``: one prefill + decode run, flash attention off or on;
* ``logits``: teacher-forced logits of a text, saved as ``.npy``;
* ``embed``: texts/s of batches of texts through ``Llama.embed``, flash attention off or on;
* ``rerank``: milliseconds to score (query, document) pairs as llama-server does;
* ``encode_image``: milliseconds to encode an image with ``mtmd`` (a projector file);
* ``image_ttft``: milliseconds from a prompt with an image to its first token, with ``mtmd``;
* ``build_problems``: what keeps a build from being llama.cpp at its best on this CPU
  (``full``), or from being a laptop's build (``laptop``).

Protocol (the harness's): ``PYTHON _llamacpp_worker.py FUNCTION RESULT_PATH``, the
keyword arguments as JSON on stdin, the JSON result written to RESULT_PATH. And for a
person or a setup script: ``PYTHON _llamacpp_worker.py check full|laptop`` prints the
build and its problems, and exits 1 when there are any.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable

ISAS = ("full", "laptop")
"""``full``: every ISA extension of this CPU that ggml builds for, never AMX; ``laptop``:
AVX2 (+ AVX-VNNI where the CPU has it), no AVX-512, no AMX (Intel's hybrid laptops)."""

FULL_WANTS = (("avx2", ("AVX2",)), ("fma", ("FMA",)), ("f16c", ("F16C",)), ("bmi2", ("BMI2",)),
              ("avx512f", ("AVX512",)), ("avx512vbmi", ("AVX512_VBMI",)), ("avx512_vnni", ("AVX512_VNNI",)),
              ("avx512_bf16", ("AVX512_BF16",)), ("avx_vnni", ("AVX_VNNI", "AVX512_VNNI")))
"""(flag in /proc/cpuinfo, build features of which one is wanted when the CPU has it): ggml's
256-bit paths take AVX512_VNNI's instructions where it has them, so it stands for AVX_VNNI."""
LAPTOP_WANTS = (("avx2", ("AVX2",)), ("fma", ("FMA",)), ("f16c", ("F16C",)), ("bmi2", ("BMI2",)),
                ("avx_vnni", ("AVX_VNNI",)))
FORBIDDEN = {"full": ("AMX",), "laptop": ("AMX", "AVX512")}
"""Prefixes of build features a target must not have: no phone or laptop has AMX (and native
builds with AMX crashed on Q8_0/Q4_0 files on Intel machines here); a laptop has no AVX-512."""

_FEATURE = re.compile(r"([A-Z][A-Z0-9_]*) = (\S+)")


# -- the build and the CPU -------------------------------------------------------

def parse_system_info(text: str) -> dict:
    """llama.cpp's system info line as {feature: value}: ``CPU : SSE3 = 1 | AVX = 1 | ...``
    (since ggml's backend registry, only what a build has is listed) or the older
    ``AVX = 1 | AVX_VNNI = 0 | ...``. A feature missing from it is one the build lacks."""
    return {m.group(1): m.group(2) for m in _FEATURE.finditer(text)}


def cpu_flags(cpuinfo_path: str = "/proc/cpuinfo") -> set:
    """The CPU's feature flags as the OS reports them (empty where there is no /proc).
    dualpath's platform/cpu.py reads the same line; this file cannot import it."""
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return set()


def build_problems(system_info: str, flags, isa: str) -> dict:
    """What keeps the build whose system info line is ``system_info`` from being ``isa``'s
    on a CPU with ``flags``: ``forbidden``, features it has and must not (AMX; AVX-512 for
    a laptop); ``missing``, (cpuinfo flag, build feature) pairs this CPU has and the build
    lacks: llama.cpp then runs below its best."""
    if isa not in ISAS:
        raise ValueError(f"isa={isa!r}: one of {', '.join(ISAS)}")
    info = parse_system_info(system_info)
    on = {name for name, value in info.items() if value == "1"}
    forbidden = sorted(f for f in on if f.startswith(FORBIDDEN[isa]))
    wants = FULL_WANTS if isa == "full" else LAPTOP_WANTS
    missing = [(flag, features[0]) for flag, features in wants if flag in flags and not on.intersection(features)]
    return {"forbidden": forbidden, "missing": missing}


def describe_problems(problems: dict, isa: str) -> list:
    """One sentence per problem of ``build_problems``."""
    lines = []
    amx = [f for f in problems["forbidden"] if f.startswith("AMX")]
    avx512 = [f for f in problems["forbidden"] if not f.startswith("AMX")]
    if amx:
        lines.append(f"llama.cpp is built with AMX ({', '.join(amx)}): no phone or laptop has AMX, and such "
                     "builds crashed on Q8_0/Q4_0 files on Intel machines here")
    if avx512:
        lines.append(f"llama.cpp is built with AVX-512 ({', '.join(avx512)}), and a laptop has none")
    if problems["missing"]:
        flags, features = zip(*problems["missing"])
        lines.append(f"llama.cpp's build lacks {', '.join(features)}, which this CPU has ({', '.join(flags)} in "
                     f"/proc/cpuinfo): it is not at its best for the {isa} ISA")
    return lines


# -- functions run in the peer's environment --------------------------------------

def probe() -> dict:
    """llama-cpp-python's version, llama.cpp's system info line and this CPU's flags."""
    import llama_cpp

    return {"python": sys.executable, "version": str(getattr(llama_cpp, "__version__", "")),
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
            "cpu_flags": sorted(cpu_flags())}


def vocab_size(model: str) -> int:
    """The vocabulary of ``model`` as llama.cpp reads it (its tokenizer only)."""
    import llama_cpp

    llm = llama_cpp.Llama(model, vocab_only=True, verbose=False)
    try:
        return int(llm.n_vocab())
    finally:
        llm.close()


def _peak_rss_mb() -> float:
    try:  # VmHWM: getrusage's ru_maxrss carries the parent's peak over fork and exec
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure(model: str, prompt: list, warm_prompt: list, warm_steps: int, decode: int, threads: int, chunk: int,
            flash_attn: bool) -> dict:
    """Prefill ``prompt``, then decode ``decode`` tokens greedily, timed; after the warm-up
    every engine gets (``warm_prompt``, then ``warm_steps`` decoded tokens, discarded).
    llama-cpp-python's ``flash_attn`` is llama.cpp's flash attention on or off."""
    import llama_cpp
    import numpy as np

    ctx = len(prompt)
    llm = llama_cpp.Llama(model, n_ctx=ctx + decode + 8, n_threads=threads, n_threads_batch=threads,
                          n_batch=chunk, n_ubatch=chunk, flash_attn=flash_attn, verbose=False)
    rss_loaded = _peak_rss_mb()
    n_vocab = llm.n_vocab()

    def next_token() -> int:  # greedy over the raw logits of the last evaluated token, no copy
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))

    llm.eval(warm_prompt)
    token = next_token()
    for _ in range(warm_steps):
        llm.eval([token])
        token = next_token()
    llm.reset()  # positions from 0 again: the prompt overwrites the warm-up's cache cells
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    token = next_token()
    for _ in range(decode):
        llm.eval([token])
        token = next_token()
    t2 = time.perf_counter()
    return {"prefill_tps": ctx / (t1 - t0), "decode_tps": decode / (t2 - t1), "peak_rss_mb": _peak_rss_mb(),
            "loaded_rss_mb": rss_loaded}


def embed(model: str, texts: dict, threads: int, batch: int, inner: int, flash_attn: bool) -> dict:
    """texts/s of each workload of ``texts`` (name -> strings): ``Llama.embed`` (L2-normalised,
    as llama.cpp's embedding tools), the median of ``inner`` timed calls after one to warm.
    ``batch`` is n_ctx, n_batch and n_ubatch: the texts of a call are packed as sequences of
    passes of up to ``batch`` tokens."""
    import llama_cpp

    llm = llama_cpp.Llama(model, embedding=True, n_ctx=batch, n_batch=batch, n_ubatch=batch, n_threads=threads,
                          n_threads_batch=threads, flash_attn=flash_attn, verbose=False)
    out = {name: len(b) / _median_s(lambda b=b: llm.embed(b, normalize=True, truncate=False), inner)
           for name, b in texts.items()}
    llm.close()
    return out


def rerank(model: str, pairs: list, threads: int, batch: int, inner: int, flash_attn: bool) -> dict:
    """Milliseconds (median of ``inner`` calls after one to warm) to score ``pairs`` (each
    pair's token ids, as llama-server's ``format_prompt_rerank`` builds them) with pooling
    type rank: pairs packed as sequences of passes of up to ``batch`` tokens, each one's
    ``n_cls_out`` values read, as llama-server's rerank task does. (``Llama.embed`` reads
    ``n_embd`` values per sequence, so the low-level API.)"""
    import llama_cpp

    llm = llama_cpp.Llama(model, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_RANK, n_ctx=batch,
                          n_batch=batch, n_ubatch=batch, n_threads=threads, n_threads_batch=threads,
                          flash_attn=flash_attn, verbose=False)
    width = llama_cpp.llama_model_n_cls_out(llm.model)
    seq_max = llm.context_params.n_seq_max

    def score() -> list:
        out: list = []
        passes: list = [[]]
        for ids in pairs:
            if passes[-1] and (sum(map(len, passes[-1])) + len(ids) > batch or len(passes[-1]) >= seq_max):
                passes.append([])
            passes[-1].append(ids)
        for group in passes:
            llm._ctx.kv_cache_clear()
            llm._batch.reset()
            for i, ids in enumerate(group):
                llm._batch.add_sequence(ids, i, True)
            llm._ctx.decode(llm._batch)
            out += [llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, i)[:width] for i in range(len(group))]
        return out

    ms = _median_s(score, inner) * 1e3
    llm.close()
    return {"rerank_ms": ms}


def encode_image(model: str, mmproj: str, image: str, threads: int, inner: int, flash_attn: bool) -> dict:
    """Milliseconds to encode one image (``image``: a .npy of (height, width, 3) uint8 RGB)
    with llama.cpp's ``mtmd``: every image chunk of a prompt holding it, ``mtmd_encode_chunk``
    each, the median of ``inner`` calls after one to warm; and the chunks' shape."""
    import ctypes

    import llama_cpp
    import numpy as np
    from llama_cpp import mtmd_cpp as m

    rgb = np.load(image)
    llm = llama_cpp.Llama(model, n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False)
    ctx, bitmap, chunks, text = _mtmd_open(llm, mmproj, threads, flash_attn, rgb,
                                           "describe " + m.mtmd_default_marker().decode())
    try:
        if m.mtmd_tokenize(ctx, chunks, ctypes.byref(text), (m.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) != 0:
            raise RuntimeError("mtmd_tokenize failed")
        images = [m.mtmd_input_chunks_get(chunks, i) for i in range(m.mtmd_input_chunks_size(chunks))]
        images = [c for c in images if m.mtmd_input_chunk_get_type(c) == m.MTMD_INPUT_CHUNK_TYPE_IMAGE]

        def encode() -> None:
            for c in images:
                if m.mtmd_encode_chunk(ctx, c) != 0:
                    raise RuntimeError("mtmd_encode_chunk failed")

        ms = _median_s(encode, inner) * 1e3
        tokens = [int(m.mtmd_input_chunk_get_n_tokens(c)) for c in images]
    finally:
        m.mtmd_input_chunks_free(chunks)
        m.mtmd_bitmap_free(bitmap)
        m.mtmd_free(ctx)
    llm.close()
    return {"encode_ms": ms, "chunks": len(tokens), "tokens": sum(tokens), "peak_rss_mb": _peak_rss_mb()}


def image_ttft(model: str, mmproj: str, image: str, threads: int, prompt: str, flash_attn: bool) -> dict:
    """Milliseconds from a prompt with an image (``image``: a .npy of (height, width, 3) uint8;
    ``prompt``: text with mtmd's marker) to its first token, as llama.cpp's ``mtmd`` makes it
    (the files loaded before the clock starts): tokenize, encode and decode each chunk in order,
    then the greedy token. Also the prompt's positions."""
    import ctypes

    import llama_cpp
    import numpy as np
    from llama_cpp import mtmd_cpp as m

    rgb = np.load(image)
    llm = llama_cpp.Llama(model, n_ctx=8192, n_batch=2048, n_ubatch=512, n_threads=threads, n_threads_batch=threads,
                          flash_attn=flash_attn, verbose=False)
    ctx, bitmap, chunks, text = _mtmd_open(llm, mmproj, threads, flash_attn, rgb, prompt)
    t0 = time.perf_counter()
    try:
        if m.mtmd_tokenize(ctx, chunks, ctypes.byref(text), (m.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) != 0:
            raise RuntimeError("mtmd_tokenize failed")
        past = 0
        for i in range(m.mtmd_input_chunks_size(chunks)):
            chunk = m.mtmd_input_chunks_get(chunks, i)
            if m.mtmd_input_chunk_get_type(chunk) == m.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                if m.mtmd_encode_chunk(ctx, chunk) != 0:
                    raise RuntimeError("mtmd_encode_chunk failed")
                new_past = llama_cpp.llama_pos(0)
                if m.mtmd_helper_decode_image_chunk(ctx, llm.ctx, chunk, m.mtmd_get_output_embd(ctx), past, 0, 2048,
                                                    ctypes.byref(new_past), m.mtmd_helper_post_decode_callback(),
                                                    None) != 0:
                    raise RuntimeError("mtmd_helper_decode_image_chunk failed")
                past = new_past.value
            else:
                count = ctypes.c_size_t()
                ids = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                batch = llama_cpp.llama_batch_init(count.value, 0, 1)
                for j in range(count.value):
                    batch.token[j], batch.pos[j], batch.n_seq_id[j] = ids[j], past + j, 1
                    batch.seq_id[j][0], batch.logits[j] = 0, j == count.value - 1
                batch.n_tokens = count.value
                ret = llama_cpp.llama_decode(llm.ctx, batch)
                llama_cpp.llama_batch_free(batch)
                if ret != 0:
                    raise RuntimeError(f"llama_decode returned {ret}")
                past += count.value
        logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        int(np.argmax(np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),))))
        ms = (time.perf_counter() - t0) * 1e3
    finally:
        m.mtmd_input_chunks_free(chunks)
        m.mtmd_bitmap_free(bitmap)
        m.mtmd_free(ctx)
    llm.close()
    return {"ttft_ms": ms, "positions": past}


def _mtmd_open(llm, mmproj: str, threads: int, flash_attn: bool, rgb, prompt: str):
    """llama.cpp's ``mtmd`` context of the projector ``mmproj`` beside ``llm``, the image ``rgb``
    as its bitmap, an empty chunk list and ``prompt`` as its input text (kept: the C side
    points into it): (ctx, bitmap, chunks, text), the first three for the caller to free."""
    import ctypes

    from llama_cpp import mtmd_cpp as m

    params = m.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings, params.warmup = False, threads, False, False
    params.flash_attn_type = 1 if flash_attn else 0
    ctx = m.mtmd_init_from_file(mmproj.encode(), llm.model, params)
    if not ctx:
        raise RuntimeError(f"llama.cpp's mtmd refused {mmproj}")
    bitmap = m.mtmd_bitmap_init(rgb.shape[1], rgb.shape[0], (ctypes.c_uint8 * rgb.size).from_buffer_copy(rgb.tobytes()))
    text = m.mtmd_input_text()
    data = prompt.encode()
    text.text, text.text_len, text.add_special, text.parse_special = data, len(data), True, True
    return ctx, bitmap, m.mtmd_input_chunks_init(), text


def _median_s(fn, inner: int) -> float:
    """Seconds of the median of ``inner`` calls of ``fn``, after one call to warm."""
    fn()
    times = []
    for _ in range(inner):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def logits(model: str, ids: list, out: str, n_ctx: int, kv_f32: bool, threads: int, flash_attn: bool) -> dict:
    """Teacher-forced logits (len(ids) - 1, vocab) predicting ids[1:], saved to ``out``;
    ``kv_f32``: an f32 KV cache (llama.cpp's default is f16)."""
    import llama_cpp
    import numpy as np

    kw: dict = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32} if kv_f32 else {}
    llm = llama_cpp.Llama(model, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, logits_all=True,
                          flash_attn=flash_attn, verbose=False, **kw)
    llm.eval(ids[:-1])
    scores = np.array(llm.scores[:len(ids) - 1], dtype=np.float32)  # (len(ids) - 1, vocab)
    llm.close()
    np.save(out, scores)
    return {"shape": list(scores.shape)}


# -- the harness's child protocol (a copy of harness._child: this file cannot import dualpath) --

FUNCTIONS: dict[str, Callable[..., object]] = {"probe": probe, "vocab_size": vocab_size, "measure": measure,
                                             "logits": logits, "embed": embed, "rerank": rerank,
                                             "encode_image": encode_image, "image_ttft": image_ttft}


def _child(function: str, result_path: str) -> None:
    result = FUNCTIONS[function](**json.load(sys.stdin))
    with open(result_path + ".part", "w") as f:
        json.dump(result, f)
    os.replace(result_path + ".part", result_path)


def _check(isa: str) -> int:
    """Print the build and its problems for ``isa``; 1 when there are any."""
    p = probe()
    print(f"llama-cpp-python {p['version']} ({p['python']}): {p['system_info']}")
    lines = describe_problems(build_problems(p["system_info"], set(p["cpu_flags"]), isa), isa)
    for line in lines:
        print(f"PROBLEM: {line}")
    if not lines:
        print(f"a {isa} build for this CPU: no AMX" + (", no AVX-512" if isa == "laptop" else "") +
              ", every ISA extension wanted that the CPU has")
    return 1 if lines else 0


if __name__ == "__main__":
    # Run by path, Python put this folder first on sys.path; it holds modules named like
    # installed packages (kernels.py, cache.py). Drop it.
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    if len(sys.argv) == 3 and sys.argv[1] == "check" and sys.argv[2] in ISAS:
        sys.exit(_check(sys.argv[2]))
    if len(sys.argv) != 3 or sys.argv[1] not in FUNCTIONS:
        sys.exit(f"usage: PYTHON _llamacpp_worker.py {'|'.join(FUNCTIONS)} RESULT_PATH  (arguments as JSON on "
                 f"stdin), or PYTHON _llamacpp_worker.py check {'|'.join(ISAS)}")
    _child(sys.argv[1], sys.argv[2])
