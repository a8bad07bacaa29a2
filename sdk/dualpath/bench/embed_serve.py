"""``dualpath bench embed-serve``: how much an embedding model's work slows the chats it
is served beside (``dualpath serve --embedding-model``).

One process, as the server wires it (server/embeddings.py ``Embeddings``): the chat model's
engine runs in its background loop with the encoder's queue attached. Per repeat, ``--chats``
greedy chats decode ``--tokens`` tokens each, first alone, then while clients keep
``--clients`` batches of ``--batch`` texts in the queue (each client sends its next batch
as soon as the last is answered). Decode tokens/s counts from each chat's first generated
token to its last. Medians of ``--repeats``, and the ratio alone / beside embeddings:
``runtime.encoder_share`` bounds it at 1 + share.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time

from .common import write_json

WORDS = ("the city river music film game team world play life people family work part number group area book "
         "high small large long great little old right left good best last next early late year home word name "
         "line end point case fact hand place week company system program question").split()


def _texts(n: int, words: int, seed: int) -> list[str]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [" ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), words)) for _ in range(n)]


def _decode_rates(llm, prompt_ids: list[int], chats: int, tokens: int) -> list[float]:
    """Decode tokens/s of ``chats`` greedy chats run at once."""
    from ..sampling_params import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    rates: list[float] = [0.0] * chats

    def chat(k: int) -> None:
        gen = llm.stream(prompt_ids, params)
        first = None
        for _ in gen:
            if first is None:
                first = time.perf_counter()
        assert first is not None and gen.completion is not None
        n = gen.completion.usage.completion_tokens
        rates[k] = (n - 1) / max(time.perf_counter() - first, 1e-9)

    threads = [threading.Thread(target=chat, args=(k,)) for k in range(chats)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rates


class _Feeder:
    """``clients`` threads, each keeping one batch of texts in the encoder queue."""

    def __init__(self, embeddings, batch_ids: list[list[int]], clients: int):
        from ..engine.encoder_queue import EmbedJob

        self.queue, self.stop = embeddings.queue, threading.Event()

        def client() -> None:
            while not self.stop.is_set():
                done = threading.Event()
                self.queue.submit(EmbedJob(batch_ids, lambda r, e, done=done: done.set(), embeddings.pooling))
                done.wait()

        self.threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]

    def __enter__(self):
        self.t0, self.items0 = time.perf_counter(), self.queue.items_run
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        # Texts the encoder ran while the feeder was on (the batches in flight finish after).
        self.texts_per_s = (self.queue.items_run - self.items0) / (time.perf_counter() - self.t0)
        self.stop.set()
        for t in self.threads:
            t.join()


def cmd_bench_embed_serve(args) -> int:
    from ..config import load_config, parse_overrides
    from ..llm import LLM
    from ..server.embeddings import Embeddings, load_embedder

    emb_path = args.embedding_model
    if not emb_path:
        from ..models.synth import synth_gguf

        emb_path = os.path.join(tempfile.gettempdir(), "dualpath-bench-all-minilm-l6-F16.gguf")
        if not os.path.exists(emb_path):
            synth_gguf(emb_path, "all-minilm-l6", "F16")
    overrides = {"runtime.num_threads": args.threads, "runtime.max_context_tokens": args.ctx,
                 "runtime.max_num_seqs": max(args.chats, 1), "server.embedding_model": emb_path,
                 "runtime.encoder_share": args.share, **parse_overrides(args.set)}
    cfg = load_config(None, overrides)
    embedder = load_embedder(cfg)
    llm = LLM(args.model, cfg)
    embeddings = Embeddings(llm, embedder)  # the queue attached to the chat engine, as `serve` does
    llm.engine.start()
    batch_ids = [embedder.tokenize(t) for t in _texts(args.batch, args.words, 0)]
    prompt_ids = llm.tokenize("Once upon a time, in a small village at the edge of a great forest, there lived")
    print(f"chat {os.path.basename(args.model)}: {args.chats} greedy chat(s) x {args.tokens} tokens; embedder "
          f"{os.path.basename(emb_path)}: {args.clients} client(s) x {args.batch} texts of "
          f"{statistics.mean(map(len, batch_ids)):.0f} tokens; {args.threads} threads, encoder_share {args.share}",
          flush=True)
    _decode_rates(llm, prompt_ids, args.chats, 8)  # warm-up: both models' first runs
    with _Feeder(embeddings, batch_ids, 1):
        time.sleep(0.5)
    rows = []
    for r in range(args.repeats):
        alone = statistics.mean(_decode_rates(llm, prompt_ids, args.chats, args.tokens))
        with _Feeder(embeddings, batch_ids, args.clients) as feed:
            beside = statistics.mean(_decode_rates(llm, prompt_ids, args.chats, args.tokens))
        texts_s = feed.texts_per_s
        rows.append({"alone_tok_s": alone, "beside_tok_s": beside, "slowdown": alone / beside,
                     "texts_per_s_beside": texts_s})
        print(f"  repeat {r + 1}: decode {alone:.1f} tok/s alone, {beside:.1f} tok/s beside embeddings "
              f"({alone / beside:.2f}x slower); {texts_s:.0f} texts/s embedded meanwhile", flush=True)
    with _Feeder(embeddings, batch_ids, args.clients) as feed:
        time.sleep(args.embed_seconds)
    alone_texts_s = feed.texts_per_s
    med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
    print(f"median: decode {med['alone_tok_s']:.1f} -> {med['beside_tok_s']:.1f} tok/s ({med['slowdown']:.2f}x "
          f"slower, bound {1 + args.share:.2f}x); embeddings {med['texts_per_s_beside']:.0f} texts/s beside chats, "
          f"{alone_texts_s:.0f} texts/s alone")
    embeddings.shutdown()
    llm.engine.shutdown()
    write_json(args.json, {"rows": rows, "median": med, "embed_texts_per_s_alone": alone_texts_s,
                           "model": args.model, "embedding_model": emb_path, "threads": args.threads})
    return 0


def add_parser(bs) -> None:
    s = bs.add_parser("embed-serve", help="chat decode speed alone and while an embedding model beside it "
                                          "embeds batches of texts (serve --embedding-model)")
    s.add_argument("-m", "--model", required=True, help="the chat model (GGUF)")
    s.add_argument("--embedding-model", help="the embedding model (default: an all-minilm-l6 F16 synth)")
    s.add_argument("--chats", type=int, default=1, help="chats decoding at once")
    s.add_argument("--tokens", type=int, default=128, help="greedy tokens per chat")
    s.add_argument("--batch", type=int, default=64, help="texts per embedding request")
    s.add_argument("--words", type=int, default=24, help="words per text")
    s.add_argument("--clients", type=int, default=2, help="embedding requests kept in flight")
    s.add_argument("--share", type=float, default=0.3, help="runtime.encoder_share")
    s.add_argument("--embed-seconds", type=float, default=3.0, help="seconds of embedding alone (no chat)")
    s.add_argument("--ctx", type=int, default=1024)
    s.add_argument("-t", "--threads", type=int, default=2)
    s.add_argument("-r", "--repeats", type=int, default=3)
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help="a config override (repeatable)")
    s.add_argument("--json", help="also write the figures as JSON here")
    s.set_defaults(func=cmd_bench_embed_serve)
