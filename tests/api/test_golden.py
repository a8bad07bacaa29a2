"""Golden runs: greedy decoding of stories260K reproduces karpathy/llama2.c run.c exactly.

References (``$DUALPATH_TEST_MODELS/reference``, see its README): run.c's token ids, stop
reasons, stdout and the first five logits rows, for the same model in both file formats.
"""

from __future__ import annotations

import numpy as np
import pytest

from dualpath import SamplingParams
from tests_shared import assert_golden_ids

BOS = 1
STEPS = 256  # run.c -n 256: prompt + generated positions
FORMATS = ["gguf", "bin"]
KV_DTYPES = ["f32", "f16"]
KV_F32 = {"kv_cache.kv_dtype": "f32"}
# run.c keeps K and V in float32: with an f32 KV cache we match it to float32 rounding. An f16
# cache rounds K and V to 11 significant bits (relative 2^-11), which moves these logits by up to
# ~8e-3 (measured); the argmax, and every golden greedy id, still match.
LOGITS_ATOL = {"f32": 1e-4, "f16": 2e-2}


def greedy_params(num_prompt_tokens: int) -> SamplingParams:
    # run.c's last generated token is never fed back, hence the + 1.
    return SamplingParams(temperature=0, max_tokens=STEPS - num_prompt_tokens + 1)


def run_c_safe_print(tokenizer, ids) -> str:
    """run.c's stdout for ``ids`` (BOS first): its decode + ``safe_printf``, which drops a
    byte-fallback piece whose single byte is not printable ASCII or whitespace."""
    out = []
    prev = ids[0]
    for tok in ids[1:]:
        piece = tokenizer.spec.tokens[tok].replace("\u2581", " ")
        if prev == BOS and piece.startswith(" "):
            piece = piece[1:]
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            byte = int(piece[3:5], 16)
            piece = chr(byte) if 0x20 <= byte < 0x7F or chr(byte) in " \t\n\v\f\r" else ""
        out.append(piece)
        prev = tok
    return "".join(out) + "\n"


@pytest.mark.parametrize("fmt", FORMATS)
def test_prompt_tokenizes_to_run_c_prompt_ids(shared_llms, reference_run, fmt):
    llm = shared_llms(fmt, "f16")
    assert llm.tokenize(reference_run["prompt"] or "") == reference_run["prompt_ids"]


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_greedy_generation_reproduces_run_c_ids_and_stop(shared_llms, reference_run, fmt, kv_dtype):
    llm = shared_llms(fmt, kv_dtype)
    prompt_ids = reference_run["prompt_ids"]
    c = llm.generate(prompt_ids, greedy_params(len(prompt_ids)))
    expected = reference_run["generated_ids"]
    got = list(c.token_ids)
    first_diff = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
    assert_golden_ids(got, expected, prompt_ids, kv_dtype, lambda: shared_llms(fmt, "f32").runner,
                      f"{fmt}/{kv_dtype}: {len(got)} ids vs {len(expected)} expected, first difference at "
                      f"generated index {first_diff}")
    if got != expected:  # parted at a near-tie: the stop is past it
        return
    assert c.prompt_token_ids == tuple(prompt_ids)
    if reference_run["stop"] == "bos_token":
        assert (c.finish_reason, c.stop_reason) == ("stop", BOS)
    else:
        assert reference_run["stop"] == "steps"
        assert (c.finish_reason, c.stop_reason) == ("length", None)
        assert len(prompt_ids) + len(got) == STEPS + 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_prompt_and_completion_text_equal_run_c_stdout(shared_llms, reference_run, reference_dir, fmt):
    llm = shared_llms(fmt, "f32")
    prompt_ids = reference_run["prompt_ids"]
    c = llm.generate(prompt_ids, greedy_params(len(prompt_ids)))
    ours = llm.detokenize(prompt_ids) + c.text + "\n"
    expected = (reference_dir / reference_run["stdout_file"]).read_bytes().decode("utf-8")
    # Our decode applied to the same ids, with run.c's printing rule, is run.c's stdout.
    assert run_c_safe_print(llm.tokenizer, list(prompt_ids) + list(c.token_ids)) == expected
    if ours.isascii():
        assert ours == expected
    else:
        # run.c prints no byte-fallback character (here the ë of Zoë and the emoji): ours are
        # whole; without the characters that only byte tokens can spell, the texts are equal.
        spelled = {ch for t in llm.tokenizer.spec.tokens for ch in t.replace("\u2581", " ")}
        assert "\ufffd" not in ours
        assert "".join(ch for ch in ours if ch.isascii() or ch in spelled) == expected
        assert reference_run["name"] == "greedy_zoe_cafe" and "Zoë saw a café 🐶" in ours


def _reference_rows(reference_logits) -> np.ndarray:
    assert reference_logits["input_ids"] == [1, 403, 407, 261, 378]
    rows = np.asarray(reference_logits["logits"], np.float64)  # (5, vocab)
    assert rows.shape == (5, 512)
    return rows


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_logits_fed_one_token_per_step_match_run_c(make_llm, reference_logits, fmt, kv_dtype):
    rows = _reference_rows(reference_logits)
    runner = make_llm(fmt, {"kv_cache.kv_dtype": kv_dtype}).runner  # fresh: position 0
    got = np.stack([runner.forward([tok])[0].copy() for tok in reference_logits["input_ids"]])
    np.testing.assert_allclose(got, rows, rtol=0, atol=LOGITS_ATOL[kv_dtype])
    assert list(got.argmax(axis=1)) == [403, 407, 261, 378, 432]


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_logits_of_one_prefill_with_all_logits_match_run_c(make_llm, reference_logits, fmt, kv_dtype):
    rows = _reference_rows(reference_logits)
    runner = make_llm(fmt, {"kv_cache.kv_dtype": kv_dtype}).runner
    got = runner.forward(reference_logits["input_ids"], all_logits=True).copy()
    assert got.shape == (5, 512)
    np.testing.assert_allclose(got, rows, rtol=0, atol=LOGITS_ATOL[kv_dtype])
    assert list(got.argmax(axis=1)) == [403, 407, 261, 378, 432]


def test_prefill_without_all_logits_returns_only_the_last_row(make_llm, reference_logits):
    ids = reference_logits["input_ids"]
    last = make_llm("gguf", KV_F32).runner.forward(ids)
    assert last.shape == (1, 512)
    every = make_llm("gguf", KV_F32).runner.forward(ids, all_logits=True)
    # Not bit-equal: one row and five rows go through different GEMM shapes.
    np.testing.assert_allclose(last[0], every[-1], rtol=0, atol=1e-5)
