"""The argument parser: every subcommand, its options, and the function it runs."""

from __future__ import annotations

import argparse
import os

from .cache import cmd_cache
from .common import memory_budget
from .generate import cmd_chat, cmd_run
from .info import cmd_info
from .serve import cmd_serve
from .tools import cmd_embed, cmd_rerank, cmd_synth, cmd_tokenize


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dualpath", description="On-device LLM inference on the CPU.")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the library does")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="generate text from a prompt, streamed to stdout")
    model_args(r)
    config_args(r)
    r.add_argument("prompt", nargs="?", help="the prompt (default: empty, i.e. start from BOS)")
    vision_args(r)
    r.add_argument("--image", action="append", metavar="FILE",
                   help="a PNG or JPEG for a model given --mmproj, at the prompt's <__media__> marker, or before "
                        "the prompt (repeatable)")
    r.add_argument("-n", "--max-tokens", type=int, help="tokens to generate (default: up to --steps)")
    r.add_argument("--steps", type=int, default=256,
                   help="stop when prompt + generated reach this many positions, as llama2.c's -n (default 256)")
    sampling_args(r, temperature=0.8)
    r.add_argument("--stop", action="append", help="stop string (repeatable)")
    r.add_argument("--ignore-eos", action="store_true")
    r.add_argument("--no-echo", dest="echo", action="store_false", help="do not print the prompt before the output")
    r.add_argument("--verbose", dest="load_report", action="store_true",
                   help="print the load time split into its stages (and log what the library does, as -v)")
    r.set_defaults(func=cmd_run)

    ch = sub.add_parser("chat", help="an interactive conversation in the terminal (piped: one reply per line)")
    model_args(ch)
    config_args(ch)
    vision_args(ch)
    ch.add_argument("--system", help="a system prompt")
    ch.add_argument("-n", "--max-tokens", type=int, default=512, help="tokens a reply may take (default 512)")
    sampling_args(ch, temperature=0.7)
    ch.set_defaults(func=cmd_chat)

    add_cache_parser(sub)

    t = sub.add_parser("tokenize", help="print the token ids of a text")
    model_args(t)
    t.add_argument("text")
    t.add_argument("--no-bos", action="store_true")
    t.add_argument("--ids-only", action="store_true", help="print a JSON list of ids")
    t.set_defaults(func=cmd_tokenize)

    e = sub.add_parser("embed", help="embeddings of texts from an embedding model (BERT, nomic-bert, "
                       "Qwen3-Embedding): JSON lines")
    model_args(e)
    config_args(e)
    e.add_argument("text", nargs="*", help="texts to embed (default: one per line of standard input)")
    e.add_argument("--no-normalize", action="store_true", help="the pooled vectors as they are (default: L2 norm 1)")
    e.add_argument("--truncate", action="store_true",
                   help="cut a text longer than the model's positions (default: refuse it)")
    e.set_defaults(func=cmd_embed)

    r = sub.add_parser("rerank", help="documents scored against a query by a reranker (a cross-encoder, "
                       "Qwen3-Reranker): JSON lines, best first")
    model_args(r)
    config_args(r)
    r.add_argument("query")
    r.add_argument("document", nargs="*", help="documents to score (default: one per line of standard input)")
    r.add_argument("--top-n", type=int, default=None, help="print the best N only (default: every document)")
    r.add_argument("--truncate", action="store_true",
                   help="cut a document whose pair is longer than the model's positions (default: refuse it)")
    r.set_defaults(func=cmd_rerank)

    i = sub.add_parser("info", help="versions, CPU features, kernels, and a model's hyper-parameters")
    model_args(i)
    config_args(i)
    i.set_defaults(func=cmd_info)

    add_synth_parser(sub)

    sv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (needs the [server] extra)")
    model_args(sv)
    vision_args(sv)
    config_args(sv)
    serve_options(sv)

    from ..bench import add_bench_parser

    add_bench_parser(sub)
    return p


def config_args(sp) -> None:
    """The config options every model-loading subcommand takes."""
    from ..config import CHAT_TEMPLATES, REASONING_FORMATS, SPECULATIVE_MODES
    from ..kernels import KV_DTYPE_DOCS, KV_DTYPES

    sp.add_argument("-c", "--config", help="YAML config file (see configs/default.yaml)")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override a config key, e.g. runtime.num_threads=2")
    sp.add_argument("-t", "--threads", type=int, help="threads (runtime.num_threads)")
    sp.add_argument("--ctx-size", type=int, help="context window in tokens (runtime.max_context_tokens)")
    sp.add_argument("--kv-dtype", choices=KV_DTYPES, help="KV cache element type (kv_cache.kv_dtype; "
                    + "; ".join(f"{n} = {doc}" for n, doc in KV_DTYPE_DOCS.items()) + ")")
    sp.add_argument("--memory-budget", metavar="MIB|auto", type=memory_budget,
                    help="resident memory the model may take (runtime.memory_budget_mb): the largest context "
                    "and KV type that fit are used, or the load is refused before any weight is read; auto: "
                    "what MemAvailable allows, less headroom for the OS")
    sp.add_argument("--chat-template", choices=CHAT_TEMPLATES,
                    help="a built-in chat template instead of the model's (runtime.chat_template)")
    sp.add_argument("--speculative", choices=SPECULATIVE_MODES, help="speculative decoding "
                    "(runtime.speculative): ngram proposes tokens from the request's own text, draft from "
                    "--draft-model; same output, faster where the proposals are right")
    sp.add_argument("--draft-model", help="a smaller GGUF with the same vocabulary (runtime.draft_model; "
                    "implies --speculative draft)")
    sp.add_argument("--reasoning-format", choices=REASONING_FORMATS, help="a thinking model's <think>...</think>: "
                    "deepseek (or auto) returns it apart (reasoning_content), none leaves it in the text "
                    "(reasoning.format)")
    sp.add_argument("--reasoning-budget", type=int, metavar="TOKENS", help="most tokens a reply may think before "
                    "its closing marker is written for it (reasoning.budget_tokens; -1: no limit, 0: no thinking)")
    disk = sp.add_mutually_exclusive_group()
    disk.add_argument("--prefix-cache", metavar="DIR", help="keep prompt pages on disk in DIR, so that a "
                      "restarted process reuses a prefix it saw (prefix_cache.dir; on by default in serve)")
    disk.add_argument("--no-prefix-cache", action="store_true", help="no prefix pages on disk "
                      "(prefix_cache.use: never)")


def model_args(sp) -> None:
    """Which model: ``-m FILE`` or ``-hf REPO``, and a llama2.c checkpoint's tokenizer."""
    which = sp.add_mutually_exclusive_group()
    which.add_argument("-m", "--model", help="a .gguf file, a llama2.c .bin, or synth:PRESET (random weights, "
                       "real shapes; presets as for synth). Default: the built-in stories260K.gguf")
    which.add_argument("-hf", "--hf-repo", metavar="REPO[:QUANT]", help="a GGUF from the Hugging Face Hub, e.g. "
                       "bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M (default quant Q4_K_M; REPO:FILE.gguf "
                       "names a file; cached by huggingface_hub, HF_HUB_OFFLINE=1 to use the cache only)")
    sp.add_argument("--tokenizer", help="tokenizer for a llama2.c checkpoint (default: tok<vocab>.bin beside it)")


def vision_args(sp) -> None:
    """A text model's image projector (llama.cpp's ``--mmproj``)."""
    sp.add_argument("--mmproj", metavar="FILE", help="the model's image projector GGUF (as llama.cpp's --mmproj): "
                    "the model then takes images (needs the [vision] extra); with -hf, the repository's is found")
    sp.add_argument("--no-mmproj", action="store_true", help="with -hf: leave the repository's projector file out")


def sampling_args(sp, temperature: float) -> None:
    """The sampling options of ``run`` and ``chat`` (``SamplingParams``, built by ``sampling_from_args``)."""
    sp.add_argument("--temperature", type=float, default=temperature)
    sp.add_argument("--top-k", type=int, default=40)
    sp.add_argument("--top-p", type=float, default=0.95)
    sp.add_argument("--min-p", type=float, default=0.05)
    sp.add_argument("--repeat-penalty", type=float, default=1.0)
    sp.add_argument("--seed", type=int)


def add_cache_parser(sub) -> None:
    c = sub.add_parser("cache", help="the converted-model cache and the prefix pages on disk: list, remove, prune")
    c.add_argument("--dir",
                   help="the cache folder (default: model_cache.dir, $DUALPATH_CACHE_DIR or ~/.cache/dualpath/models)")
    c.add_argument("--prefix-dir",
                   help="the prefix pages' folder (default: prefix_cache.dir or ~/.cache/dualpath/prefix)")
    csub = c.add_subparsers(dest="cache_command", required=True)
    csub.add_parser("ls", help="list entries (key, size, last use, source file, graphs) and prefix stores")
    crm = csub.add_parser("rm", help="remove entries or prefix stores by key (or --all)")
    crm.add_argument("keys", nargs="*")
    crm.add_argument("--all", action="store_true")
    cpr = csub.add_parser("prune",
                          help="remove least recently used entries down to a size, and stale temporary folders")
    cpr.add_argument("--max-size-gb", type=float, help="default: model_cache.max_size_gb")
    cpr.add_argument("--prefix-max-size-gb", type=float, help="prefix pages kept, least recently used "
                     "removed first (default: prefix_cache.max_size_gb)")
    c.set_defaults(func=cmd_cache)


def add_synth_parser(sub) -> None:
    from ..models.synth import LLAMA_CPP_TYPES, PRESETS, TYPES
    from ..models.synth_vision import VISION_PRESETS

    s = sub.add_parser("synth", help="write a GGUF with random weights and real shapes (for benchmarks)")
    s.add_argument("--preset", choices=list(PRESETS),
                   help="a shape (default: stories15M, or the --arch family's tiny test shape)")
    s.add_argument("--vision", choices=list(VISION_PRESETS),
                   help="write a projector file (llama.cpp's --mmproj) of this vision model instead, "
                        "F32, F16 or Q8_0; --text writes its text model beside it")
    s.add_argument("--text", metavar="FILE", help="with --vision: also write the pair's text model here (the "
                   "preset of the width it projects to, with the markers its images need)")
    s.add_argument("--text-type", default="Q8_0", type=str.upper, choices=list(TYPES + LLAMA_CPP_TYPES),
                   help="the --text model's weight type (default Q8_0)")
    s.add_argument("--arch", choices=sorted({p.arch for p in PRESETS.values()}),
                   help="model family (GGUF general.architecture)")
    s.add_argument("--type", default="F32", type=str.upper, choices=list(TYPES + LLAMA_CPP_TYPES),
                   help=f"{', '.join(LLAMA_CPP_TYPES)} are quantized by llama.cpp (needs llama-cpp-python)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--ctx", type=int, help="context_length to record (default: the preset's)")
    s.add_argument("-o", "--out", required=True)
    s.set_defaults(func=cmd_synth)


def serve_options(sv) -> None:
    """``serve``'s own options, after the model and config ones."""
    sv.add_argument("--host", help="bind address (server.host, default 127.0.0.1: loopback only)")
    sv.add_argument("--port", type=int, help="TCP port (server.port, default 8080)")
    sv.add_argument("--alias", help="the model id /v1/models lists and responses carry (server.model_name; "
                                    "default: the file's name). Requests may name any model unless "
                                    "server.strict_model_name is true")
    key = sv.add_mutually_exclusive_group()
    key.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (server.api_key). Other local users "
                     "see a command line in ps: prefer env DUALPATH_API_KEY or --api-key-file",
                     default=os.environ.get("DUALPATH_API_KEY") or None)
    key.add_argument("--api-key-file", metavar="FILE", help="require the key held in FILE (server.api_key_file)")
    sv.add_argument("--allowed-hosts", metavar="NAMES", help="Host names answered besides localhost, 127.0.0.1 "
                    "and [::1], joined by commas (server.allowed_hosts; a loopback bind refuses any other, "
                    "against DNS rebinding; * = any)")
    sv.add_argument("--no-webui", action="store_true", help="no chat page at / (server.webui: false)")
    sv.add_argument("--embedding-model", metavar="FILE", help="an embedding model (bert, nomic-bert GGUF) "
                    "answering /v1/embeddings beside the chat model (server.embedding_model)")
    sv.add_argument("--embeddings", action="store_true", help="without --embedding-model: answer /v1/embeddings "
                    "from the chat model's pooled hidden states (server.embeddings: on; by default only when its "
                    "file declares a pooling type, as a decoder trained as an embedder does)")
    sv.add_argument("--embedding-dimensions", metavar="SIZES", help="shorter sizes a request's dimensions may ask "
                    "of a Matryoshka-trained embedding model, e.g. 512,256,128 (server.embedding_dimensions)")
    sv.set_defaults(func=cmd_serve)
