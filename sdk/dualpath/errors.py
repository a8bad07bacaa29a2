"""Exceptions raised by DualPath's public API.

Every error names the thing that is wrong (a file, a config key, a parameter)
and what was expected, so a user can fix it without reading our code.
"""

from __future__ import annotations

import os


class DualPathError(Exception):
    """Base class of every error DualPath raises on purpose."""


class ModelLoadError(DualPathError, ValueError):
    """A model file could not be loaded: names the file and the problem."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class ConfigError(DualPathError, ValueError):
    """A configuration file or override is invalid: names the file, key and allowed range."""


class SamplingParamsError(DualPathError, ValueError):
    """A sampling parameter is out of range: names the parameter and its range."""


class InvalidPromptError(DualPathError, ValueError):
    """The prompt is empty or holds token ids outside the vocabulary."""


class PromptTooLongError(InvalidPromptError):
    """The prompt does not fit in the context window."""


class ModelTaskError(DualPathError, ValueError):
    """The model cannot do what was asked of it: text generation from an embedding-only model
    (an encoder such as BERT), or embeddings from a model that has no embedding path."""


class TokenizerError(DualPathError, ValueError):
    """A tokenizer description is unusable (missing vocabulary, bad ids)."""


class ChatTemplateError(DualPathError, ValueError):
    """The model has no chat template, or the template failed to render."""


class ToolsNotRenderedError(ChatTemplateError):
    """The chat template was given tools and wrote none of them into the prompt."""


class ImageError(DualPathError, ValueError):
    """An image cannot be used: not PNG or JPEG, broken, too large, or where it may not come
    from (a remote URL); names the problem."""


class CacheFullError(DualPathError, MemoryError):
    """The KV cache has no room for a request even with nothing else in it, or (the
    single-sequence runner, sized for twice the context) for the step: a cache sized
    too small for the requests it is given."""


class QueueFullError(DualPathError):
    """A queue of waiting requests (the engine's, the encoder's) is full; retry later."""

    def __init__(self, waiting: int, limit: int):
        super().__init__(f"{waiting} requests are already waiting (limit {limit}); retry later")
        self.waiting, self.limit = waiting, limit


class InternalError(DualPathError, RuntimeError):
    """The engine failed for a reason of its own, not the request's (a step raised twice
    while the request was in it): the request could not be completed. The message says
    so without internals; the cause is logged and chained."""


class InvariantError(DualPathError, AssertionError):
    """The KV cache's bookkeeping disagrees with a recount (``check_invariants``): a bug of
    ours, never the user's. Raised explicitly rather than by ``assert`` so that ``python -O``,
    which strips asserts, cannot make the server's shutdown check pass silently. It is an
    ``AssertionError`` too, so tests written against the old asserts still catch it."""


def require(condition: object, message: str = "invariant broken") -> None:
    """Raise ``InvariantError(message)`` unless ``condition`` holds: an ``assert`` that
    ``python -O`` keeps."""
    if not condition:
        raise InvariantError(message)
