"""runtime.generate.TextStream on the stories260K vocabulary: its deltas are those of a
decoder that read the whole prompt, and making one reads only the prompt's tail."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

import dualpath.tokenizer
from dualpath import SamplingParams
from dualpath.engine.generate import TextStream
from dualpath.tokenizer import StreamDecoder, build_tokenizer, load_llama2c_tokenizer

BOS, EOS = 1, 2
BYTE_TOKENS = range(3, 259)  # <0x00> .. <0xFF>
TOKENIZER_DIR = str(Path(dualpath.tokenizer.__file__).parent)


@pytest.fixture(scope="module")
def tok(tok512_path):
    return build_tokenizer(load_llama2c_tokenizer(tok512_path, vocab_size=512))


def streamed(stream: TextStream, generated: list[int]) -> str:
    return "".join(stream.push(t)[0] for t in generated) + stream.finish(True)


def after_whole_prompt(tok, prompt: list[int], generated: list[int]) -> str:
    """What the generated tokens decode to after a decoder fed every prompt token."""
    dec = StreamDecoder(tok)
    for t in prompt:
        dec.feed(t)
    return "".join(dec.feed(t) for t in generated) + dec.flush()


def random_ids(rnd: random.Random, n: int) -> list[int]:
    """Text, byte and control tokens mixed, so prompts end inside UTF-8 characters, on
    invalid bytes, after runs of tokens without text, or before any text."""
    pick = (lambda: rnd.choice(BYTE_TOKENS), lambda: rnd.randrange(259, 512), lambda: rnd.choice((BOS, EOS)))
    return [rnd.choices(pick, weights=(6, 3, 1))[0]() for _ in range(n)]


def test_deltas_equal_those_after_decoding_the_whole_prompt(tok):
    rnd = random.Random(31)
    params = SamplingParams()
    for _ in range(3000):
        prompt = random_ids(rnd, rnd.randint(1, 12))
        generated = random_ids(rnd, rnd.randint(0, 8))
        assert streamed(TextStream(tok, prompt, params), generated) == after_whole_prompt(tok, prompt, generated), (
            prompt, generated)


def test_a_multibyte_character_split_between_prompt_and_output_is_emitted_whole(tok):
    euro = list(b"\xe2\x82\xac")  # U+20AC as three byte tokens: two end the prompt, one is generated
    prompt = [BOS] + tok.encode("Lily saw", add_bos=False) + [3 + euro[0], 3 + euro[1]]
    assert streamed(TextStream(tok, prompt, SamplingParams()), [3 + euro[2]]) == "\u20ac"


def tokenizer_calls(make) -> int:
    """Calls into the tokenizer package (decode tables, token bytes, stream decoder) while ``make()`` runs."""
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        if event == "call" and frame.f_code.co_filename.startswith(TOKENIZER_DIR):
            calls += 1

    sys.setprofile(profile)
    try:
        make()
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.parametrize("lead", [[BOS], [BOS] * 64], ids=["bos", "64-control-tokens"])
def test_making_a_stream_reads_a_bounded_tail_whatever_the_prompt_length(tok, lead):
    rnd = random.Random(7)
    tail = tok.encode(" and the big tree", add_bos=False) + [3 + 0xE2, 3 + 0x82]  # ends inside a character
    params = SamplingParams(stop=("tree.",))
    counts = {}
    for num_tokens in (16, 16_384):
        prompt = lead + [rnd.randrange(259, 512) for _ in range(num_tokens)] + tail
        counts[num_tokens] = tokenizer_calls(lambda prompt=prompt: TextStream(tok, prompt, params))
        assert streamed(TextStream(tok, prompt, params), [3 + 0xAC]) == "\u20ac"
    # Leading tokens without text are read one lookup each (up to three calls in the packed
    # byte tables and their views), up to the first with text (whether the leading-space rule
    # is spent); the rest of the prompt is never read.
    assert counts[16] == counts[16_384] <= 3 * (16 + len(lead))
