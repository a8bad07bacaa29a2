"""Golden runs: llama2.c run.c's prompt ids, from both stored formats of the stories260K tokenizer."""

from __future__ import annotations

import itertools

import pytest

from dualpath.tokenizer import build_tokenizer


@pytest.mark.parametrize("source", ["gguf", "tok512_bin"])
def test_prompt_ids_match_run_c_for_every_reference_run(source, gguf_spec, tok512_spec, reference_runs):
    tok = build_tokenizer(gguf_spec if source == "gguf" else tok512_spec)
    assert len(reference_runs) == 4
    for run in reference_runs:
        prompt = run["prompt"] or ""  # run.c encodes a missing prompt as ""
        assert tok.encode(prompt) == run["prompt_ids"], run["name"]


def test_gguf_and_tok512_bin_describe_the_same_vocabulary(gguf_spec, tok512_spec):
    assert gguf_spec.tokens == tok512_spec.tokens
    assert gguf_spec.scores == tok512_spec.scores
    assert gguf_spec.token_types == tok512_spec.token_types
    assert (gguf_spec.bos_id, gguf_spec.eos_id, gguf_spec.unk_id) == (1, 2, 0)
    assert (tok512_spec.bos_id, tok512_spec.eos_id, tok512_spec.unk_id) == (1, 2, 0)


def test_once_upon_a_time_encodes_to_the_documented_ids(stories_tok):
    assert stories_tok.encode("Once upon a time") == [1, 403, 407, 261, 378]
    assert stories_tok.encode("Once upon a time", add_bos=False) == [403, 407, 261, 378]


def test_empty_prompt_is_just_bos(stories_tok):
    assert stories_tok.encode("") == [1]
    assert stories_tok.encode("", add_bos=False) == []


def test_decoded_greedy_story_matches_run_c_stdout(stories_tok, reference_runs, models_dir):
    # run.c prints every token after BOS and a final newline; for ASCII-only stories that is decode().
    for run in reference_runs:
        if run["name"] not in ("greedy_noprompt", "greedy_once_upon_a_time", "greedy_one_day_a_little_dog"):
            continue
        expected = (models_dir / "reference" / f"{run['name']}.txt").read_text(encoding="utf-8")
        assert stories_tok.decode(run["prompt_ids"] + run["generated_ids"]) + "\n" == expected, run["name"]


def test_token_bytes_reproduce_run_c_stdout_through_its_safe_printf_filter(stories_tok, reference_runs, models_dir):
    # run.c: strip the leading space of the piece after BOS; safe_printf drops single
    # bytes that are neither printable nor whitespace (why "Zoë" prints as "Zo").
    for run in reference_runs:
        ids = run["prompt_ids"] + run["generated_ids"]
        out = []
        for prev, token_id in itertools.pairwise(ids):
            piece = stories_tok.token_bytes(token_id)
            if prev == 1 and stories_tok.piece(token_id).startswith("\u2581"):
                piece = piece[1:]
            if len(piece) == 1 and not (0x20 <= piece[0] < 0x7F or piece in b" \t\n\v\f\r"):
                continue
            out.append(piece)
        expected = (models_dir / "reference" / f"{run['name']}.txt").read_bytes()
        assert b"".join(out) + b"\n" == expected, run["name"]


def test_stop_ids_are_eos_and_bos_for_llama2c_models(stories_tok, reference_runs):
    assert stories_tok.stop_ids == frozenset({1, 2})
    dog = next(r for r in reference_runs if r["name"] == "greedy_one_day_a_little_dog")
    assert dog["stop"] == "bos_token"  # this story ended when the model emitted BOS
