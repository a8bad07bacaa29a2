"""The reranker and decoder-embedder parts of ``synth.py``: pooling keys, classifier labels,
the rerank template and the head's tensors, written as llama.cpp's converter writes them.

A cross-encoder (``conversion/bert.py``) gets ``{arch}.classifier.output_labels`` and
``cls.output`` (one row per label, with its bias), after a ``cls`` dense layer when the
checkpoint has RoBERTa's head. Qwen3-Reranker (``conversion/qwen.py``) gets pooling type
rank, the labels ``yes``/``no``, ``cls.output`` (2, dim) cut from the LM head, and a chat
template named ``rerank`` with ``{query}`` and ``{document}`` in it.
"""

from __future__ import annotations

QWEN3_RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
    "<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")
"""Qwen3-Reranker's prompt, as llama.cpp's converter stores it (``tokenizer.chat_template.rerank``)."""

QWEN3_SPECIAL_PIECES = (("<|im_start|>", 3), ("<|im_end|>", 3), ("<think>", 4), ("</think>", 4))
"""Pieces the rerank template names, with their GGUF token types (control, user-defined), as
Qwen's vocabulary has them: the tokenizer matches them whole."""


def add_decoder_rank_keys(w, shape) -> None:
    """A decoder's pooling type when it is an embedder or a reranker, and a reranker's labels
    and template."""
    import gguf

    if shape.pooling != 1:
        w.add_pooling_type(gguf.PoolingType(shape.pooling))
    if shape.classifier_labels:
        w.add_classifier_output_labels(list(shape.classifier_labels))
        w.add_chat_template([{"name": "rerank", "template": QWEN3_RERANK_TEMPLATE}])


def add_encoder_rank_keys(w, shape) -> None:
    if shape.classifier_labels:
        w.add_classifier_output_labels(list(shape.classifier_labels))


def head_tensor_list(shape) -> list[tuple[str, tuple[int, ...], float]]:
    """The classification head's tensors (name, shape, init std), empty unless ``shape`` has labels."""
    if not shape.classifier_labels:
        return []
    d, n, std = shape.dim, len(shape.classifier_labels), shape.init_std
    tensors: list[tuple[str, tuple[int, ...], float]] = []
    if shape.classifier_dense:
        tensors += [("cls.weight", (d, d), std), ("cls.bias", (d,), std)]
    # the converter takes Qwen3's rows from the LM head: no bias there
    tensors.append(("cls.output.weight", (n, d), std))
    if shape.arch != "qwen3":
        tensors.append(("cls.output.bias", (n,), std))
    return tensors
