"""Comparing our ids with llama.cpp's, shared by the parity tests."""

from __future__ import annotations

from dualpath.tokenizer.spec import TOKEN_NORMAL


def mismatches(tok, vocab, strings) -> list[tuple[str, bool, list[int], list[int]]]:
    """(text, parse_special, ours, llama.cpp's) for every string whose ids differ.

    ``vocab`` is a ``llama_cpp.Llama(..., vocab_only=True)``; both sides add BOS as the model says.
    The parse_special run is skipped for strings with no character that starts a special token
    of any kind: it cannot change them, and llama.cpp's std::regex pre-tokenizers are slow.
    """
    types = tok.spec.token_types or ()
    starts = {"<", "["} | {t[0] for t, kind in zip(tok.spec.tokens, types) if kind != TOKEN_NORMAL and t}
    out = []
    for s in strings:
        for special in (False, True) if starts.intersection(s) else (False,):
            ours = tok.encode(s, parse_special=special)
            theirs = vocab.tokenize(s.encode("utf-8"), add_bos=True, special=special)
            if ours != theirs:
                out.append((s, special, ours, theirs))
    return out


def describe(found: list) -> str:
    """A short assertion message: the count and the first three mismatches."""
    return f"{len(found)} mismatches, first: {found[:3]}"
