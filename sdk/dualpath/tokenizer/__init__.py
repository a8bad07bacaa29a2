"""Tokenizers built from what a model file says: SentencePiece-BPE ("llama"), byte-level BPE ("gpt2"),
WordPiece ("bert") and SentencePiece Unigram ("t5").

The one entry point is ``build_tokenizer(spec)``; the rest of DualPath talks to the
returned ``Tokenizer`` (``encode``, ``decode``, ``stop_ids``) and to ``StreamDecoder``
in the generation loop.
"""

from __future__ import annotations

from ..errors import TokenizerError
from .base import Tokenizer
from .llama2c import load_llama2c_tokenizer
from .spec import TokenizerSpec
from .stream import StreamDecoder

__all__ = ["Tokenizer", "TokenizerSpec", "StreamDecoder", "build_tokenizer", "load_llama2c_tokenizer"]


def build_tokenizer(spec: TokenizerSpec) -> Tokenizer:
    """The tokenizer for ``spec.model``: ``"llama"`` -> SentencePiece-style BPE, ``"gpt2"`` -> byte-level BPE,
    ``"bert"`` -> WordPiece, ``"t5"`` -> SentencePiece Unigram."""
    if spec.model == "llama":
        from .spm import SpmTokenizer
        return SpmTokenizer(spec)
    if spec.model == "gpt2":
        from .bpe import ByteLevelBpeTokenizer  # builds on Hugging Face tokenizers: not needed for "llama"
        return ByteLevelBpeTokenizer(spec)
    if spec.model == "bert":
        from .wpm import WpmTokenizer
        return WpmTokenizer(spec)
    if spec.model == "t5":
        from .ugm import UgmTokenizer
        return UgmTokenizer(spec)
    raise TokenizerError(f"tokenizer model {spec.model!r} is not supported; expected 'llama', 'gpt2', 'bert' or 't5'")
