"""A prompt with images -> token ids and the rows that replace some of them, laid out as
llama.cpp's ``mtmd_tokenize`` lays them out (``tools/mtmd/mtmd.cpp``), so that the text model
reads what it reads in llama.cpp.

The prompt's text holds ``MARKER`` (llama.cpp's default media marker) where each image goes.
Text is tokenized piece by piece as mtmd does: each piece of the user's text on its own
(special tokens parsed), each marker text on its own, and some markers looked up as one
token by their text (``Lookup``: mtmd's ``lookup_token``). Per projector kind:

- ``gemma3``: ``<start_of_image>``, the square's rows, ``<end_of_image>``;
- ``mlp``: the square's rows alone;
- ``idefics3``: each tile as ``<fake_token_around_image><row_R_col_C>`` and its rows, a
  ``\\n`` token after every row of tiles but the last; then the tokens ``\\n\\n``,
  ``<fake_token_around_image>``, ``<global-img>``, the overview's rows and
  ``<fake_token_around_image>``.

An image's rows stand in the ids as normal tokens drawn from the image's digest (``placeholder_ids``):
every hash over a prompt's ids (the prefix cache's page chain, in memory and on disk) then
tells two images apart, and the same image in the same place is the same prefix.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

MARKER = "<__media__>"
"""Where an image goes in a prompt's text (``mtmd_default_marker``)."""
MUTUAL = ("gemma3",)
"""Projector kinds whose image rows attend to each other in the text model, not only to the
rows before them (llama.cpp's ``mtmd_decode_use_non_causal``)."""


@dataclass(frozen=True)
class Lookup:
    """A token found by its text (the first id whose piece, special text included, it is)."""

    text: str


def layout(projector: str, grid: tuple[int, int], squares: int) -> list:
    """An image's part of the prompt: text (str, tokenized), ``Lookup`` tokens and square
    indices (int: that square's rows), in order. ``grid``: (columns, rows) of Idefics3's tiles."""
    if projector == "gemma3":
        return ["<start_of_image>", 0, "<end_of_image>"]
    if projector == "mlp":
        return [0]
    if projector == "idefics3":
        cols, rows = grid
        if cols * rows + 1 != squares:
            raise ValueError(f"{cols} x {rows} tiles and an overview are not {squares} squares")
        out: list = []
        for y in range(rows):
            for x in range(cols):
                out += [f"<fake_token_around_image><row_{y + 1}_col_{x + 1}>", y * cols + x]
            if y != rows - 1:
                out.append(Lookup("\n"))
        fake = Lookup("<fake_token_around_image>")
        return out + [Lookup("\n\n"), fake, Lookup("<global-img>"), squares - 1, fake]
    raise ValueError(f"no prompt layout for projector type {projector!r}")


def lookups(projector: str) -> list[str]:
    """The texts ``layout`` looks up as tokens for ``projector`` (the text model must have them)."""
    grid = (2, 2) if projector == "idefics3" else (0, 0)
    items = layout(projector, grid, 5 if projector == "idefics3" else 1)
    return sorted({i.text for i in items if isinstance(i, Lookup)})


def find_token(tokenizer, text: str) -> int | None:
    """The first token id whose piece (special text included) is ``text``, as mtmd's
    ``lookup_token``; None when there is none."""
    want = text.encode()
    table = tokenizer.decode_tables(skip_special=False)[0]
    return next((i for i in range(len(table)) if table[i] == want), None)


def placeholder_ids(digest: bytes, count: int, vocab: np.ndarray) -> list[int]:
    """``count`` token ids drawn from ``digest`` (the image's and projector's) among ``vocab``
    (``plain_ids``): what an image's rows are in the ids (module docstring)."""
    seed = int.from_bytes(hashlib.blake2b(digest, digest_size=16).digest(), "little")
    return vocab[np.random.default_rng(seed).integers(0, len(vocab), count)].tolist()


def plain_ids(tokenizer) -> np.ndarray:
    """The ids of the vocabulary's normal tokens (all ids where it has no types): no control
    token (BOS, ``<think>``, an end of turn) ever stands for an image's row, so nothing that
    looks for one in a prompt finds it there."""
    from ..tokenizer.spec import TOKEN_NORMAL

    types = tokenizer.spec.token_types
    normal = np.flatnonzero(np.asarray(types) == TOKEN_NORMAL) if types is not None else np.empty(0, np.int64)
    return normal if len(normal) else np.arange(tokenizer.vocab_size)


def build(tokenizer, text: str, images: list, projector: str, add_bos: bool = True,
          found: dict[str, int | None] | None = None, vocab: np.ndarray | None = None) -> tuple[list[int], tuple]:
    """(token ids, embeds: ((position, rows, mutual), ...) as ``Engine.add_request`` takes
    them) of ``text`` with ``images`` at its markers: each image
    (grid, embeddings (squares, tokens, dim), digest) as ``layout`` places it. A ValueError
    when the markers and the images are not as many, or a looked-up token is missing.
    ``found`` (text -> ``find_token``'s id) and ``vocab`` (``plain_ids``): the tokenizer's,
    looked up once by a caller that builds many prompts; else looked up now."""
    parts = text.split(MARKER)
    if len(parts) - 1 != len(images):
        raise ValueError(f"the prompt has {len(parts) - 1} image markers ({MARKER}) for {len(images)} images")
    ids: list[int] = []
    if add_bos and tokenizer.bos_id is not None:  # mtmd: at the start of the first text chunk
        ids.append(tokenizer.bos_id)
    embeds = []
    found = {} if found is None else found
    vocab = plain_ids(tokenizer) if vocab is None else vocab
    for i, part in enumerate(parts):
        ids += tokenizer.encode(part, add_bos=False, parse_special=True) if part else []
        if i == len(images):
            break
        grid, rows, digest = images[i]
        fill = iter(placeholder_ids(digest, rows.shape[0] * rows.shape[1], vocab))
        for item in layout(projector, grid, len(rows)):
            if isinstance(item, int):
                embeds.append((len(ids), rows[item], projector in MUTUAL))
                ids += [next(fill) for _ in range(len(rows[item]))]
            elif isinstance(item, Lookup):
                if item.text not in found:
                    found[item.text] = find_token(tokenizer, item.text)
                token = found[item.text]
                if token is None:
                    raise ValueError(f"the text model has no token {item.text!r}, which {projector} images need")
                ids.append(token)
            else:
                ids += tokenizer.encode(item, add_bos=False, parse_special=True)
    return ids, tuple(embeds)
