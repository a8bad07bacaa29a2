"""Fixtures for the tokenizer tests: the shared test models, specs read from them, a string corpus."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dualpath.tokenizer import TokenizerSpec, build_tokenizer, load_llama2c_tokenizer

_NO_ID = 0xFFFFFFFF  # GGUF's "unset" token id






@pytest.fixture(scope="session")
def tok512_bin(model_file) -> Path:
    return model_file("tok512.bin")


@pytest.fixture(scope="session")
def tok512_model(model_file) -> Path:
    return model_file("tok512.model")


@pytest.fixture(scope="session")
def reference_runs(model_file) -> list[dict]:
    import json
    return json.loads(model_file("reference/greedy_token_ids.json").read_text())["runs"]


def spec_from_gguf(path: Path) -> TokenizerSpec:
    """A TokenizerSpec from a GGUF file's tokenizer.ggml.* keys (test helper, not the production loader)."""
    import gguf

    fields = gguf.GGUFReader(str(path)).fields

    def get(key, default=None):
        field = fields.get(f"tokenizer.ggml.{key}")
        return default if field is None else field.contents()

    def token_id(key):
        value = get(key)
        return None if value is None or value == _NO_ID else int(value)

    model = get("model")
    scores, types, merges = get("scores"), get("token_type"), get("merges")
    return TokenizerSpec(
        model=model,
        tokens=tuple(get("tokens")),
        scores=None if scores is None else tuple(scores),
        token_types=None if types is None else tuple(types),
        merges=None if merges is None else tuple(merges),
        bos_id=token_id("bos_token_id"),
        eos_id=token_id("eos_token_id"),
        unk_id=token_id("unknown_token_id"),
        eot_id=token_id("eot_token_id"),
        add_bos=bool(get("add_bos_token", model == "llama")),
        add_eos=bool(get("add_eos_token", False)),
        add_space_prefix=bool(get("add_space_prefix", model == "llama")),
        pre=get("pre"),
    )


@pytest.fixture(scope="session")
def gguf_spec(gguf_path) -> TokenizerSpec:
    return spec_from_gguf(gguf_path)


@pytest.fixture(scope="session")
def tok512_spec(tok512_bin) -> TokenizerSpec:
    return load_llama2c_tokenizer(tok512_bin, vocab_size=512)


@pytest.fixture(scope="session")
def stories_tok(tok512_spec):
    return build_tokenizer(tok512_spec)


_HAND_STRINGS = [
    "", " ", "  ", "   ", "a", "A", "I", ".", "Once upon a time", " Once upon a time", "Once upon a time ",
    "Once  upon   a    time", "One day, a little dog named Max", "Zoë saw a café 🐶",
    "\t", "\n", "\n\n", "\r\n", "a\tb", "line1\nline2\n", "  leading", "trailing  ", " \n ", "\t\t  \n",
    "🐶🐱🐭", "👍🏽", "👨‍👩‍👧", "日本語のテキスト", "中文测试", "Привет, мир!", "مرحبا بالعالم", "שלום", "Ελληνικά",
    "한국어 텍스트", "ñandú", "naïve façade", "e\u0301", "\u00a0nbsp\u00a0", "zero\u200bwidth", "\ufeffbom",
    "\x00nul", "\x7fdel", "\x1cfs\x1f", "\u2028sep\u2029", "\u3000ideographic space", "tab\tsep\tvalues",
    "12345", "3.14159", "1,000,000", "2023-10-05", "0x1F", "phone: +1 (555) 010-9999", "٣٤٥ arabic digits",
    "<s>", "</s>", "<unk>", "<0x41>", "<s>Once</s>", "[INST] hi [/INST]", "<|endoftext|>", "<|user|>hi",
    "it's", "I'm", "we'll", "they've", "You're", "don't", "IT'S", "I'D", "'s", "HELLO WORLD", "hello world!!!",
    "???", "...", "—", "“quoted”", "‘single’", "a-b_c.d", "path/to/file.py", "def f(x):\n    return x**2\n",
    "    indented", '{"json": [1, 2, 3]}', "<html><body>hi</body></html>", "#include <stdio.h>", "C++ and C#",
    "$100 & 50%", "email@example.com", "http://example.com/?q=1&r=2", "ÿ", "\u2581", "\u2581\u2581", "a\u2581b",
    "x" * 100, "ab" * 300, "😀" * 50, "The end.\n\nOnce upon a time,   there was a girl.\tShe smiled!",
]

_WORDS = ["Once", "upon", "a", "time", "there", "was", "little", "girl", "named", "Lily", "dog", "Max", "park",
          "happy", "big", "red", "ball", "She", "He", "They", "said", "play", "mom", "friend", "tree", "sun",
          "café", "naïve", "Zoë", "über", "straße", "日本", "猫", "мир", "😀", "🐶", "🎉", "42", "7", "2024",
          "don't", "it's", "we're", "x86_64", "C++", "e-mail"]
_SEPARATORS = [" ", " ", " ", "", "  ", "   ", "\n", "\t", ", ", ". ", "! ", "? ", " - ", "\n\n", " \n", "\u00a0"]


def _generated_strings(count: int, seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 30)):
            parts.append(rng.choice(_WORDS) if rng.random() < 0.8 else chr(rng.choice(
                [rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x24f), rng.randint(0x370, 0x4ff),
                 rng.randint(0x4e00, 0x4fff), rng.randint(0x1f300, 0x1f64f)])))
            parts.append(rng.choice(_SEPARATORS))
        text = "".join(parts)
        out.append(text if rng.random() < 0.7 else text.strip())
    return out


def parity_strings() -> list[str]:
    """250+ varied strings: unicode, emoji, whitespace runs, tabs/newlines, digits, empty, long."""
    long_story = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
                  "One day, she saw a big, red ball 🎈 and said: \"Can I play?\"\n\n") * 40
    return _HAND_STRINGS + _generated_strings(170) + [long_story, "  ".join(_WORDS) * 20]


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    return parity_strings()
