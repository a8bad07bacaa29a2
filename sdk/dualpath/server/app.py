"""The OpenAI-compatible HTTP server: a Starlette app over one ``LLM``'s engine.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON, or
server-sent events with ``"stream": true``), ``POST /v1/embeddings``, ``POST /v1/warm`` (compute a
prompt's KV ahead of its requests; on disk too with the prefix cache), ``GET /v1/models``, ``GET /health``,
``GET /metrics`` (Prometheus text), and unless ``server.webui`` is off, the chat page at ``GET /``
(``static/``: plain files, no build step, no external requests, served with a
Content-Security-Policy that allows this server's own scripts only).

Errors are OpenAI-style objects ``{"error": {"message", "type", "param", "code"}}``:
400 for malformed JSON or bad parameters, 401 for a missing or wrong API key,
404 for an unknown model or route, 413 for a body over ``server.max_body_bytes``,
429 (with ``Retry-After``) when ``server.max_queued_requests`` are waiting,
500 (``server_error``, no internals: the cause goes to the log) when the engine
failed the request. A stream that fails after it started sends one
``data: {"error": ...}`` event, then ``data: [DONE]``.
A client that disconnects aborts its request, which frees its cache.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import logging
import os
import time
import uuid
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import (ChatTemplateError, DualPathError, InternalError, InvalidPromptError, PromptTooLongError,
                      SamplingParamsError)
from ..runtime.engine import QueueFullError
from ..runtime.sampler import SamplingParams

log = logging.getLogger(__name__)

_FINISH = {"stop": "stop", "length": "length", "context_full": "length", "abort": "stop"}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def api_error(exc: BaseException) -> APIError:
    """The API error a route answers with for ``exc``: our refusals as 400, the engine's own
    failures and anything unexpected as 500 with no internals (those are logged here)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InternalError):
        log.error("%s (cause: %r)", exc, exc.__cause__)
        return APIError(500, str(exc), type_="server_error", code="internal_error")
    if isinstance(exc, DualPathError):
        return APIError(400, str(exc))
    log.error("request failed", exc_info=exc)
    return APIError(500, "the server failed to complete the request; it may be retried",
                    type_="server_error", code="internal_error")


# -- request parsing ---------------------------------------------------------------

def _get(body: dict, key: str, kinds: tuple, default: Any = None, *, check=None, allowed: str = "") -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds:
        raise _bad(f"'{key}' must be {allowed or ' or '.join(k.__name__ for k in kinds)}, got {value!r}", key)
    if not isinstance(value, kinds):
        raise _bad(f"'{key}' must be {allowed or ' or '.join(k.__name__ for k in kinds)}, "
                   f"got {type(value).__name__}", key)
    if check is not None and not check(value):
        raise _bad(f"'{key}'={value!r} must be {allowed}", key)
    return value


# Every field of OpenAI's request schemas, and ours (llama.cpp's names): each is honoured,
# or refused with 400 naming it when it asks for something this server does not do.
# A field in neither set is refused as unknown, never silently dropped.
_COMMON = {"model", "stream", "stream_options", "temperature", "top_p", "n", "stop", "max_tokens", "seed",
           "presence_penalty", "frequency_penalty", "logit_bias", "user",
           "top_k", "min_p", "repetition_penalty", "ignore_eos"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "logprobs", "best_of", "suffix"}
CHAT_FIELDS = _COMMON | {"messages", "logprobs", "top_logprobs", "max_completion_tokens", "metadata", "store",
                         "service_tier", "parallel_tool_calls", "response_format", "tools", "tool_choice",
                         "audio", "modalities", "prediction", "reasoning_effort", "web_search_options",
                         "functions", "function_call"}


def check_fields(body: dict, known: set[str], endpoint: str) -> None:
    """400 naming the first field that is unknown, or known but asking for what is not done."""
    for key in body:
        if key not in known:
            raise _bad(f"unknown field '{key}' for {endpoint}", key, "unknown_field")
    refuse = {
        "suffix": lambda v: v not in (None, ""),
        "best_of": lambda v: v not in (None, 1) and v != body.get("n", 1),
        "audio": lambda v: v is not None,
        "modalities": lambda v: v not in (None, ["text"]),
        "prediction": lambda v: v is not None,
        "reasoning_effort": lambda v: v is not None,
        "web_search_options": lambda v: v is not None,
        "functions": lambda v: v is not None,
        "function_call": lambda v: v is not None,
        "store": lambda v: v not in (None, False),
    }
    for key, refused in refuse.items():
        if key in body and refused(body[key]):
            raise _bad(f"'{key}'={json.dumps(body[key])[:200]} is not supported by this server", key,
                       "unsupported_field")


def sampling_params(body: dict, default_max_tokens: int | None, context_tokens: int,
                    logprobs: int | None = None) -> SamplingParams:
    """OpenAI request fields -> SamplingParams (OpenAI's defaults: temperature 1,
    top_p 1, no top_k or min_p unless given as extra fields)."""
    bias = _get(body, "logit_bias", (dict,), {})
    try:
        bias = {int(k): v for k, v in bias.items()}
    except (TypeError, ValueError):
        raise _bad("'logit_bias' must map token ids (as strings of digits) to numbers", "logit_bias") from None
    max_tokens = _get(body, "max_completion_tokens", (int,), None) or _get(body, "max_tokens", (int,), None)
    if max_tokens is None:
        max_tokens = default_max_tokens or context_tokens
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 16:
        stop = tuple(s for s in stop if s)
    else:
        raise _bad("'stop' must be a string or a list of at most 16 strings", "stop")
    num = (int, float)
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=float(_get(body, "temperature", num, 1.0)),
            top_p=float(_get(body, "top_p", num, 1.0)),
            top_k=_get(body, "top_k", (int,), 0),
            min_p=float(_get(body, "min_p", num, 0.0)),
            repetition_penalty=float(_get(body, "repetition_penalty", num, 1.0)),
            seed=_get(body, "seed", (int,), None),
            stop=stop,
            ignore_eos=_get(body, "ignore_eos", (bool,), False),
            presence_penalty=float(_get(body, "presence_penalty", num, 0.0)),
            frequency_penalty=float(_get(body, "frequency_penalty", num, 0.0)),
            logit_bias=bias,
            logprobs=logprobs,
        )
    except SamplingParamsError as e:
        raise _bad(str(e), code="invalid_value") from None


def _usage(completions) -> dict:
    """One usage for the choices of a request: the prompt once (it is computed once)."""
    first = completions[0].usage
    generated = sum(c.usage.completion_tokens for c in completions)
    return {"prompt_tokens": first.prompt_tokens, "completion_tokens": generated,
            "total_tokens": first.prompt_tokens + generated,
            "prompt_tokens_details": {"cached_tokens": first.cached_prompt_tokens}}



async def _engine_call(call, param: str):
    """Await an engine call; its refusals as API errors: a full queue is 429 (retry),
    a prompt too long or invalid is 400 naming ``param`` (the field that carried it)."""
    try:
        return await call
    except QueueFullError as e:
        raise APIError(429, str(e), type_="rate_limit_error", code="queue_full",
                       headers={"Retry-After": "1"}) from None
    except PromptTooLongError as e:
        raise _bad(str(e), param, "context_length_exceeded") from None
    except InvalidPromptError as e:
        raise _bad(str(e), param) from None

class Server:
    """State shared by the routes: the LLM, its engine, the server config."""

    def __init__(self, llm, model_name: str | None = None):
        self.llm = llm
        self.engine = llm.engine
        self.cfg = llm.config.server
        file_name = os.path.basename(str(llm.spec.path))
        self.model_name = model_name or self.cfg.model_name or file_name
        """The id /v1/models lists and responses carry (``--alias`` / server.model_name)."""
        self.model_names = tuple(dict.fromkeys((self.model_name, file_name)))
        """What requests may name when server.strict_model_name is on (else any name is served)."""
        self.created = int(time.time())
        self.tokenizer = llm.tokenizer
        self._grammars = None  # runtime/grammar.py's compiler, made on the first structured request

    # -- plumbing --------------------------------------------------------------
    def _check_auth(self, request: Request) -> None:
        key = self.cfg.api_key
        if not key:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                           type_="authentication_error", code="invalid_api_key")

    async def _json(self, request: Request) -> dict:
        limit = self.cfg.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise APIError(413, f"request body of {length} bytes is over the limit of {limit} bytes",
                           code="request_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise APIError(413, f"request body is over the limit of {limit} bytes", code="request_too_large")
            chunks.append(chunk)
        raw = b"".join(chunks)
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _bad(f"the request body is not valid JSON: {e}", code="invalid_json") from None
        if not isinstance(body, dict):
            raise _bad("the request body must be a JSON object", code="invalid_json")
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise _bad("'model' must be a string", "model")
        if model is not None and self.cfg.strict_model_name and model not in self.model_names:
            raise APIError(404, f"the model '{model}' does not exist; this server serves "
                                f"{' or '.join(repr(m) for m in self.model_names)}",
                           param="model", code="model_not_found")
        return body

    def _num_choices(self, body: dict) -> int:
        limit = self.engine.scheduler.max_num_seqs
        return _get(body, "n", (int,), 1, check=lambda v: 1 <= v <= limit,
                    allowed=f"between 1 and {limit} (runtime.max_num_seqs: the samples run at once)")

    async def _submit(self, ids: list[int], params: SamplingParams, n: int = 1, prompt_logprobs: bool = False,
                      grammar=None):
        return await _engine_call(self.engine.submit_n(ids, params, n, prompt_logprobs=prompt_logprobs,
                                                       grammar=grammar), "prompt")

    async def embeddings(self, request: Request) -> Response:
        """The pooled final hidden state of each input (the model's pooling type from its
        GGUF, mean when it names none), L2-normalised, all inputs batched in one go."""
        self._check_auth(request)
        body = await self._json(request)
        check_fields(body, EMBEDDING_FIELDS, "/v1/embeddings")
        raw = body.get("input")
        if isinstance(raw, str) or (isinstance(raw, list) and raw and all(
                isinstance(t, int) and not isinstance(t, bool) for t in raw)):
            raw = [raw]
        if not isinstance(raw, list) or not raw or len(raw) > 2048:
            raise _bad("'input' must be a string, a list of token ids, or a list of 1 to 2048 of those", "input")
        prompts = []
        for i, item in enumerate(raw):
            if isinstance(item, str) and item:
                prompts.append(self.llm.tokenize(item))
            elif isinstance(item, list) and item and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
                prompts.append(list(item))
            else:
                raise _bad(f"input[{i}] must be a non-empty string or a non-empty list of token ids", "input")
        fmt = _get(body, "encoding_format", (str,), "float", check=lambda v: v in ("float", "base64"),
                   allowed="'float' or 'base64'")
        dim = self.llm.spec.config.dim
        _get(body, "dimensions", (int,), dim, check=lambda v: v == dim,
             allowed=f"{dim} (this model's embedding size; shortening is not supported)")
        vectors = await _engine_call(self.engine.embed(prompts, self.llm.spec.metadata.get("pooling", "mean")),
                                     "input")
        data = []
        for i, v in enumerate(vectors):
            if fmt == "base64":
                value = base64.b64encode(np.asarray(v, "<f4").tobytes()).decode()
            else:
                value = [float(x) for x in v]
            data.append({"object": "embedding", "index": i, "embedding": value})
        tokens = sum(len(p) for p in prompts)
        return JSONResponse({"object": "list", "data": data, "model": self.model_name,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    # -- structured output ------------------------------------------------------
    def _grammar(self, body: dict):
        """The grammar of a chat request's response_format / tools / tool_choice (None: free text)."""
        rf, tools, choice = body.get("response_format"), body.get("tools"), body.get("tool_choice")
        if rf in (None, {"type": "text"}) and not tools:
            return None
        from ..runtime.grammar import GrammarCompiler, StructuredOutputError

        try:
            if self._grammars is None:
                self._grammars = GrammarCompiler(self.tokenizer, self.llm.spec.config.vocab_size)
            return self._grammars.compile(rf, tools, choice)
        except StructuredOutputError as e:
            raise _bad(str(e), e.param, "invalid_value") from None
        except ImportError as e:
            field = "response_format" if rf not in (None, {"type": "text"}) else "tools"
            raise _bad(f"'{field}' needs structured output, which is not installed on this server: {e}", field,
                       "unsupported_field") from None

    # -- log-probabilities ------------------------------------------------------
    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")

    def _completion_logprobs(self, entries, offset: list[int]) -> dict:
        """The legacy completions shape: tokens, token_logprobs, top_logprobs, text_offset."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token, lp, alternatives in entries:
            text = self._token_text(token)
            out["tokens"].append(text)
            out["token_logprobs"].append(lp)
            out["top_logprobs"].append(None if alternatives is None else
                                       {self._token_text(i): v for i, v in alternatives})
            out["text_offset"].append(offset[0])
            offset[0] += len(text)
        return out

    def _chat_logprobs(self, entries) -> list[dict]:
        """The chat shape: per token its text, logprob, bytes and top_logprobs."""
        out = []
        for token, lp, alternatives in entries or ():
            raw = self.tokenizer.token_bytes(token)
            out.append({"token": raw.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(raw),
                        "top_logprobs": [{"token": self._token_text(i), "logprob": v,
                                          "bytes": list(self.tokenizer.token_bytes(i))} for i, v in alternatives]})
        return out

    # -- routes ----------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self.model_name, "running": self.engine.num_running,
                             "waiting": self.engine.num_waiting})

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(self.engine.metrics_text(), media_type="text/plain; version=0.0.4")

    async def page(self, request: Request) -> Response:
        """The chat page and its two files; nothing else is read from disk."""
        name = request.path_params.get("name", "index.html")
        kind = _STATIC.get(name)
        at_root = "name" not in request.path_params
        if kind is None or (name == "index.html") != at_root:  # the page at / only: its links are relative
            raise APIError(404, f"no route GET {request.url.path}", code="not_found")
        with open(os.path.join(os.path.dirname(__file__), "static", name), "rb") as f:
            body = f.read()
        return Response(body, media_type=kind, headers={
            "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                                       "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'",
            "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"})

    async def models(self, request: Request) -> Response:
        self._check_auth(request)
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "dualpath",
             "context_length": self.engine.context_tokens}]})

    async def completions(self, request: Request) -> Response:
        self._check_auth(request)
        body = await self._json(request)
        ids = self._prompt_ids(body.get("prompt"))
        check_fields(body, COMPLETION_FIELDS, "/v1/completions")
        logprobs = _get(body, "logprobs", (int,), None, check=lambda v: 0 <= v <= 20,
                        allowed="an integer between 0 and 20")
        params = sampling_params(body, 16, self.engine.context_tokens, logprobs)
        stream = _get(body, "stream", (bool,), False)
        echo = _get(body, "echo", (bool,), False)
        n = self._num_choices(body)
        echo_logprobs = echo and logprobs is not None
        handles = await self._submit(ids, params, n, prompt_logprobs=echo_logprobs)
        rid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        prefix = self.llm.detokenize(ids) if echo else ""
        offsets = [[0 if echo_logprobs else len(prefix)] for _ in range(n)]  # per choice: offset of its next token

        def prompt_entries():  # echo with logprobs: the prompt's tokens (the first has none)
            first = handles[0].request.prompt_logprobs
            return [(ids[0], None, None)] + list(first)

        def chunk(i: int, text: str, finish: str | None, entries=()) -> dict:
            lp = self._completion_logprobs(entries, offsets[i]) if logprobs is not None else None
            return {"id": rid, "object": "text_completion", "created": created, "model": self.model_name,
                    "choices": [{"index": i, "text": text, "logprobs": lp, "finish_reason": finish}]}

        if stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

            async def events():
                started = [False] * n
                for i in range(n if prefix and not echo_logprobs else 0):
                    yield _sse(chunk(i, prefix, None))
                async for i, d in _merged(handles):
                    if echo_logprobs and not started[i]:  # the prompt's log-probabilities exist now
                        started[i] = True
                        yield _sse(chunk(i, prefix, None, prompt_entries()))
                    if d.finish_reason is not None:
                        yield _sse(chunk(i, d.text, _FINISH[d.finish_reason], d.logprobs))
                    elif d.text or d.logprobs:
                        yield _sse(chunk(i, d.text, None, d.logprobs))
                if include_usage:
                    yield _sse({**chunk(0, "", None), "choices": [], "usage": _usage([h.completion for h in handles])})
                yield "data: [DONE]\n\n"

            return _event_stream(events(), handles)
        cs = await _collect(request, handles)
        out = chunk(0, "", None)
        before = prompt_entries() if echo_logprobs else []
        out["choices"] = [chunk(i, prefix + c.text, _FINISH[c.finish_reason],
                                before + list(c.logprobs or ()))["choices"][0] for i, c in enumerate(cs)]
        out["usage"] = _usage(cs)
        return JSONResponse(out)

    def _chat_ids(self, messages) -> list[int]:
        """The prompt token ids of a chat's ``messages``, rendered by the chat template."""
        if not isinstance(messages, list) or not messages:
            raise _bad("'messages' must be a non-empty list of {role, content} objects", "messages")
        clean = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _bad(f"messages[{i}] must be an object with a string 'role'", "messages")
            content = m.get("content")
            if isinstance(content, list):  # content parts: text only
                texts = []
                for part in content:
                    if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                        raise _bad(f"messages[{i}].content: only text parts are supported", "messages")
                    texts.append(part["text"])
                content = "".join(texts)
            if content is None:
                content = ""
            if not isinstance(content, str):
                raise _bad(f"messages[{i}].content must be a string or a list of text parts", "messages")
            clean.append({"role": m["role"], "content": content})
        try:
            return self.llm.chat_prompt_ids(clean)
        except ChatTemplateError as e:
            raise _bad(f"{e} (send it to /v1/completions)", "messages", "chat_template") from None

    def _prompt_ids(self, prompt) -> list[int]:
        """The token ids of a completion's ``prompt``: text, token ids, or a list of one of those."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.llm.tokenize(prompt)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                       for t in prompt):
            return list(prompt)
        raise _bad("'prompt' must be a string, a list of token ids, or a list holding one of those", "prompt")

    async def warm(self, request: Request) -> Response:
        """Compute a prompt's KV now (``prompt`` as for /v1/completions, or ``messages`` as
        for /v1/chat/completions), so that later requests starting with it reuse its pages;
        with the prefix cache on disk, after a restart too: the answer comes once its pages
        are written."""
        self._check_auth(request)
        body = await self._json(request)
        check_fields(body, {"model", "prompt", "messages"}, "/v1/warm")
        if ("prompt" in body) == ("messages" in body):
            raise _bad("give either 'prompt' (text or token ids) or 'messages' (a chat)", "prompt")
        ids = self._chat_ids(body["messages"]) if "messages" in body else self._prompt_ids(body["prompt"])
        params = SamplingParams(max_tokens=1, temperature=0.0)
        handles = await self._submit(ids, params)
        (c,) = await _collect(request, handles)
        store = self.llm.prefix_store
        if store is not None:
            await asyncio.to_thread(store.flush)
        P = self.engine.runner.cache.page_tokens
        return JSONResponse({"object": "warm", "model": self.model_name, "stored_tokens": len(ids) // P * P,
                             "on_disk": store is not None,
                             "usage": {"prompt_tokens": len(ids),
                                       "prompt_tokens_details": {"cached_tokens": c.usage.cached_prompt_tokens}}})

    async def chat_completions(self, request: Request) -> Response:
        self._check_auth(request)
        body = await self._json(request)
        messages = body.get("messages")
        check_fields(body, CHAT_FIELDS, "/v1/chat/completions")
        want_logprobs = _get(body, "logprobs", (bool,), False)
        top = _get(body, "top_logprobs", (int,), None, check=lambda v: 0 <= v <= 20,
                   allowed="an integer between 0 and 20")
        if top is not None and not want_logprobs:
            raise _bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        params = sampling_params(body, None, self.engine.context_tokens, (top or 0) if want_logprobs else None)
        stream = _get(body, "stream", (bool,), False)
        ids = self._chat_ids(messages)
        n = self._num_choices(body)
        grammar = self._grammar(body)
        tool_call = grammar is not None and grammar.kind == "tool_call"
        handles = await self._submit(ids, params, n, grammar=grammar)
        rid = f"chatcmpl-{uuid.uuid4().hex}"

        def tool_calls(text: str) -> list[dict]:  # the grammar's {"name", "arguments"} as OpenAI's tool_calls
            call = json.loads(text)
            return [{"index": 0, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                     "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]

        def finish_of(c) -> str:
            return "tool_calls" if tool_call and c.finish_reason == "stop" else _FINISH[c.finish_reason]
        created = int(time.time())

        def chunk(i: int, delta: dict, finish: str | None, entries=()) -> dict:
            lp = {"content": self._chat_logprobs(entries)} if want_logprobs and entries else None
            return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": self.model_name,
                    "choices": [{"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}]}

        if stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

            async def events():
                for i in range(n):
                    yield _sse(chunk(i, {"role": "assistant", "content": ""}, None))
                async for i, d in _merged(handles):
                    if (d.text or d.logprobs) and not tool_call:
                        yield _sse(chunk(i, {"content": d.text}, None, d.logprobs))
                    if d.finish_reason is not None:
                        if tool_call and d.finish_reason == "stop":  # one delta with the whole call
                            yield _sse(chunk(i, {"tool_calls": tool_calls(d.completion.text)}, None))
                        yield _sse(chunk(i, {}, finish_of(d.completion)))
                if include_usage:
                    yield _sse({**chunk(0, {}, None), "choices": [], "usage": _usage([h.completion for h in handles])})
                yield "data: [DONE]\n\n"

            return _event_stream(events(), handles)
        cs = await _collect(request, handles)
        return JSONResponse({
            "id": rid, "object": "chat.completion", "created": created, "model": self.model_name,
            "choices": [{"index": i,
                         "message": ({"role": "assistant", "content": None, "tool_calls": tool_calls(c.text)}
                                     if tool_call and c.finish_reason == "stop"
                                     else {"role": "assistant", "content": c.text}),
                         "logprobs": {"content": self._chat_logprobs(c.logprobs)} if want_logprobs else None,
                         "finish_reason": finish_of(c)} for i, c in enumerate(cs)],
            "usage": _usage(cs)})


EMBEDDING_FIELDS = {"model", "input", "encoding_format", "dimensions", "user"}
_STATIC = {"index.html": "text/html; charset=utf-8", "chat.js": "text/javascript; charset=utf-8",
           "chat.css": "text/css; charset=utf-8"}
"""The chat page's files (``static/``) and their types."""


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _merged(handles):
    """``(choice index, Delta)`` from every handle, as they come."""
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i, h):
        try:
            async for d in h:
                await q.put((i, d, None))
        except BaseException as e:  # delivered to the consumer, which raises it
            await q.put((i, None, e))
            return
        await q.put((i, None, None))

    tasks = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(handles)]
    left = len(tasks)
    try:
        while left:
            i, d, error = await q.get()
            if error is not None:
                raise error
            if d is None:
                left -= 1
                continue
            yield i, d
    finally:
        for t in tasks:
            t.cancel()


def _event_stream(events, handles) -> StreamingResponse:
    async def guarded():
        # Starlette cancels this generator when the client disconnects: abort then.
        try:
            async for e in events:
                yield e
        except Exception as exc:  # the status line is sent: the error goes in the stream
            yield _sse(api_error(exc).body())
            yield "data: [DONE]\n\n"
        finally:
            for h in handles:
                if h.completion is None:
                    h.abort()

    return StreamingResponse(guarded(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _collect(request: Request, handles) -> list:
    """Wait for a non-streamed request's choices, aborting them if the client goes away."""

    async def watch():
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                for h in handles:
                    h.abort()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        async for _ in _merged(handles):
            pass
    finally:
        watcher.cancel()
    return [h.completion for h in handles]


def create_app(llm, *, model_name: str | None = None, on_shutdown=None) -> Starlette:
    """The ASGI app serving ``llm`` (its engine's background loop starts on the first request).
    ``on_shutdown()`` is called once the engine has stopped, when the app shuts down."""
    server = Server(llm, model_name)

    def wrap(fn):
        async def endpoint(request: Request) -> Response:
            try:
                return await fn(request)
            except Exception as e:
                return api_error(e).response()
        return endpoint

    async def not_found(request: Request, exc) -> Response:
        return APIError(404, f"no route {request.method} {request.url.path}", code="not_found").response()

    async def bad_method(request: Request, exc) -> Response:
        return APIError(405, f"method {request.method} is not allowed on {request.url.path}",
                        code="method_not_allowed").response()

    routes = [
        Route("/health", wrap(server.health), methods=["GET"]),
        Route("/metrics", wrap(server.metrics), methods=["GET"]),
        Route("/v1/models", wrap(server.models), methods=["GET"]),
        Route("/v1/completions", wrap(server.completions), methods=["POST"]),
        Route("/v1/chat/completions", wrap(server.chat_completions), methods=["POST"]),
        Route("/v1/embeddings", wrap(server.embeddings), methods=["POST"]),
        Route("/v1/warm", wrap(server.warm), methods=["POST"]),
    ]
    if server.cfg.webui:
        routes += [Route("/", wrap(server.page), methods=["GET"]),
                   Route("/static/{name}", wrap(server.page), methods=["GET"])]
    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        llm.engine.shutdown()
        if on_shutdown is not None:
            on_shutdown()

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: bad_method}, lifespan=lifespan)
    app.state.server = server
    return app
