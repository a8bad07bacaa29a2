"""What a model file says about its tokenizer, before any tokenizer is built."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6


# tokenizer.ggml.pre names for which llama.cpp prepends BOS when the file has no
# tokenizer.ggml.add_bos_token (llama_vocab::impl::load): the Llama 3 family, tekken, chameleon.
_BPE_PRE_WITH_BOS = frozenset(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                               "jina-v5-nano", "tekken", "chameleon"))


def default_add_bos(model: str, pre: str | None) -> bool:
    """llama.cpp's ``add_bos`` for a GGUF without ``tokenizer.ggml.add_bos_token``.

    SentencePiece ("llama") vocabularies: yes. Byte-level BPE ("gpt2"): only for the
    pre-tokenizers above; Qwen2, SmolLM, GPT-2 ... get no BOS.
    """
    if model == "llama":
        return True
    return model == "gpt2" and pre in _BPE_PRE_WITH_BOS


@dataclass(frozen=True)
class TokenizerSpec:
    """The vocabulary and rules of one tokenizer, as a model file stores them.

    ``model`` is GGUF's ``tokenizer.ggml.model``: ``"llama"`` (SentencePiece-style
    BPE with scores and byte fallback; pieces use U+2581 for spaces) or ``"gpt2"``
    (byte-level BPE with merges), ``"bert"`` (WordPiece) or ``"t5"`` (SentencePiece Unigram
    with scores; ``extra["precompiled_charsmap"]`` its charsmap as base64 text). llama2.c
    tokenizers are converted to ``"llama"``.
    """

    model: str
    tokens: tuple[str, ...]
    """Piece text per token id."""
    scores: Sequence[float] | None = None
    """Merge priority per token id (``llama``): higher merges first. Held as ``array("f")``
    (GGUF stores float32): a tuple of Python floats is several times larger at Gemma 3's 262,144
    pieces."""
    token_types: Sequence[int] | None = None
    """GGUF token type per token id (TOKEN_* above); None means all NORMAL. Held as
    ``array("i")``."""
    merges: tuple[str, ...] | None = None
    """``"a b"`` merge rules in rank order (``gpt2``)."""
    bos_id: int | None = None
    eos_id: int | None = None
    unk_id: int | None = None
    eot_id: int | None = None
    add_bos: bool = True
    """Prepend BOS when encoding a prompt (GGUF ``tokenizer.ggml.add_bos_token``; where the file
    does not say, llama.cpp's default is ``default_add_bos(model, pre)``)."""
    add_eos: bool = False
    add_space_prefix: bool = True
    """SentencePiece dummy prefix: a leading space is added to non-empty text (``llama``)."""
    pre: str | None = None
    """GGUF ``tokenizer.ggml.pre``: the pre-tokenizer regex family (``gpt2``)."""
    name: str | None = None
    """GGUF ``general.name``. llama.cpp keys per-token attributes on it (a name containing
    "phi-3"/"phi3" makes special tokens swallow the whitespace after them); we do the same."""
    chat_template: str | None = None
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.scores is not None and not isinstance(self.scores, array):
            object.__setattr__(self, "scores", array("f", self.scores))
        if self.token_types is not None and not isinstance(self.token_types, array):
            object.__setattr__(self, "token_types", array("i", self.token_types))

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)
