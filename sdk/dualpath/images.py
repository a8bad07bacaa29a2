"""Images in a prompt (``LLM(path, mmproj=...)``): each image decoded, cut into squares,
encoded by the projector (executor/vision.py) and laid out among the prompt's tokens as
llama.cpp's ``mtmd`` lays it out (vision/prompt.py).

An image's embeddings are kept by digest (its pixels and the projector's converted entry),
the most recently used first, up to ``cache_bytes``, and with the prefix cache on disk, in
files beside its pages (cache/disk.py ``EmbeddingStore``): a second question about the same
image, in this process or after a restart, skips the encoder.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict

import numpy as np

from .cache.disk import EmbeddingStore
from .engine.encoder_queue import CoreSplit, EncoderQueue, ImageJob
from .errors import ImageError, ModelLoadError
from .executor.vision import VisionEncoder
from .models.mmproj import check_text_model
from .vision import prompt as layout
from .vision.decode import decode_image

CACHE_BYTES = 256 << 20
"""Embeddings kept for images seen before, at most."""


class ImageInput:
    """The projector ``model`` (a converted projector: ``ModelStore.load(path,
    projector=True)``) of the text model ``text`` (its ModelSpec) with ``tokenizer``."""

    def __init__(self, model, text, tokenizer, num_threads: int, accuracy_level: int = 4,
                 cache_bytes: int = CACHE_BYTES, disk_root: str | None = None, disk_bytes: int = 0,
                 lend: bool = False):
        self.encoder = VisionEncoder(model, num_threads, accuracy_level, lend=lend)
        self.spec = self.encoder.spec
        check_text_model(self.spec, text.config.dim, os.path.basename(str(text.path)))
        self._tokens = {piece: layout.find_token(tokenizer, piece) for piece in layout.lookups(self.spec.projector)}
        self._vocab = layout.plain_ids(tokenizer)  # (both looked up once, not per prompt)
        for piece, token in self._tokens.items():
            if token is None:
                raise ModelLoadError(self.spec.path, f"{self.spec.projector} images need the token {piece!r}, which "
                                                     f"{os.path.basename(str(text.path))} does not have")
        self.tokenizer = tokenizer
        entry = getattr(model, "entry", None)
        identity = os.path.basename(entry.folder) if entry is not None else str(model.path)
        self._identity = identity.encode()
        self.disk = EmbeddingStore(disk_root, identity, disk_bytes) if disk_root else None
        """The embeddings on disk, beside the prefix cache's pages (cache/disk.py), or None."""
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[bytes, tuple] = OrderedDict()  # digest -> (grid, embeddings)
        self._cached_bytes = 0
        self._lock = threading.Lock()
        self.stats = {"images": 0, "encoded": 0, "encode_s": 0.0, "from_disk": 0}
        """Images asked for, images encoded (in no cache) and the seconds until their embeddings
        (waiting beside chats included), images read from disk."""
        self.queue: EncoderQueue | None = None
        """The engine's queue the encodes run on (``attach``), or None: in the caller's thread."""

    def attach(self, engine, share: float, threads: int) -> None:
        """Encode beside ``engine``'s chats from now on, not in the caller's thread: on a thread
        of its own with ``threads`` of the threads while chats run (``CoreSplit``), where the
        encoder lends threads (``lend``) and that leaves the chats some; otherwise on the
        engine's thread a piece at a time, ``share`` of each step's time
        (engine/encoder_queue.py; config.py ``image_encoder_threads``)."""
        self.queue = EncoderQueue(self.encoder, share=share, metric_prefix="dualpath_image_encoder",
                                  what=("images", "Images"))
        chat_threads = min(p.num_threads for p in engine.runner.pools())
        if self.encoder.lends_threads and 0 < threads < chat_threads:
            self.queue.cores = CoreSplit(engine, self.encoder.pool, threads)
        engine.attach_encoder(self.queue)

    def _encode(self, squares: list) -> np.ndarray:
        """The embeddings of ``squares``: on the engine's thread when attached (waiting for
        them here), else now."""
        if self.queue is None:
            return self.encoder.encode(squares)
        done = threading.Event()
        out: list = []

        def on_done(results, error) -> None:
            out.append((results, error))
            done.set()

        job = self.queue.submit(ImageJob(squares, on_done))
        try:
            done.wait()
        finally:
            if not done.is_set():  # interrupted: nobody will read it
                self.queue.cancel(job)
        results, error = out[0]
        if error is not None:
            raise error
        return results[0]

    def pixels(self, image) -> np.ndarray:
        """(height, width, 3) uint8 RGB of ``image``: PNG or JPEG bytes, a path to such a
        file, or the pixels themselves; an ImageError otherwise."""
        if isinstance(image, np.ndarray):
            if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8 or 0 in image.shape[:2]:
                raise ImageError(f"an image array is (height, width, 3) uint8 RGB, got {image.shape} {image.dtype}")
            return image
        if isinstance(image, (str, os.PathLike)):
            try:
                with open(image, "rb") as f:
                    image = f.read()
            except OSError as e:
                raise ImageError(f"cannot read the image {os.fspath(image)}: {e.strerror or e}") from e
        if isinstance(image, (bytes, bytearray, memoryview)):
            return decode_image(bytes(image))
        raise ImageError(f"an image is PNG or JPEG bytes, a file's path or an RGB array, not {type(image).__name__}")

    def embeddings(self, image) -> tuple[tuple[int, int], np.ndarray, bytes]:
        """(grid, embeddings (squares, tokens, text_dim), digest) of ``image`` (``pixels``),
        from the cache when it was encoded before."""
        from .vision.preprocess import squares

        rgb = self.pixels(image)
        digest = hashlib.blake2b(self._identity + np.array(rgb.shape, np.int64).tobytes() + rgb.tobytes(),
                                 digest_size=16).digest()
        with self._lock:
            self.stats["images"] += 1
            hit = self._cache.get(digest)
            if hit is not None:
                self._cache.move_to_end(digest)
                return hit[0], hit[1], digest
        found = self.disk.get(digest, self.encoder.tokens_per_square, self.spec.text_dim) if self.disk else None
        if found is not None:
            grid, rows = found
            with self._lock:
                self.stats["from_disk"] += 1
        else:
            t0 = time.perf_counter()
            cut = squares(rgb, self.spec)
            grid, rows = cut.grid, self._encode(cut.images)
            with self._lock:
                self.stats["encoded"] += 1
                self.stats["encode_s"] += time.perf_counter() - t0
            if self.disk is not None:
                self.disk.put(digest, grid, rows)
        with self._lock:
            if rows.nbytes <= self.cache_bytes and digest not in self._cache:
                self._cache[digest] = (grid, rows)
                self._cached_bytes += rows.nbytes
                while self._cached_bytes > self.cache_bytes:
                    _, (_, old) = self._cache.popitem(last=False)
                    self._cached_bytes -= old.nbytes
        return grid, rows, digest

    def prompt(self, text: str, images, add_bos: bool | None = None) -> tuple[list[int], tuple]:
        """(token ids, ``Request.embeds``) of ``text`` with ``images`` at its markers
        (``vision.prompt.MARKER``); with no marker, the images go first, ahead of the text, as
        llama.cpp's mtmd-cli puts them."""
        images = list(images)
        if layout.MARKER not in text:
            text = layout.MARKER * len(images) + text
        try:
            return layout.build(self.tokenizer, text, [self.embeddings(i) for i in images], self.spec.projector,
                                bool(self.tokenizer.spec.add_bos) if add_bos is None else add_bos,
                                dict(self._tokens), self._vocab)
        except ValueError as e:
            raise ImageError(str(e)) from None


def message_images(messages) -> tuple[list[dict], list]:
    """``messages`` with each content list's image parts replaced by ``vision.prompt.MARKER``
    in its text (as llama.cpp's server does before the chat template runs), and the images
    in order: an ``image_url`` part's ``data:`` URL as bytes (any other URL is an
    ImageError), an ``image`` part's value (bytes, a path or an RGB array) as it is."""
    from .vision.decode import image_url_bytes

    out, images = [], []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            out.append(m)
            continue
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "image_url":
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                if not isinstance(url, str):
                    raise ImageError(f"messages[{i}].content[{j}].image_url must hold a 'url' string")
                images.append(image_url_bytes(url))
                texts.append(layout.MARKER)
            elif kind == "image":
                images.append(part.get("image"))
                texts.append(layout.MARKER)
            elif kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:  # left for the caller's checks of a message
                texts.append(part)
        if all(isinstance(t, str) for t in texts):
            out.append({**m, "content": "".join(texts)})
        else:
            out.append({**m, "content": [{"type": "text", "text": t} if isinstance(t, str) else t for t in texts]})
    return out, images
