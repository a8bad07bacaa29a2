"""The tokenizer parity corpus: hand-written hard cases plus deterministic generated mixes.

One place for every tokenizer test that compares ids with a reference (llama.cpp,
SentencePiece). ``parity_corpus()`` is what the ``corpus`` fixture returns;
``training_text()`` feeds the vocabularies the tests train, so that merges fire across
scripts, digits, whitespace and code.

Runs that one regex alternative matches in a single piece stay below 2,000 characters:
llama.cpp's ``std::regex`` path (gpt-4o, default, tekken, deepseek-v3) overflows the stack
on much longer ones (it crashed at 100,000 spaces with llama-cpp-python 0.3.36).
"""

from __future__ import annotations

import random
import unicodedata

EMPTY_AND_SINGLE = [
    "", " ", "a", "A", "z", "0", "9", ".", ",", "'", '"', "-", "_", "/", "\\", "<", ">", "|", "`", "$", "\n", "\t",
    "\r", "é", "ß", "日", "한", "😀", "\u0301", "\u200d", "\ufeff", "\x00", "\x01", "\x7f", "ÿ", "\u2581", "\ufffd",
]

WHITESPACE = [
    "  ", "   ", "    ", "     ", "        ", " " * 16, " " * 33, "\t\t", "\t \t", "\r\n", "\r\n\r\n", "\n\n",
    "\n\n\n", "\n\n\n\n", "\r\r\n", "\n\r", " \n", "\n ", " \n ", "\n \n", "  \n  ", " \n\n ", "\t\n", "\n\t",
    "a b", "a  b", "a   b", "a\tb", "a \tb", "a\t b", "a\nb", "a \nb", "a\n b", "a\n\n\nb", "a \n\n b", "a\r\nb",
    "  leading", "trailing  ", "  both  ", " x ", "\tindented with a tab", "\n\tfoo", " \tfoo", "\t\tfoo", "foo\n",
    "foo \n", "foo  \n  bar", "line1\r\nline2\r\n", "x\n\n\n\ny", "  \t  \n\t", "\u00a0", "a\u00a0b", "\u00a0\u00a0a",
    " \u00a0 ", "nbsp\u00a0\u00a0end", "\u2000\u2001\u2002\u2003", "a\u2009b", "a\u200ab", "\u202fx\u205fy",
    "\u3000ideographic\u3000space", "a\u3000\u3000b", "\u1680ogham", "\u0085next line", "a\u2028b\u2029c",
    "\x0bvt\x0cff", "\x1c\x1d\x1e\x1f x", "zero\u200bwidth", "a \u200b b", "\u180emongolian", "tab\tsep\tvalues\n",
    " " * 200 + "x", "\n" * 60, "\t" * 40 + "y",
]

DIGITS = [
    *("1234567890123456789012"[:n] for n in range(1, 23)),
    "0", "00", "007", "1,000", "1,234,567.89", "1.000.000,00", "1 000 000", "1_000_000", "1'000'000", "0x7fff",
    "0XDEADBEEF", "0b1011", "0o755", "1e-10", "6.022e23", "-42", "+3.14", "3/4", "2024-01-31", "12:34:56.789",
    "v1.2.3-rc.4", "192.168.0.1", "::1", "+1 (555) 010-9999", "٣٤٥", "١٢٣٤٥٦٧", "१२३४", "１２３４５", "²³", "½ ¾",
    "Ⅻ ⅷ", "①②③", "一二三", "a1b22c333d4444e55555", "abc123def", "$1,299.99", "50%", "1st 2nd 3rd 4th",
    "9" * 40, "3.14159265358979323846264338327950288419716939937510", "2^64 = 18446744073709551616",
    "x86_64", "utf-8", "ISO-8859-1", "H2O", "E=mc²", "99 bottles", " 1", " 12", "  123", "\n1234",
]

CONTRACTIONS = [
    "it's", "IT'S", "It'S", "iT's", "don't", "DON'T", "Don'T", "we'll", "WE'LL", "we'Ll", "they've", "THEY'VE",
    "you're", "YOU'RE", "You'Re", "I'm", "I'M", "I'd", "I'D", "'s", "'S", "'t", "'T", "'re", "'ll", "'ve", "'m", "'d",
    "'", "''", "'''s", "'x", "rock'n'roll", "O'Neill's", "'hello'", "l'homme", "dell'arte", "it’s", "can't've",
    "y'all'd've", "students' books", "'90s", "don't!", "I'M HERE, YOU'RE THERE", "ǅemal's", "mañana's",
    "ПРИВЕТ'S", "日本's",
]

UNICODE = [
    "日本語のテキスト", "中文测试，标点符号。", "漢字とカタカナとひらがな", "東京タワーは333メートルです。",
    "한국어 텍스트입니다",
    "Привет, мир!", "приВет", "ПРИВЕТмир", "Ελληνικά γράμματα", "ΑΒΓαβγ", "مرحبا بالعالم", "العربية: ١٢٣",
    "שלום עולם", "नमस्ते दुनिया", "हिन्दी में लिखा गया", "ภาษาไทยง่ายนิดเดียว", "বাংলা ভাষা", "தமிழ் மொழி",
    "ქართული ენა", "Հայերեն", "አማርኛ", "ລາວ", "ᠮᠣᠩᠭᠣᠯ", "Tiếng Việt có dấu", "Zoë saw a café 🐶", "naïve façade",
    "Straße über Äpfel", "ñandú", "Ærøskøbing", "İstanbul ıi", "ǅ ǈ ǋ", "ﬁle ﬂow", "ＡＢＣ ａｂｃ", "𝐀𝐁𝐂 𝟏𝟐𝟑",
    "ASCII日本語mixed", "camelCaseWord", "HTTPServerError", "XMLHttpRequest", "iPhone", "McDonald's", "ÉCOLE école",
    "e\u0301", "cafe\u0301", "n\u0303", "A\u030a", "\u1112\u1161\u11ab\u1100\u1173\u11af",
    "Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d\u0308\u0307l\u036e\u0312\u036bg\u030c\u0317\u035a",
    "😀", "😀😃😄", "👍🏽", "👍🏻👍🏼👍🏽👍🏾👍🏿", "👨‍👩‍👧‍👦", "👩🏾‍💻", "🧑‍🤝‍🧑", "🏳️‍🌈", "🇯🇵🇺🇸🇩🇪", "❤️", "I ❤️ NY",
    "1️⃣ #️⃣ *️⃣", "©®™", "→ ← ↔ ⇒", "∀x∈ℝ: x²≥0", "…", "— – ‐", "“quoted” ‘single’ «guillemets» „low“",
    "¿Qué? ¡Sí!", "a\u200db", "a\u200cb", "\u200fRTL\u200e", "soft\u00adhyphen", "\ue000private\uf8ff",
    "\u0378\u0379 unassigned", "\uffff\ufffe", "𠀀𠀁 extension B", "\U0002ebf0 ext I",
    "\U00010d40\U00010d41 garay", "\U00013460 hieroglyph", "x\U000105c0y", "\U0001cc00\U0001cc01 legacy",
    " \U0001fae9!", "\U0001fac6\U0001fa89", "a\u0897b", "\U00011380\U00011381 tulu", "٣\U00010d40٣",
    "\x00\x01\x02 controls \x1b[31mred\x1b[0m", "\x7f\x80\x9f",
]

CODE = [
    "def f(x):\n    return x**2\n",
    "class Foo(Bar):\n    \"\"\"Doc.\"\"\"\n\n"
    "    def __init__(self, n: int = 3) -> None:\n        self.n = n  # count\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
    "const add = (a, b) => a + b;\nconsole.log(`sum=${add(1, 2)}`);\n",
    "fn main() {\n    let v: Vec<u8> = vec![1, 2, 3];\n    println!(\"{:?}\", v);\n}\n",
    "func (s *Server) Handle(w http.ResponseWriter, r *http.Request) {\n\tw.WriteHeader(200)\n}\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "<html><body><p class=\"x\">Hello &amp; welcome</p></body></html>",
    '{"json": [1, 2.5, -3e4, true, null], "nested": {"k": "v\\n"}}',
    "key: value\nlist:\n  - a\n  - b: 'c'\n",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\" | tr a-z A-Z; done\n",
    r"^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@(?:[a-z0-9-]+\.)+[a-z]{2,}$",
    "\\begin{equation}\n  E = mc^2 \\quad \\forall x \\in \\mathbb{R}\n\\end{equation}",
    "| col1 | col2 |\n|------|------|\n| a    | b    |\n",
    "--- a/file.py\n+++ b/file.py\n@@ -1,3 +1,4 @@\n-old line\n+new line\n",
    "x+=1;y-=2;z*=3;w/=4;a%=5;b<<=1;c>>=2;d&=e|f^g;",
    "if (a != b && c == d || !e) { return -1; }",
    "arr[i][j] = (x->y).z ?? default;",
    "@decorator\nasync def main() -> list[dict[str, int]]:\n    await asyncio.sleep(0.1)\n",
    "    indented\n        more\n\tmixed\n",
    "path/to/file.py:123:45: error: name 'x' is not defined",
    "https://example.com/a/b?q=1&r=two#frag",
    "email@example.com, first.last+tag@sub.example.org",
    "C:\\Users\\name\\Documents\\file.txt",
    "__init__ __main__ _private __dunder__",
    "snake_case_name kebab-case-name PascalCaseName SCREAMING_CASE",
    "a==b!=c<=d>=e=>f->g::h...i",
    "/* block */ // line\n# hash\n-- sql\n<!-- html -->",
]

SPECIAL_LOOKALIKES = [
    "<|endoftext|>", "<|endoftext|><|endoftext|>", "x<|endoftext|>y", " <|endoftext|> ", "<|endoftext|>\n\n",
    "<|ENDOFTEXT|>", "< |endoftext| >", "<|endoftext|", "|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", "<|im_", "<|im_start", "im_start|>",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>", "<s>", "</s>", "<s><s>", "</s> </s>", "<s>Once</s>",
    "a<s>b</s>c", "<s", "</s", "s>", "<unk>", "a<unk>b", "<pad>", "[INST]", "[/INST]", "[INST] Hello [/INST]",
    "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]", "[/INST", "<|user|>", "<|user|>hi",
    "<|user|>\nHello<|end|>\n<|assistant|>\n",
    "<|system|>\n  You are helpful.<|end|>\n", "<|end|> \t\n next", "<|assistant|>", "<|end|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", "<|eot_id|>",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "<end_of_turn>", "<bos>", "<eos>",
    "<|fim_prefix|>def f(<|fim_suffix|>)\n<|fim_middle|>", "<|fim_pad|>", "<|file_sep|>", "<|", "|>", "<||>", "<>",
    "<0x41>", "<0x0A>", "<0xZZ>", "\u2581<s>", "<mask>", "[MASK]", "<|channel|>analysis<|message|>",
    "<|user|> <|user|>",
    "<|im_start|><|im_end|>", "<|im_end|><|im_start|>", "text<|im_end|>text<|im_end|>", "</s>\n<s>", "<s> \n</s>",
]

_LONG_STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
               "One day, she saw a big, red ball 🎈 and said: \"Can I play?\"\n\n")

LONG = [
    _LONG_STORY * 40,
    "x" * 1000, "ab" * 300, "😀" * 50, "1234567890" * 20, "a " * 400, "- " * 200, "=" * 500,
    ("def f():\n    return [i * i for i in range(10)]\n\n" * 30),
    ("日本語の文章、" * 80) + "。",
    ("Привет мир! " * 60),
]

# Words and separators for the generated strings (and the training text).
_WORDS = [
    "Once", "upon", "a", "time", "there", "was", "little", "girl", "named", "Lily", "dog", "Max", "park", "happy",
    "The", "THE", "the", "quick", "brown", "fox", "jumps", "over", "lazy", "HTTP", "Server", "camelCase",
    "café", "naïve", "Zoë", "über", "straße", "ÉCOLE", "niño", "日本", "猫", "東京", "中文", "한국어", "мир", "Привет",
    "ПРИВЕТ", "приВет", "مرحبا", "שלום", "नमस्ते", "हिन्दी", "ภาษา", "Ελλάδα", "😀", "🐶", "🎉", "👍🏽", "👨‍👩‍👧",
    "42", "7", "2024", "3.14", "1,000", "0x1F", "123456789", "٣٤", "１２", "²", "don't", "it's", "WE'RE", "I'M",
    "x86_64", "C++", "e-mail", "foo()", "a[i]", "{k: v}", "<tag>", "</tag>", "&&", "||", "->", "=>", "...", "!?",
    "e\u0301", "n\u0303", "\u00a0", "\u3000", "\t", "<|im_start|>", "<|endoftext|>", "<s>", "</s>", "[INST]",
    "<|im_", "\U00010d40", "\u0378",
]
_SEPARATORS = [" ", " ", " ", "", "  ", "   ", "\n", "\t", ", ", ". ", "! ", "? ", " - ", "\n\n", " \n", "\u00a0",
               "\r\n", "\n\n\n", "    ", "'", "/", "_", ":", "|"]


def generated_strings(count: int, seed: int = 20240601) -> list[str]:
    """``count`` deterministic mixes of words, random code points and separators."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 30)):
            if rng.random() < 0.8:
                parts.append(rng.choice(_WORDS))
            else:
                parts.append(chr(rng.choice([
                    rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x24f), rng.randint(0x300, 0x36f),
                    rng.randint(0x370, 0x4ff), rng.randint(0x600, 0x6ff), rng.randint(0x900, 0x97f),
                    rng.randint(0x2000, 0x206f), rng.randint(0x3000, 0x30ff), rng.randint(0x4e00, 0x4fff),
                    rng.randint(0xac00, 0xacff), rng.randint(0x1f300, 0x1f64f), rng.randint(0x10d40, 0x10d8f),
                ])))
            parts.append(rng.choice(_SEPARATORS))
        text = "".join(parts)
        form = rng.random()
        if form < 0.2:
            text = text.strip()
        elif form < 0.3:
            text = unicodedata.normalize("NFD", text)
        elif form < 0.35:
            text = text.upper()
        out.append(text)
    return out


def hand_written() -> list[str]:
    """Every hand-written case, NFC and NFD forms of the Unicode ones included."""
    unicode_nfd = [unicodedata.normalize("NFD", s) for s in UNICODE if unicodedata.normalize("NFD", s) != s]
    return [*EMPTY_AND_SINGLE, *WHITESPACE, *DIGITS, *CONTRACTIONS, *UNICODE, *unicode_nfd, *CODE,
            *SPECIAL_LOOKALIKES, *LONG]


def parity_corpus() -> list[str]:
    """The corpus: hand-written cases, then 160 generated ones (about 600 strings)."""
    return hand_written() + generated_strings(160)


def training_text() -> list[str]:
    """Text to train test vocabularies on: the corpus, word lists in every script, and prose."""
    rng = random.Random(7)
    sentences = []
    for _ in range(400):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 12))]
        sentences.append(rng.choice(["", " ", "\n", "\t"]) + " ".join(words) + rng.choice([".", "!", "?", ",", "\n"]))
    numbers = [str(rng.randint(0, 10 ** rng.randint(1, 12))) for _ in range(200)]
    return parity_corpus() + sentences + [" ".join(numbers)] + CODE * 3 + UNICODE * 3
