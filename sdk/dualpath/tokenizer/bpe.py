"""Byte-level BPE with merges (GGUF ``tokenizer.ggml.model == "gpt2"``: Llama 3, Qwen2, SmolLM, GPT-2).

Built on Hugging Face ``tokenizers`` from ``spec.tokens`` and ``spec.merges``. The input is
first split by the pre-tokenizer regexes that llama.cpp uses for ``spec.pre`` (GGUF
``tokenizer.ggml.pre``), each regex splitting the pieces of the previous one and keeping the
text between matches, then mapped to GPT-2's byte alphabet and merged by rank.

Differences from llama.cpp, all deliberate:

* An unknown ``pre`` logs a warning and uses GPT-2's regex (llama.cpp refuses the file).
* Merges whose parts or result are not in the vocabulary are dropped with a warning
  (``tokenizers`` refuses them; llama.cpp would merge and then fall back to bytes).
* ``decode`` does not apply llama.cpp's ``clean_spaces`` post-processing (" ." -> ".").
  It would make decoding depend on the next token and break streaming.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tokenizers import Regex
from tokenizers import Tokenizer as HfTokenizer
from tokenizers import models, pre_tokenizers

from .base import Tokenizer
from .spec import TokenizerSpec

logger = logging.getLogger(__name__)

# Pre-tokenizer regexes, copied from llama.cpp src/llama-vocab.cpp (llm_tokenizer_bpe).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class PreTokenizerRule:
    """How llama.cpp pre-tokenizes one ``tokenizer.ggml.pre`` family."""

    regexes: tuple[str, ...]
    """Applied in order; each splits the pieces the previous one produced."""
    ignore_merges: bool = False
    """A pre-token that is itself a vocabulary entry becomes that token without merging."""


_DEFAULT_RULE = PreTokenizerRule((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))
_GPT2_RULE = PreTokenizerRule((_GPT2,))
_PRE_RULES: dict[str, PreTokenizerRule] = {
    "default": _DEFAULT_RULE,
    **dict.fromkeys(("gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "roberta-bpe", "exaone4"), _GPT2_RULE),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"),
                    PreTokenizerRule((_LLAMA3,), ignore_merges=True)),
    **dict.fromkeys(("dbrx", "smaug-bpe", "chatglm-bpe", "glm4"), PreTokenizerRule((_LLAMA3,))),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "hunyuan"), PreTokenizerRule((_QWEN2,))),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
                    PreTokenizerRule((r"\p{N}", _GPT2))),
}


def pre_tokenizer_rule(pre: str | None) -> PreTokenizerRule:
    """The llama.cpp pre-tokenizer for GGUF ``tokenizer.ggml.pre`` = ``pre``."""
    if not pre:
        logger.warning("byte-level BPE vocabulary has no tokenizer.ggml.pre; using llama.cpp's 'default' regexes")
        return _DEFAULT_RULE
    rule = _PRE_RULES.get(pre)
    if rule is None:
        logger.warning("unknown pre-tokenizer %r (known: %s); using GPT-2's regex",
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
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in rule.regexes]
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
