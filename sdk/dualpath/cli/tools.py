"""``dualpath tokenize``, ``dualpath embed``, ``dualpath rerank`` and ``dualpath synth``."""

from __future__ import annotations

import json
import os
import sys
import time

from .common import config_from_args, model_path


def cmd_tokenize(args) -> int:
    from ..models import load_model
    from ..tokenizer import build_tokenizer

    spec = load_model(model_path(args), args.tokenizer)
    tok = build_tokenizer(spec.tokenizer)
    ids = tok.encode(args.text, add_bos=not args.no_bos)
    if args.ids_only:
        print(json.dumps(ids))
    else:
        for i in ids:
            print(f"{i:>8} {spec.tokenizer.tokens[i]!r}")
    return 0

def cmd_embed(args) -> int:
    """One JSON line per text: its index, token count and vector (or a vector per token
    when the file's pooling is none)."""
    from ..llm import LLM

    llm = LLM(model_path(args), config_from_args(args))
    texts = args.text if args.text else [line.rstrip("\n") for line in sys.stdin]
    vectors = llm.embed(texts, normalize=not args.no_normalize, truncate=args.truncate)
    for i, (text, v) in enumerate(zip(texts, vectors)):
        print(json.dumps({"index": i, "tokens": len(llm.tokenize(text)), "embedding": v.tolist()}))
    return 0


def cmd_rerank(args) -> int:
    """One JSON line per document, best first: its index, relevance score and text."""
    from ..llm import LLM

    llm = LLM(model_path(args), config_from_args(args))
    docs = args.document if args.document else [line.rstrip("\n") for line in sys.stdin]
    for r in llm.rerank(args.query, docs, args.top_n, truncate=args.truncate):
        print(json.dumps({"index": r.index, "relevance_score": r.relevance_score, "document": r.document},
                         ensure_ascii=False))
    return 0


def cmd_synth(args) -> int:
    from ..models.synth import preset_for, synth_gguf

    t0 = time.perf_counter()
    if args.vision:
        return _synth_vision(args, t0)
    try:
        preset = preset_for(args.arch, args.preset)
    except ValueError as e:
        print(f"dualpath synth: {e}", file=sys.stderr)
        return 2
    try:
        path = synth_gguf(args.out, preset, args.type, seed=args.seed, context_length=args.ctx)
    except RuntimeError as e:  # an optional package it needs is missing (sentencepiece, llama-cpp-python)
        print(f"dualpath synth: {e}", file=sys.stderr)
        return 1
    print(f"wrote {path} ({os.path.getsize(path) / 2**20:.1f} MiB, {preset}, {args.type.upper()}, "
          f"seed {args.seed}) in {time.perf_counter() - t0:.1f}s — random weights: its text is noise")
    return 0


def _synth_vision(args, t0: float) -> int:
    from ..models.synth_vision import VISION_PRESETS, synth_mmproj, synth_text

    if args.preset or args.arch or args.ctx:
        print("dualpath synth: --vision writes a projector file, and with --text its text model (preset "
              f"{VISION_PRESETS[args.vision].text_preset}); --preset, --arch and --ctx do not apply", file=sys.stderr)
        return 2
    try:
        path = synth_mmproj(args.out, args.vision, args.type, seed=args.seed)
    except ValueError as e:
        print(f"dualpath synth: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path} ({os.path.getsize(path) / 2**20:.1f} MiB, {args.vision} projector, {args.type.upper()}, "
          f"seed {args.seed}) in {time.perf_counter() - t0:.1f}s")
    if args.text:
        try:
            text = synth_text(args.text, args.vision, args.text_type, seed=args.seed)
        except RuntimeError as e:  # llama-cpp-python quantizes the K-quant types
            print(f"dualpath synth: {e}", file=sys.stderr)
            return 1
        print(f"wrote {text} ({os.path.getsize(text) / 2**20:.1f} MiB, {VISION_PRESETS[args.vision].text_preset}, "
              f"{args.text_type}): the text model; run both with -m {text} --mmproj {path}")
    else:
        print(f"its text model: --text FILE (preset {VISION_PRESETS[args.vision].text_preset}, with its image markers)")
    return 0
