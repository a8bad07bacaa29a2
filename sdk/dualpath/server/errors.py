"""The server's errors: OpenAI-shaped bodies ``{"error": {"message", "type", "param", "code"}}``
and the one table that says which status each of DualPath's own errors gets.

A refusal of the request (its JSON, a field, a prompt) is 400; a full queue is 429 and a KV
cache with no room 503, both with ``Retry-After``; everything else is the server's own
failure: 500 with a fixed message, the cause logged here and never sent.
"""

from __future__ import annotations

import json
import logging

from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse

from ..errors import (
    CacheFullError,
    ChatTemplateError,
    DualPathError,
    ImageError,
    InternalError,
    InvalidPromptError,
    ModelTaskError,
    PromptTooLongError,
    QueueFullError,
    SamplingParamsError,
    ToolsNotRenderedError,
)
from ..sampling.grammar import StructuredOutputError

log = logging.getLogger(__name__)

INTERNAL_MESSAGE = "the server failed to complete the request; it may be retried"
"""The whole body of a 500 for a failure that is not an ``InternalError`` (whose message
says the same, with the request's id): no exception text, no traceback."""


class APIError(Exception):
    """An answer other than 200: its status, the OpenAI error object, extra headers."""

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return ErrorResponse(self.body(), status_code=self.status, headers=self.headers)


class ErrorResponse(JSONResponse):
    """An error's JSON, in ASCII: a message may quote the request (a field's name), and a
    stray surrogate in it cannot be written as UTF-8."""

    def render(self, content) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("ascii")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """A 400: the request itself is wrong; ``param`` names the field at fault."""
    return APIError(400, message, param=param, code=code)


REFUSALS: tuple[tuple[type, int, str, str | None], ...] = (
    (QueueFullError, 429, "rate_limit_error", "queue_full"),
    (CacheFullError, 503, "server_error", "kv_cache_full"),
    (PromptTooLongError, 400, "invalid_request_error", "context_length_exceeded"),
    (InvalidPromptError, 400, "invalid_request_error", None),
    (SamplingParamsError, 400, "invalid_request_error", "invalid_value"),
    (StructuredOutputError, 400, "invalid_request_error", "invalid_value"),
    (ToolsNotRenderedError, 400, "invalid_request_error", "chat_template"),
    (ChatTemplateError, 400, "invalid_request_error", "chat_template"),
    (ModelTaskError, 400, "invalid_request_error", "model_not_supported"),
    (ImageError, 400, "invalid_request_error", "invalid_image"),
)
"""DualPath's errors that are answers, not failures: (class, status, type, code), a subclass
before its base. Their messages are written for the user and are sent as they are. Every
other ``DualPathError`` (a model, config, tokenizer, store or dependency problem) can only
be the server's own fault, and is a 500 like any unexpected exception."""
RETRY_AFTER_S = 1
"""``Retry-After`` of a 429 or 503, in seconds: the queue moves as soon as a running request ends."""


def api_error(exc: BaseException, param: str | None = None) -> APIError:
    """The API error a route answers with for ``exc``; ``param`` is the request field that
    carried the prompt, for a prompt refused by the engine. The 500s are logged here."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ClientDisconnect):  # nobody reads the answer: nothing to log either
        return bad_request("the client disconnected while sending the request", code="client_disconnected")
    for kind, status, type_, code in REFUSALS:
        if isinstance(exc, kind):
            where = getattr(exc, "param", None) or (param if isinstance(exc, InvalidPromptError) else None)
            headers = {"Retry-After": str(RETRY_AFTER_S)} if status in (429, 503) else None
            return APIError(status, str(exc), type_=type_, param=where, code=code, headers=headers)
    if isinstance(exc, InternalError):  # its message is written to be sent: no internals in it
        log.error("%s (cause: %r)", exc, exc.__cause__)
        return APIError(500, str(exc), type_="server_error", code="internal_error")
    log.error("request failed", exc_info=exc)
    return APIError(500, INTERNAL_MESSAGE, type_="server_error", code="internal_error")


async def engine_call(call, param: str):
    """Await an engine call; what it raises as an API error naming ``param`` (the field
    that carried the prompt) where the prompt was refused."""
    try:
        return await call
    except DualPathError as e:
        raise api_error(e, param) from None
