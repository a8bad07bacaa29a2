"""onnxruntime-genai's side of ``dualpath bench e2e``: runs in *its* environment.

This file is run by path with the interpreter of an environment that has
onnxruntime-genai (``harness.run_peer_script``), never imported by dualpath: that
environment has its own onnxruntime and the model builder's torch, and no dualpath.
So it imports only the standard library at the top; each function imports what
it needs:

* ``probe``: which of the named modules import, and their versions;
* ``build``: onnxruntime-genai's model builder on a GGUF (needs the builder's
  dependencies: gguf, tokenizers, transformers, torch, onnx, onnx_ir);
* ``measure``: one prefill + decode run with ``og.Generator`` (onnxruntime_genai, numpy).

Protocol (the harness's): ``PYTHON _ortgenai_worker.py FUNCTION RESULT_PATH``, the
keyword arguments as JSON on stdin, the JSON result written to RESULT_PATH.

The build and measurement follow the project's own peer tools (``make_hf_dir.py`` and
``bench_ortgenai.py``, kept beside the shared test models), adapted here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable

BUILD_LOG = "build.log"
"""The builder's stdout and stderr, kept beside the built model."""


# -- probe ---------------------------------------------------------------------

def probe(modules: list) -> dict:
    """Import each of ``modules``; say which failed (first line of the error) and the
    versions of those that imported."""
    import importlib
    import platform

    versions, missing = {}, {}
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as e:  # ImportError, or a broken install (a CUDA torch without its libraries)
            missing[name] = (f"{type(e).__name__}: {e}".splitlines() or [type(e).__name__])[0]
        else:
            versions[name] = str(getattr(module, "__version__", ""))
    return {"python": sys.executable, "python_version": platform.python_version(), "versions": versions,
            "missing": missing}


# -- build ---------------------------------------------------------------------

def _field(reader, key: str, default=None):
    """A GGUF metadata value: str, a number, or a list of them (as make_hf_dir.py reads them)."""
    f = reader.fields.get(key)
    if f is None:
        return default
    values = []
    for i in f.data:
        part = f.parts[i]
        values.append(bytes(part).decode("utf-8", errors="replace") if f.types[-1].name == "STRING"
                      else part.tolist()[0])
    return values if f.types[0].name == "ARRAY" else values[0]


def write_hf_folder(reader, out: str) -> dict:
    """Write config.json and a tokenizer to ``out`` from a llama GGUF's metadata and
    vocabulary (no hub access): what the builder reads besides the weights.

    Adapted from the project's peer tool ``make_hf_dir.py``: the tokenizer is a
    byte-fallback BPE over the GGUF's own token list (same ids), with no merges,
    enough for AutoTokenizer and the genai config (the benchmark feeds token ids).
    The builder's RoPE is plain: a GGUF's RoPE scaling is not carried over, which
    changes the text, not the speed.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    arch = _field(reader, "general.architecture")
    g = lambda key, default=None: _field(reader, f"{arch}.{key}", default)  # noqa: E731
    dim, num_heads = int(g("embedding_length")), int(g("attention.head_count"))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    names = {t.name for t in reader.tensors}
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": dim,
        "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(g("attention.head_count_kv", num_heads)),
        "head_dim": int(g("attention.key_length", dim // num_heads)),
        "max_position_embeddings": int(g("context_length")),
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        "vocab_size": len(tokens),
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id", 1)),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id", 2)),
        "pad_token_id": int(_field(reader, "tokenizer.ggml.padding_token_id",
                                   _field(reader, "tokenizer.ggml.unknown_token_id", 0))),
        "torch_dtype": "float32",
        "attention_bias": False,
        "mlp_bias": False,
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)

    def token(value: object) -> str:
        i = int(value)  # type: ignore[call-overload]  # a GGUF integer field
        return tokens[i] if 0 <= i < len(tokens) else "<unk>"

    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    unk = token(int(_field(reader, "tokenizer.ggml.unknown_token_id", 0)))
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=unk, byte_fallback=True, fuse_unk=True))
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tk.pre_tokenizer = None
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=token(cfg["bos_token_id"]),
                                   eos_token=token(cfg["eos_token_id"]), unk_token=unk, pad_token=unk)
    fast.save_pretrained(out)
    return cfg


def write_f32_copy(reader, out_path: str) -> list:
    """Write every tensor of ``reader`` dequantized to F32 into a GGUF at ``out_path``
    (tensors only: the builder reads nothing else from it); return the source types.

    Why: the builder's GGUF loader takes ``tensor.data`` as values, so a quantized
    tensor's raw blocks fail its first reshape (Q4_0, Q8_0 alike: 'shape [256, 256] is
    invalid for input of size 36864'). Dequantized, the builder quantizes again with
    its own ``-p int4``/``int8`` (MatMulNBits, block 32, symmetric round-to-nearest).
    One tensor at a time: the model is never whole in memory here.
    """
    import gguf
    import numpy as np

    arch = _field(reader, "general.architecture")
    w = gguf.GGUFWriter(out_path, arch)
    f32 = gguf.GGMLQuantizationType.F32
    shapes = []
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # numpy order (rows, columns)
        shapes.append(shape)
        w.add_tensor_info(t.name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4, raw_dtype=f32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t, shape in zip(reader.tensors, shapes):
        w.write_tensor_data(gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape))
    w.close()
    return sorted({t.tensor_type.name for t in reader.tensors})


def build(gguf_path: str, out_dir: str, precision: str) -> dict:
    """Build onnxruntime-genai's CPU model of ``gguf_path`` in ``precision`` (fp32,
    int4 or int8) into ``out_dir`` (its ``model/`` subfolder), with the builder's
    command line:

        python -m onnxruntime_genai.models.builder -m HF -i FILE.gguf -o OUT/model
               -p PRECISION -e cpu -c CACHE --extra_options hf_token=false prune_lm_head=true

    It works in ``out_dir.part-PID`` and renames it at the end, so ``out_dir`` exists
    only complete. A GGUF with any tensor not in F32 is first dequantized to an F32
    copy (``write_f32_copy``), removed after the build. On failure the work folder is
    removed and the builder's log kept as ``out_dir.failed.log``.
    """
    work = f"{out_dir}.part-{os.getpid()}"
    failed_log = f"{out_dir}.failed.log"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    try:
        info = _build_in(work, gguf_path, precision, failed_log)
    except BaseException:
        if os.path.isfile(os.path.join(work, BUILD_LOG)):
            os.replace(os.path.join(work, BUILD_LOG), failed_log)
        shutil.rmtree(work, ignore_errors=True)
        raise
    if os.path.exists(failed_log):
        os.remove(failed_log)
    try:
        os.rename(work, out_dir)
    except OSError:  # another run built it first: keep theirs
        if not os.path.isfile(os.path.join(out_dir, "model", "genai_config.json")):
            raise
        shutil.rmtree(work, ignore_errors=True)
    return info


def _build_in(work: str, gguf_path: str, precision: str, failed_log: str) -> dict:
    """``build``'s steps, in the folder ``work``: hf/, the builder's log, model/, build.json
    (``failed_log``: where ``build`` keeps the log if this raises)."""
    from gguf.gguf_reader import GGUFReader

    t0 = time.perf_counter()
    reader = GGUFReader(gguf_path)
    write_hf_folder(reader, os.path.join(work, "hf"))
    types = sorted({t.tensor_type.name for t in reader.tensors})
    dequantized = types != ["F32"]
    source = os.path.abspath(gguf_path)
    if dequantized:
        source = "weights-f32.gguf"
        write_f32_copy(reader, os.path.join(work, source))
    del reader
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", "hf", "-i", source,
           "-o", "model", "-p", precision, "-e", "cpu", "-c", "builder-cache",
           "--extra_options", "hf_token=false", "prune_lm_head=true"]
    log_path = os.path.join(work, BUILD_LOG)
    with open(log_path, "w") as log:
        # cwd=work: ``-m`` puts the working folder first on sys.path
        rc = subprocess.run(cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0 or not os.path.isfile(os.path.join(work, "model", "genai_config.json")):
        with open(log_path, errors="replace") as f:
            sys.stderr.write(f.read()[-4000:] + "\n")
        raise RuntimeError(f"onnxruntime-genai's model builder exited with status {rc} on {gguf_path} "
                           f"(-p {precision}); its log: {failed_log}")
    shutil.rmtree(os.path.join(work, "builder-cache"), ignore_errors=True)
    if dequantized:
        os.remove(os.path.join(work, source))
    info = {"gguf": os.path.abspath(gguf_path), "precision": precision, "tensor_types": types,
            "dequantized": dequantized, "build_s": round(time.perf_counter() - t0, 2), "command": cmd}
    with open(os.path.join(work, "build.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


# -- measure -------------------------------------------------------------------

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


def measure(model_dir: str, prompt: list, decode: int, threads: int, chunk: int) -> dict:
    """One measurement, as bench_ortgenai.py's worker does it (ours, adapted):

    * ``og.Config`` with intra_op_num_threads=``threads``, inter_op 1, CPU only;
    * a warm-up generator (up to 64 prompt tokens, 4 steps), discarded;
    * prefill: ``append_tokens`` of ``prompt`` in ``chunk``-sized calls (0: at once);
      tok/s = len(prompt) / time;
    * the first ``generate_next_token`` only samples the prefill's logits (not timed
      as decode); each of the next ``decode`` calls runs the model on one token and
      samples greedily: decode tok/s = decode / their total time.

    ``min_length`` = ``max_length`` keeps EOS from ending the run (ignore_eos).
    """
    import numpy as np
    import onnxruntime_genai as og

    cfg = og.Config(model_dir)
    cfg.clear_providers()
    cfg.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
    model = og.Model(cfg)
    loaded_rss_mb = _peak_rss_mb()

    def generator(max_length: int):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=max_length, min_length=max_length, do_sample=False)
        return og.Generator(model, params)

    ids = np.asarray(prompt, dtype=np.int32)  # (num_prompt_tokens,)
    warm = ids[:64]
    g = generator(len(warm) + 5)
    g.append_tokens(warm)
    for _ in range(4):
        g.generate_next_token()
    del g

    step = chunk if chunk > 0 else len(ids)
    g = generator(len(ids) + decode + 1)
    t0 = time.perf_counter()
    for i in range(0, len(ids), step):
        g.append_tokens(ids[i:i + step])
    t1 = time.perf_counter()
    g.generate_next_token()  # samples the prefill's logits
    t2 = time.perf_counter()
    for _ in range(decode):
        g.generate_next_token()
    t3 = time.perf_counter()
    generated = g.get_sequence(0)[len(ids):]  # (decode + 1,)
    return {"prefill_tps": len(ids) / (t1 - t0), "decode_tps": decode / (t3 - t2),
            "peak_rss_mb": _peak_rss_mb(), "loaded_rss_mb": loaded_rss_mb, "og_version": og.__version__,
            "num_generated_tokens": int(len(generated)), "first_tokens": [int(t) for t in generated[:8]]}


# -- the harness's child protocol (a copy of harness._child: this file cannot import dualpath) --

def _child(function: str, result_path: str) -> None:
    functions: dict[str, Callable[..., object]] = {"probe": probe, "build": build, "measure": measure}
    fn = functions[function]
    result = fn(**json.load(sys.stdin))
    with open(result_path + ".part", "w") as f:
        json.dump(result, f)
    os.replace(result_path + ".part", result_path)


if __name__ == "__main__":
    # Run by path, Python put this folder first on sys.path; it holds modules named like
    # installed packages (kernels.py: transformers looks for a 'kernels' package). Drop it.
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    if len(sys.argv) != 3 or sys.argv[1] not in ("probe", "build", "measure"):
        sys.exit("usage: PYTHON _ortgenai_worker.py probe|build|measure RESULT_PATH  (arguments as JSON on stdin)")
    _child(sys.argv[1], sys.argv[2])
