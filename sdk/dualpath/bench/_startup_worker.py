"""The worker of ``dualpath bench startup``, run as a script in a fresh ``python``
(``python _startup_worker.py JSON``), so that a peer's process imports nothing of
DualPath and DualPath's imports only what ``from dualpath import LLM`` does: the
start-up measured is each engine's own. Prints one JSON line. llama.cpp's runs may use
the interpreter of another environment (``--peer-python``): that branch needs only
llama_cpp and numpy.

Stdlib imports only at module level.
"""

import json
import os
import sys
import time

PROMPT = "Once upon a time"


def _vm(name: str) -> float:
    """A VmXXX line of /proc/self/status in MiB (0 where there is no /proc)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def worker(engine: str, model: str, threads: int, tokens: int, spawned_at: float, cache_dir: str = "",
           ortgenai_dir: str = "", flash_attn: bool = False) -> dict:
    """Load ``model`` and generate ``tokens`` greedily; seconds from ``spawned_at``.
    ``flash_attn``: llama.cpp's flash attention (llama-cpp-python's default is off)."""
    if engine == "dualpath":
        os.environ["DUALPATH_CACHE_DIR"] = cache_dir
        from dualpath import LLM
        from dualpath.config import load_config
        from dualpath.sampling_params import SamplingParams

        llm = LLM(model, load_config(None, {"runtime.num_threads": threads}))
        loaded_at, load_peak = time.time(), _vm("VmHWM")
        ids = llm.tokenize(PROMPT)
        t0 = time.time()
        c = llm.generate(ids, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
        last_at = time.time()
        first_at = t0 + c.timings.prefill_ms / 1e3
        generated = len(c.token_ids)
        extra = {"cache": llm.load_stats.get("cache")}
    elif engine == "llama.cpp":
        import llama_cpp
        import numpy as np

        peer = llama_cpp.Llama(model, n_ctx=512, n_threads=threads, n_threads_batch=threads, flash_attn=flash_attn,
                               verbose=False)
        loaded_at, load_peak = time.time(), _vm("VmHWM")
        n_vocab = peer.n_vocab()
        ids = peer.tokenize(PROMPT.encode(), add_bos=True)
        peer.eval(ids)
        token = int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(peer.ctx, -1), shape=(n_vocab,))))
        first_at = time.time()
        for _ in range(tokens - 1):
            peer.eval([token])
            token = int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(peer.ctx, -1),
                                                        shape=(n_vocab,))))
        last_at = time.time()
        generated, extra = tokens, {}
    elif engine == "onnxruntime-genai":
        import json

        import onnxruntime_genai as og

        cfg = og.Config(ortgenai_dir)
        cfg.clear_providers()
        cfg.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
        m = og.Model(cfg)
        tok = og.Tokenizer(m)
        loaded_at, load_peak = time.time(), _vm("VmHWM")
        ids = tok.encode(PROMPT)
        p = og.GeneratorParams(m)
        p.set_search_options(max_length=len(ids) + tokens + 1, do_sample=False, min_length=0)
        g = og.Generator(m, p)
        g.append_tokens(ids)
        g.generate_next_token()
        first_at = time.time()
        for _ in range(tokens - 1):
            g.generate_next_token()
        last_at = time.time()
        generated, extra = tokens, {}
    else:
        raise ValueError(f"unknown engine {engine!r}")
    return {"load_s": loaded_at - spawned_at, "first_token_s": first_at - spawned_at,
            "last_token_s": last_at - spawned_at, "tokens": generated,
            "load_peak_rss_mb": load_peak, "generation_rss_mb": _vm("VmRSS"), **extra}


if __name__ == "__main__":
    print(json.dumps(worker(**json.loads(sys.argv[1]))))
