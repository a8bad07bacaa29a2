"""Byte-level BPE with merges (GGUF ``tokenizer.ggml.model == "gpt2"``: Llama 3, Qwen2/3, SmolLM, GPT-4o, GPT-2).

Built on Hugging Face ``tokenizers`` (Rust) from ``spec.tokens`` and ``spec.merges``, imported only
when such a tokenizer is built: SentencePiece ("llama") vocabularies never need it, so a core install
without it (Termux, an Android app; see android/README.md) loads them, and ``_PRE_RULES`` can be read
without it. Building one without it raises ``TokenizerError`` naming the install command. The input is
first split by the pre-tokenizer regexes that llama.cpp uses for ``spec.pre`` (GGUF
``tokenizer.ggml.pre``), each regex splitting the pieces of the previous one and keeping the
text between matches, then mapped to GPT-2's byte alphabet and merged by rank.

How this matches llama.cpp (src/llama-vocab.cpp and src/unicode.cpp of the version that
llama-cpp-python 0.3.36 vendors), checked by tests/tokenizer/test_tok_bpe_parity.py:

* ``_PRE_RULES`` holds llama.cpp's names and regex strings verbatim, with its
  ``ignore_merges`` flag (a pre-token that is itself a vocabulary entry is not merged).
* llama.cpp runs its regexes either through hand-written splitters (GPT-2, Llama 3, Qwen2,
  Qwen3.5) or through ``std::regex`` on text where every non-ASCII code point is replaced by
  one byte for its category. Both behave like the same regex run with real Unicode classes,
  which is what Oniguruma (the ``tokenizers`` regex engine) does. That is also why llama.cpp's
  GPT-4o regex, ``((?=[\\p{L}])([^a-z]))*`` where the original has ``[\\p{Lu}\\p{Lt}...]*``, treats
  every non-ASCII letter as both upper and lower case and leaves combining marks out of words
  ("приВет" is one pre-token, "e" + U+0301 are two): we use llama.cpp's regex, not the original.
* Where the category trick shows through, ``onig_regex`` rewrites the regex to match it:
  ``\\p{Lu}``/``\\p{Ll}``/... mean any letter (youtu), and in regexes without ``\\p{..}`` (run
  as ``std::wregex`` on text whose non-ASCII spaces became U+000B) a literal class never
  matches a non-ASCII space (deepseek's ``[一-龥ࠀ-一가-퟿]`` spans U+3000).
* Unicode versions differ: llama.cpp's tables are Unicode 15.1, Oniguruma in ``tokenizers``
  0.23 knows Unicode 16.0. Code points new in 16.0 are "undefined" to llama.cpp (no letter,
  number, punctuation, symbol or mark), so ``\\p{..}`` classes are narrowed by
  ``_NEWER_THAN_LLAMA_CPP_UNICODE`` before they reach Oniguruma.

Differences from llama.cpp, all deliberate:

* llama.cpp's ``std::regex`` path recurses per character and overflows the stack on long runs
  (a run of 100,000 spaces, letters or "!" crashes it with the gpt-4o regex); Oniguruma has no such limit.
* An unknown ``pre``, or a llama.cpp name whose splitter is not a plain regex (see
  ``_NOT_IMPLEMENTED``), logs a warning and uses GPT-2's regex (llama.cpp refuses unknown names).
* Merges whose parts or result are not in the vocabulary are dropped with a warning
  (``tokenizers`` refuses them; llama.cpp would merge and then fall back to bytes).
* ``decode`` does not apply llama.cpp's ``clean_spaces`` post-processing (" ." -> ".").
  It would make decoding depend on the next token and break streaming.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from ..errors import TokenizerError
from .base import Tokenizer
from .spec import TokenizerSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreTokenizerRule:
    """How llama.cpp pre-tokenizes one ``tokenizer.ggml.pre`` family."""

    regexes: tuple[str, ...]
    """llama.cpp's regex strings, applied in order; each splits the pieces the previous one produced."""
    ignore_merges: bool = False
    """A pre-token that is itself a vocabulary entry becomes that token without merging."""


# Regexes verbatim from llama.cpp src/llama-vocab.cpp (llm_tokenizer_bpe), named after its
# LLAMA_VOCAB_PRE_TYPE_* values.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
          r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
          r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
          r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
           r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK3_WORDS = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")
_DEEPSEEK3_CJK = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_BAILINGMOE = (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+")
_BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
_CJK_HANGUL = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_LLM_LATIN = (
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
    "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+")
_EXAONE_MOE = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?"
               r"(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+")
_GRANITE_EMB_MULTI = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+"
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*"
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_JAIS2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)"
          r"|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}")
_MINICPM5 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SEED_CODER = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}"
               r"| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPARK2_5_WORDS = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                   "| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+")
_UFAKZEKA = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_YOUTU_CJK = ("[\uac00-\ud7a3\u3131-\u318e]+"
              "|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f\ufe30-\ufe4f]+"
              "|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+")
_YOUTU_WORDS = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

_GPT2_RULE = PreTokenizerRule((_GPT2,))
_DEFAULT_RULE = PreTokenizerRule((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))
_LLAMA3_RULE = PreTokenizerRule((_LLAMA3,))

# tokenizer.ggml.pre -> rule, with llama.cpp's names (llama_vocab::impl::load).
_PRE_RULES: dict[str, PreTokenizerRule] = {
    "default": _DEFAULT_RULE,
    **dict.fromkeys(("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
                     "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais",
                     "exaone4", "trillion", "granite-docling"), _GPT2_RULE),
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano"), PreTokenizerRule((_LLAMA3,), ignore_merges=True)),
    **dict.fromkeys(("dbrx", "smaug-bpe", "chatglm-bpe"), _LLAMA3_RULE),
    **dict.fromkeys(("glm4", "glm5"), PreTokenizerRule((_LLAMA3,), ignore_merges=True)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "megrez", "hunyuan",
                     "solar-open"), PreTokenizerRule((_QWEN2,))),
    "qwen35": PreTokenizerRule((_QWEN35,)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"),
                    PreTokenizerRule((r"\p{N}", _GPT2))),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), PreTokenizerRule((_GPT4O,))),
    "tekken": PreTokenizerRule((_TEKKEN,), ignore_merges=True),
    "falcon": PreTokenizerRule((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")),
    **dict.fromkeys(("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"),
                    PreTokenizerRule((r"\p{N}{1,3}", _DEEPSEEK3_CJK, _DEEPSEEK3_WORDS))),
    "deepseek-llm": PreTokenizerRule(("[\r\n]", _DEEPSEEK_LLM_LATIN,
                                      "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", r"\s+$",
                                      _CJK_HANGUL, r"\p{N}+")),
    "deepseek-coder": PreTokenizerRule(("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_HANGUL, r"\p{N}")),
    "spark2_5": PreTokenizerRule((r"\p{N}{1,3}", _DEEPSEEK3_CJK, _SPARK2_5_WORDS, r"\p{N}")),
    "youtu": PreTokenizerRule((_YOUTU_CJK, _YOUTU_WORDS), ignore_merges=True),
    "jais-2": PreTokenizerRule((_JAIS2,)),
    **dict.fromkeys(("poro-chat", "bloom", "gpt3-finnish"), PreTokenizerRule((_BLOOM,))),
    "viking": PreTokenizerRule((_BLOOM, r"\p{N}")),
    "chameleon": PreTokenizerRule((r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )",
                                   r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", _GPT2)),
    "granite-embed-multi-97m": PreTokenizerRule((_GRANITE_EMB_MULTI,), ignore_merges=True),
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), PreTokenizerRule((_BAILINGMOE,))),
    "seed-coder": PreTokenizerRule((_SEED_CODER,)),
    "ufakzeka": PreTokenizerRule((_UFAKZEKA,)),
    "grok-2": PreTokenizerRule((_QWEN2,)),
    "laguna": PreTokenizerRule((r"[^\n]+|[\n]+", _QWEN2)),
    "exaone-moe": PreTokenizerRule((_EXAONE_MOE,)),
    "minicpm5": PreTokenizerRule((r"\p{N}{1,3}", _MINICPM5), ignore_merges=True),
}

# llama.cpp names whose splitting is not a plain regex sequence (hand-written digit grouping,
# Han exclusion, zero-width splits) or whose vocabulary is not byte-level: not implemented.
_NOT_IMPLEMENTED = frozenset((
    "kimi-k2", "afmoe", "tiny_aya", "cohere2moe", "superbpe", "gemma4", "granite-embed-multi-311m",
    "sarvam-moe", "whitespace",
))

# Code points that Oniguruma (Unicode 16.0 in tokenizers 0.23) assigns a category and
# llama.cpp's tables (Unicode 15.1) do not: every \p{..} class excludes them, so they fall into
# the negated classes as llama.cpp's "undefined" code points do. Computed from llama.cpp
# src/unicode-data.cpp against Oniguruma; harmless with an Oniguruma that predates them.
_NEWER_THAN_LLAMA_CPP_UNICODE = (
    r"\x{897}\x{1B4E}-\x{1B4F}\x{1B7F}\x{1C89}-\x{1C8A}\x{2427}-\x{2429}\x{31E4}-\x{31E5}"
    r"\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3}\x{10D40}-\x{10D65}\x{10D69}-\x{10D85}"
    r"\x{10D8E}-\x{10D8F}\x{10EC2}-\x{10EC4}\x{10EFC}\x{11380}-\x{11389}\x{1138B}\x{1138E}"
    r"\x{11390}-\x{113B5}\x{113B7}-\x{113C0}\x{113C2}\x{113C5}\x{113C7}-\x{113CA}\x{113CC}-\x{113D5}"
    r"\x{113D7}-\x{113D8}\x{113E1}-\x{113E2}\x{116D0}-\x{116E3}\x{11BC0}-\x{11BE1}\x{11BF0}-\x{11BF9}"
    r"\x{11F5A}\x{13460}-\x{143FA}\x{16100}-\x{16139}\x{16D40}-\x{16D79}\x{18CFF}\x{1CC00}-\x{1CCF9}"
    r"\x{1CD00}-\x{1CEB3}\x{1E5D0}-\x{1E5FA}\x{1E5FF}\x{1F8B2}-\x{1F8BB}\x{1F8C0}-\x{1F8C1}\x{1FA89}"
    r"\x{1FA8F}\x{1FABE}\x{1FAC6}\x{1FADC}\x{1FADF}\x{1FAE9}\x{1FBCB}-\x{1FBEF}"
)
_UNICODE_CLASS = re.compile(r"\\p\{(L[ultmo]?|N|P|S|M)\}")


# Non-ASCII white space (llama.cpp's table, which equals Oniguruma's \s beyond ASCII).
_NON_ASCII_SPACE = r"\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}"


def onig_regex(regex: str) -> str:
    """``regex`` (llama.cpp's text) for Oniguruma, with llama.cpp's Unicode categories.

    Each ``\\p{X}`` becomes the nested class ``[\\p{X}&&[^...]]``, which Oniguruma accepts both
    inside and outside a bracket expression. ``\\p{Lu}``, ``\\p{Ll}``, ``\\p{Lt}``, ``\\p{Lm}`` and
    ``\\p{Lo}`` become ``\\p{L}``: llama.cpp's regex path knows only the major categories and maps
    them all to "letter" (unicode_regex_split, ``k_ucat_enum``).

    A regex without ``\\p{..}`` runs in llama.cpp as ``std::wregex`` on text where every non-ASCII
    white-space character was replaced by U+000B. Such a character then matches ``\\s`` but no
    literal class: deepseek's ``[一-龥ࠀ-一가-퟿]`` spans U+3000 and U+2000-U+200A, yet never matches
    them. So in those regexes every bracket class without ``\\s`` loses the non-ASCII spaces.
    """
    if r"\p{" in regex:
        return _UNICODE_CLASS.sub(lambda m: rf"[\p{{{m.group(1)[0]}}}&&[^{_NEWER_THAN_LLAMA_CPP_UNICODE}]]", regex)
    if regex.isascii():
        return regex  # no literal non-ASCII class: the replacement cannot change what matches
    return _without_non_ascii_space_in_classes(regex)


def _without_non_ascii_space_in_classes(regex: str) -> str:
    """``regex`` with ``[C]`` -> ``[C&&[^S]]`` and ``[^C]`` -> ``[^C&&[^S]]`` (S: non-ASCII spaces) where C has no \\s.

    Handles the flat classes of llama.cpp's regexes (escapes, no nested classes).
    """
    out: list[str] = []
    i, n = 0, len(regex)
    while i < n:
        c = regex[i]
        if c == "\\":
            out.append(regex[i:i + 2])
            i += 2
            continue
        if c != "[":
            out.append(c)
            i += 1
            continue
        j = i + 1
        negated = j < n and regex[j] == "^"
        j += negated
        body_start = j
        while regex[j] != "]" or j == body_start:
            j += 2 if regex[j] == "\\" else 1
        body = regex[body_start:j]
        if r"\s" in body:
            out.append(regex[i:j + 1])
        else:
            out.append(f"[{'^' if negated else ''}{body}&&[^{_NON_ASCII_SPACE}]]")
        i = j + 1
    return "".join(out)


def pre_tokenizer_rule(pre: str | None) -> PreTokenizerRule:
    """The llama.cpp pre-tokenizer for GGUF ``tokenizer.ggml.pre`` = ``pre``."""
    if not pre:
        logger.warning("byte-level BPE vocabulary has no tokenizer.ggml.pre; using llama.cpp's 'default' regexes")
        return _DEFAULT_RULE
    rule = _PRE_RULES.get(pre)
    if rule is None:
        if pre in _NOT_IMPLEMENTED:
            logger.warning("pre-tokenizer %r (tokenizer.ggml.pre) is not implemented; using GPT-2's regex, "
                           "so token ids will differ from llama.cpp's", pre)
        else:
            logger.warning("unknown pre-tokenizer %r in tokenizer.ggml.pre (known: %s); using GPT-2's regex",
                           pre, ", ".join(sorted(_PRE_RULES)))
        return _GPT2_RULE
    return rule


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's map from the printable stand-in characters back to byte values."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    decoder = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            decoder[chr(256 + shifted)] = b
            shifted += 1
    return decoder


_BYTE_DECODER = _gpt2_byte_decoder()


class ByteLevelBpeTokenizer(Tokenizer):
    """Byte-level BPE tokenizer; every byte sequence has an encoding, so there is no unknown token."""

    def __init__(self, spec: TokenizerSpec):
        try:
            from tokenizers import Regex, models, pre_tokenizers
            from tokenizers import Tokenizer as HfTokenizer
        except ImportError as e:
            raise TokenizerError(
                f"this model's byte-level BPE vocabulary (tokenizer.ggml.model 'gpt2', pre {spec.pre!r}) needs "
                f"Hugging Face tokenizers, which cannot be imported ({e}): pip install 'tokenizers>=0.19' "
                "(or pip install 'dualpath[bpe]'); on Termux it builds from Rust source: pkg install rust first. "
                "SentencePiece vocabularies (tokenizer.ggml.model 'llama': Llama 2, TinyLlama, Gemma, Phi-3) "
                "do not need it") from e
        super().__init__(spec)
        rule = pre_tokenizer_rule(spec.pre)
        vocab = self._piece_to_id
        merges: list[tuple[str, str]] = []
        num_dropped = 0
        for rank, merge in enumerate(spec.merges or ()):
            cut = merge.find(" ", 1)  # llama.cpp splits at the first space after the first character
            left, right = (merge[:cut], merge[cut + 1:]) if cut > 0 else ("", "")
            if left in vocab and right in vocab and left + right in vocab:
                merges.append((left, right))
            else:
                num_dropped += 1
                logger.debug("dropping BPE merge %d %r: a part or the result is not in the vocabulary", rank, merge)
        if num_dropped:
            logger.warning("dropped %d of %d BPE merges whose parts or result are not in the vocabulary",
                           num_dropped, len(spec.merges or ()))
        hf = HfTokenizer(models.BPE(vocab=dict(vocab), merges=merges, ignore_merges=rule.ignore_merges))
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(onig_regex(r)), behavior="isolated") for r in rule.regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        self._hf = hf
        self._build_byte_tables()

    def _normal_piece_bytes(self, piece: str) -> bytes:
        try:
            return bytes(_BYTE_DECODER[c] for c in piece)
        except KeyError:
            # Not byte-level text (some converters store added words verbatim): use it as UTF-8.
            return b"".join(bytes((_BYTE_DECODER[c],)) if c in _BYTE_DECODER else c.encode("utf-8")
                            for c in piece)

    def _encode_fragment(self, text: str, after_special: bool) -> list[int]:
        return self._hf.encode(text, add_special_tokens=False).ids
