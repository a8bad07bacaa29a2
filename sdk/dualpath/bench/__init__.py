"""``dualpath bench``: the benchmarks, one module each.

* ``e2e``: prefill and decode tokens/s, DualPath beside llama-cpp-python and onnxruntime-genai
  (``ortgenai``: that peer, run in its own environment);
* ``embed``: texts/s of an embedding model (short texts, passages), DualPath beside llama.cpp;
* ``memory``: where every MiB goes, measured beside the memory plan (executor/memory_plan.py);
* ``kernels``: decode attention GB/s beside this machine's read bandwidth;
* ``classifier``: the classifier's product in our kernels beside ONNX Runtime's MatMulNBits;
* ``layers``: a layer's products in our kernels (over the file's blocks) beside MatMulNBits;
* ``kv-quality``: greedy agreement and logit error of a KV element type (q8) against another;
* ``quality``: KL divergence and top-1 agreement of DualPath and llama.cpp against a file's
  exact (F32-dequantized) model, teacher-forced over a text;
* ``power``: CPU-seconds per token and tokens/s per power profile;
* ``cache``: the KV cache's append throughput and bytes held against bytes needed;
* ``serve``: latency under a mixed load, the cache's path modes side by side;
* ``load``: many streaming clients against a live ``dualpath serve``;
* ``startup``: process start to the first and 8th token, first and cached load;
* ``chat``: time to first token per turn of a conversation, its KV reused across turns or not;
* ``prefix-restart``: time to first token after a kill and restart, for a prefix seen before
  (the prefix cache on disk; llama-server's slot save and restore);
* ``spec``: speculative decoding (prompt lookup) against plain decoding, beside llama.cpp's;
* ``tools``: decode speed of a tool call under its lazy grammar against free text;
* ``arm``: instructions per generated and per prompt token on aarch64 under qemu-aarch64
  (a counting plugin of ours), DualPath beside llama.cpp's phone and baseline builds.

A measurement that needs a process of its own runs through ``harness.run_worker``
(the one isolated-process harness); what several benchmarks share is in
``common``. The benchmarks sit above the ``LLM`` API and the server and below the
CLI: they never import ``dualpath.cli``.

This module stays light (the CLI builds its parser on every call, and every
worker process imports it): each benchmark module is imported when its parser is
added.
"""

from __future__ import annotations


def add_bench_parser(sub) -> None:
    """Add ``bench`` and its subcommands to the CLI's subparsers."""
    from . import (
        arm,
        cache,
        chat,
        classifier,
        e2e,
        embed,
        embed_serve,
        kernels,
        kv_quality,
        layers,
        load,
        memory,
        power,
        prefix_restart,
        quality,
        serve,
        spec,
        startup,
        tools,
        vision,
    )

    b = sub.add_parser("bench", help="benchmarks (side by side with llama.cpp where it applies)")
    bs = b.add_subparsers(dest="bench", required=True)
    for module in (e2e, memory, kernels, classifier, layers, kv_quality, quality, power, cache, serve, load, startup,
                   chat, prefix_restart, spec, tools, arm, embed, embed_serve, vision):
        module.add_parser(bs)
