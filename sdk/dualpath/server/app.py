"""The OpenAI-compatible HTTP server: a Starlette app over one ``LLM``'s engine.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON, or
server-sent events with ``"stream": true``), ``POST /v1/embeddings``, ``POST /v1/rerank`` and
``POST /rerank`` (a reranker's scores: ``rerank.py``), ``POST /v1/warm`` (compute a
prompt's KV ahead of its requests; on disk too with the prefix cache), ``GET /v1/models``, ``GET /health``,
``GET /metrics`` (Prometheus text), and unless ``server.webui`` is off, the chat page at ``GET /``
(``static/``: plain files, no build step, no external requests, served with a
Content-Security-Policy that allows this server's own scripts only).

Errors are OpenAI-style objects ``{"error": {"message", "type", "param", "code"}}``:
400 for malformed JSON or bad parameters, 401 for a missing or wrong API key, 403 for a
``Host`` not served (``HostGuard``: a loopback bind answers loopback names and
``server.allowed_hosts`` only, against DNS rebinding), 404 for an unknown model or route,
405 for a wrong method, 413 for a body over ``server.max_body_bytes``, 415 for a body not
declared ``application/json`` (what a web page cannot send cross-origin unasked), 429 (with ``Retry-After``)
when ``server.max_queued_requests``
are waiting, 503 (with ``Retry-After``) when the KV cache has no room, 500
(``server_error``, no internals: the cause goes to the log) when the server failed the
request (``errors.py`` holds the table). A stream that fails after it started sends one
``data: {"error": ...}`` event, then ``data: [DONE]`` (``streaming.py``).
A client that disconnects aborts its request, which frees its cache. Requests are
checked field by field before anything is queued (``parsing.py``); the chat template and
the tokenizer run off the event loop, so a long prompt or a slow template never holds up
another client. Connections: ``connections.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
import os
import time
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ..errors import ConfigError
from ..sampling.grammar import GrammarCompiler
from ..sampling_params import SamplingParams
from .embeddings import Embeddings
from .errors import APIError, api_error, bad_request, engine_call
from .parsing import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    WARM_FIELDS,
    chat_ids,
    check_fields,
    check_model,
    get_field,
    include_usage,
    logprobs_count,
    num_choices,
    prompt_ids,
    read_body,
    sampling_params,
)
from .reasoning import reasoning_request
from .rerank import rerank_response
from .streaming import DONE, collect, event_stream, merged, sse
from .structured import OpenAIGrammars
from .tool_calls import ToolCalls, ToolStream

log = logging.getLogger(__name__)

_FINISH = {"stop": "stop", "length": "length", "context_full": "length", "abort": "stop"}


def _answer(calls: ToolCalls, split: dict, finish: str) -> tuple[dict, str]:
    """(message, finish_reason) of a whole reply: its thinking split off (``split``, from
    server/reasoning.py), then its answer read for tool calls."""
    message, finish = calls.message(split["content"], finish)
    if "reasoning_content" in split:
        message["reasoning_content"] = split["reasoning_content"]
    return message, finish


def _usage(completions) -> dict:
    """One usage for the choices of a request: the prompt once (it is computed once)."""
    first = completions[0].usage
    generated = sum(c.usage.completion_tokens for c in completions)
    return {"prompt_tokens": first.prompt_tokens, "completion_tokens": generated,
            "total_tokens": first.prompt_tokens + generated,
            "prompt_tokens_details": {"cached_tokens": first.cached_prompt_tokens}}


IMAGE_BODY_BYTES = 32 << 20
"""The automatic body limit where the model takes images: the largest image vision/decode.py
takes (``MAX_IMAGE_BYTES``) as a base64 ``data:`` URL, and room for the rest of the request."""


class Server:
    """State shared by the routes: the LLM, its engine, the server config."""

    def __init__(self, llm, model_name: str | None = None, embedder=None):
        self.llm = llm
        self.engine: Any = getattr(llm, "engine", None)
        """The chat engine; None on an embedding-only server (an encoder has none: the
        generation routes check ``_generating`` before they touch it)."""
        self.cfg = llm.config.server
        file_name = os.path.basename(str(llm.spec.path))
        self.model_name = model_name or self.cfg.model_name or file_name
        """The id /v1/models lists and responses carry (``--alias`` / server.model_name)."""
        self.model_names = tuple(dict.fromkeys((self.model_name, file_name)))
        """What requests may name when server.strict_model_name is on (else any name is served)."""
        self.created = int(time.time())
        self.tokenizer = llm.tokenizer
        self.api_key = self.cfg.api_key or _read_key_file(self.cfg.api_key_file)
        self._grammars: OpenAIGrammars | None = None  # over the grammar compiler, made on first use
        self.embedder = Embeddings(llm, embedder)
        """What answers /v1/embeddings (server/embeddings.py)."""
        self.max_body_bytes = self.cfg.max_body_bytes or (
            IMAGE_BODY_BYTES if getattr(llm, "images", None) is not None else 1 << 20)
        """server.max_body_bytes, or its automatic value (config.py)."""

    # -- plumbing --------------------------------------------------------------
    def _check_auth(self, request: Request) -> None:
        key = self.api_key
        if not key:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                           type_="authentication_error", code="invalid_api_key")

    async def _json(self, request: Request, names: tuple[str, ...] | None = None) -> dict:
        body = await read_body(request, self.max_body_bytes)
        check_model(body, names or self.model_names, self.cfg.strict_model_name)
        return body

    def _generating(self, route: str) -> None:
        """400 on an embedding-only server: it has no chat engine."""
        if self.engine is None:
            raise bad_request(f"this server's model {self.model_name} is an embedding model "
                              f"({self.llm.spec.config.arch}): it answers /v1/embeddings, not {route}; serve a "
                              "text-generation model (dualpath serve -m CHAT.gguf --embedding-model "
                              f"{self.model_name})", "model", "model_not_supported")

    async def _submit(self, ids: list[int], params: SamplingParams, n: int = 1, prompt_logprobs: bool = False,
                      grammar=None, embeds=()):
        return await engine_call(self.engine.submit_n(ids, params, n, prompt_logprobs=prompt_logprobs,
                                                      grammar=grammar, embeds=embeds), "prompt")

    async def embeddings(self, request: Request) -> Response:
        """The pooled vector of each input, L2-normalised (server/embeddings.py says from which model)."""
        self._check_auth(request)
        e = self.embedder
        beside = e.encoder_llm is not None and e.encoder_llm is not self.llm
        body = await self._json(request, (e.model_name,) if beside else None)
        return JSONResponse(await e.answer(body, e.model_name if beside else self.model_name))

    async def rerank(self, request: Request) -> Response:
        """Documents scored against a query by a reranker (server/rerank.py)."""
        self._check_auth(request)
        e = self.embedder
        if e.encoder_llm is not None and e.encoder_llm.spec.metadata.get("pooling") == "rank":
            beside = e.encoder_llm is not self.llm  # a reranker beside the chat model: it answers
            body = await self._json(request, (e.model_name,) if beside else None)
            return JSONResponse(await rerank_response(e.encoder_llm, e.model_name if beside else self.model_name,
                                                      body, e))
        return JSONResponse(await rerank_response(self.llm, self.model_name, await self._json(request)))

    # -- structured output ------------------------------------------------------
    def _grammar(self, body: dict, calls: ToolCalls | None = None):
        """The grammar of a chat request's response_format / tools / tool_choice (None: free text)."""
        rf, tools, choice = body.get("response_format"), body.get("tools"), body.get("tool_choice")
        if rf in (None, {"type": "text"}) and not tools:
            return None
        lazy = calls is not None and calls.active and not calls.forced
        try:
            if self._grammars is None:
                self._grammars = OpenAIGrammars(GrammarCompiler(self.tokenizer, self.llm.spec.config.vocab_size))
            # StructuredOutputError: a 400 naming its param
            return self._grammars.compile(rf, tools, choice, calls.format if calls is not None and lazy else None,
                                          calls.parallel if calls is not None else True)
        except ImportError as e:
            if lazy and rf in (None, {"type": "text"}):  # calls are still read, just not held to their schemas
                return None
            field = "response_format" if rf not in (None, {"type": "text"}) else "tools"
            raise bad_request(f"'{field}' needs structured output, which is not installed on this server: {e}",
                              field, "unsupported_field") from None

    # -- log-probabilities ------------------------------------------------------
    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")

    def _completion_logprobs(self, entries, offset: list[int]) -> dict:
        """The legacy completions shape: tokens, token_logprobs, top_logprobs, text_offset."""
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
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
        e, q = self.engine, self.embedder.queue
        return JSONResponse({"status": "ok", "model": self.model_name, "running": e.num_running if e else 0,
                             "waiting": e.num_waiting if e else q.num_jobs if q else 0})

    async def metrics(self, request: Request) -> Response:
        q = self.embedder.queue
        text = self.engine.metrics_text() if self.engine else "\n".join(q.metrics_lines() if q else []) + "\n"
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

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
                                       "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
                                       "frame-ancestors 'none'",
            "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"})

    async def models(self, request: Request) -> Response:
        self._check_auth(request)
        models = [{"id": self.model_name, "object": "model", "created": self.created, "owned_by": "dualpath",
                   "context_length": self.llm.context_tokens,
                   "modalities": {"vision": getattr(self.llm, "images", None) is not None}}]
        e = self.embedder
        if e.encoder_llm is not None and e.encoder_llm is not self.llm:
            models.append(e.model_entry(self.created))
        return JSONResponse({"object": "list", "data": models})

    async def completions(self, request: Request) -> Response:
        self._check_auth(request)
        body = await self._json(request)
        check_fields(body, COMPLETION_FIELDS, "/v1/completions")
        self._generating("/v1/completions")
        ids = await asyncio.to_thread(prompt_ids, self.llm, body.get("prompt"))
        logprobs = logprobs_count(body, "logprobs")
        params = sampling_params(body, 16, self.engine.context_tokens, logprobs)
        stream, with_usage = get_field(body, "stream", (bool,), False), include_usage(body)
        echo = get_field(body, "echo", (bool,), False)
        n = num_choices(body, self.engine.scheduler.max_num_seqs)
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
            async def events():
                started = [False] * n
                for i in range(n if prefix and not echo_logprobs else 0):
                    yield sse(chunk(i, prefix, None))
                async for i, d in merged(handles):
                    if echo_logprobs and not started[i]:  # the prompt's log-probabilities exist now
                        started[i] = True
                        yield sse(chunk(i, prefix, None, prompt_entries()))
                    if d.finish_reason is not None:
                        yield sse(chunk(i, d.text, _FINISH[d.finish_reason], d.logprobs))
                    elif d.text or d.logprobs:
                        yield sse(chunk(i, d.text, None, d.logprobs))
                if with_usage:
                    yield sse({**chunk(0, "", None), "choices": [], "usage": _usage([h.completion for h in handles])})
                yield DONE

            return event_stream(events(), handles)
        cs = await collect(request, handles)
        out = chunk(0, "", None)
        before = prompt_entries() if echo_logprobs else []
        out["choices"] = [chunk(i, prefix + c.text, _FINISH[c.finish_reason],
                                before + list(c.logprobs or ()))["choices"][0] for i, c in enumerate(cs)]
        out["usage"] = _usage(cs)
        return JSONResponse(out)

    async def warm(self, request: Request) -> Response:
        """Compute a prompt's KV now (``prompt`` as for /v1/completions, or ``messages`` as
        for /v1/chat/completions), so that later requests starting with it reuse its pages;
        with the prefix cache on disk, after a restart too: the answer comes once its pages
        are written."""
        self._check_auth(request)
        body = await self._json(request)
        check_fields(body, WARM_FIELDS, "/v1/warm")
        self._generating("/v1/warm")
        if ("prompt" in body) == ("messages" in body):
            raise bad_request("give either 'prompt' (text or token ids) or 'messages' (a chat)", "prompt")
        if "messages" in body:  # its images too: a later question about one reuses the pages
            ids, embeds = await asyncio.to_thread(chat_ids, self.llm, body["messages"])
        else:
            ids, embeds = await asyncio.to_thread(prompt_ids, self.llm, body["prompt"]), ()
        params = SamplingParams(max_tokens=1, temperature=0.0)
        handles = await self._submit(ids, params, embeds=embeds)
        (c,) = await collect(request, handles)
        store = self.llm.prefix_store
        if store is not None:
            await asyncio.to_thread(store.flush)
        P = self.engine.scheduler.cache.page_tokens
        return JSONResponse({"object": "warm", "model": self.model_name, "stored_tokens": len(ids) // P * P,
                             "on_disk": store is not None,
                             "usage": {"prompt_tokens": len(ids),
                                       "prompt_tokens_details": {"cached_tokens": c.usage.cached_prompt_tokens}}})

    async def chat_completions(self, request: Request) -> Response:
        self._check_auth(request)
        body = await self._json(request)
        messages = body.get("messages")
        check_fields(body, CHAT_FIELDS, "/v1/chat/completions")
        self._generating("/v1/chat/completions")
        want_logprobs = get_field(body, "logprobs", (bool,), False)
        top = logprobs_count(body, "top_logprobs")
        if top is not None and not want_logprobs:
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        params = sampling_params(body, None, self.engine.context_tokens, (top or 0) if want_logprobs else None)
        thinking = reasoning_request(body, self.llm.config.reasoning, self.llm)
        stream, with_usage = get_field(body, "stream", (bool,), False), include_usage(body)
        calls = ToolCalls(body, self.llm.tool_format)
        # the template, the tokenizer and the images: off the loop
        ids, embeds = await asyncio.to_thread(chat_ids, self.llm, messages, calls.tools, thinking.template_kwargs)
        n = num_choices(body, self.engine.scheduler.max_num_seqs)
        grammar = self._grammar(body, calls)
        thinking = thinking.under(grammar)
        params = dataclasses.replace(params, reasoning_budget=thinking.budget_tokens)
        split = thinking.splitters(n, self.tokenizer, ids)
        handles = await self._submit(ids, params, n, grammar=grammar, embeds=embeds)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())

        def chunk(i: int, delta: dict, finish: str | None, entries=()) -> dict:
            lp = {"content": self._chat_logprobs(entries)} if want_logprobs and entries else None
            return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": self.model_name,
                    "choices": [{"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}]}

        if stream:
            async def events():
                streams = [ToolStream(calls) for _ in range(n)]  # server/tool_calls.py: content, then calls
                for i in range(n):
                    yield sse(chunk(i, {"role": "assistant", "content": ""}, None))
                async for i, d in merged(handles):
                    parts = split[i].delta(d.text, d.finish_reason is not None)
                    pieces = streams[i].push(parts.get("content", ""))
                    if "reasoning_content" in parts:
                        pieces.insert(0, {"reasoning_content": parts["reasoning_content"]})
                    if not pieces and d.logprobs and not calls.active:
                        pieces = [{"content": ""}]
                    for j, piece in enumerate(pieces):
                        yield sse(chunk(i, piece, None, d.logprobs if j == 0 else ()))
                    if d.finish_reason is not None:
                        last, finish = streams[i].finish(_FINISH[d.finish_reason])
                        for piece in last:
                            yield sse(chunk(i, piece, None))
                        yield sse(chunk(i, {}, finish))
                if with_usage:
                    yield sse({**chunk(0, {}, None), "choices": [], "usage": _usage([h.completion for h in handles])})
                yield DONE

            return event_stream(events(), handles)
        cs = await collect(request, handles)
        answers = [_answer(calls, split[i].message(c.text), _FINISH[c.finish_reason]) for i, c in enumerate(cs)]
        return JSONResponse({
            "id": rid, "object": "chat.completion", "created": created, "model": self.model_name,
            "choices": [{"index": i, "message": message,
                         "logprobs": {"content": self._chat_logprobs(c.logprobs)} if want_logprobs else None,
                         "finish_reason": finish} for i, (c, (message, finish)) in enumerate(zip(cs, answers))],
            "usage": _usage(cs)})


def _read_key_file(path: str) -> str:
    """The API key held in ``path`` (server.api_key_file), stripped; '' for no file."""
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as f:
            key = f.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"server.api_key_file={path!r}: cannot read the API key ({e})") from None
    if not key:
        raise ConfigError(f"server.api_key_file={path!r} is empty: it must hold the API key")
    return key


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
"""The Host names a loopback bind answers without ``server.allowed_hosts``."""


def allowed_hosts(bind: str, configured: str) -> frozenset[str] | None:
    """The Host names (lower case, no port) requests may carry; None: any.

    A page from any site can make a browser send requests to 127.0.0.1, and after DNS
    rebinding its own name points there, so it may read the answers: only its Host header
    tells it apart. On a loopback bind only loopback names are answered; elsewhere the
    check applies once ``allowed_hosts`` is set."""
    names = {h.strip().lower().rstrip(".") for h in configured.split(",") if h.strip()}
    if "*" in names:
        return None
    if not _is_loopback(bind) and not names:
        return None
    return frozenset(names | set(LOOPBACK_NAMES))


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host.strip().lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name of a Host header, lower case, without its port: ``[::1]:8080`` -> ``[::1]``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[:header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0].rstrip(".") if header.count(":") == 1 else header.rstrip(".")


class HostGuard:
    """ASGI middleware: a request whose Host is not allowed gets 403 before any route runs."""

    def __init__(self, app, allowed: frozenset[str] | None):
        self.app, self.allowed = app, allowed

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.allowed is not None:
            host = next((v for k, v in scope["headers"] if k == b"host"), None)
            name = host_name(host.decode("latin-1")) if host is not None else None
            # No Host at all is no browser's request (they always send it).
            if name is not None and name not in self.allowed and not name.endswith(".localhost"):
                refused = APIError(403, f"Host {name!r} is not served here: a loopback server answers "
                                        f"{', '.join(LOOPBACK_NAMES)} and server.allowed_hosts",
                                   type_="permission_error", code="host_not_allowed")
                await refused.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


_STATIC = {"index.html": "text/html; charset=utf-8", "chat.js": "text/javascript; charset=utf-8",
           "chat.css": "text/css; charset=utf-8"}
"""The chat page's files (``static/``) and their types."""


def create_app(llm, *, model_name: str | None = None, on_shutdown=None, embedder=None) -> Starlette:
    """The ASGI app serving ``llm`` (its engine's background loop starts on the first request),
    and ``embedder`` (an embedding model's ``LLM``) at /v1/embeddings beside it.
    ``on_shutdown()`` is called once the engine has stopped, when the app shuts down."""
    server = Server(llm, model_name, embedder)

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

    async def failed(request: Request, exc) -> Response:  # what escaped a route: JSON, never plain text
        return api_error(exc).response()

    routes = [
        Route("/health", wrap(server.health), methods=["GET"]),
        Route("/metrics", wrap(server.metrics), methods=["GET"]),
        Route("/v1/models", wrap(server.models), methods=["GET"]),
        Route("/v1/completions", wrap(server.completions), methods=["POST"]),
        Route("/v1/chat/completions", wrap(server.chat_completions), methods=["POST"]),
        Route("/v1/embeddings", wrap(server.embeddings), methods=["POST"]),
        Route("/v1/warm", wrap(server.warm), methods=["POST"]),
        Route("/v1/rerank", wrap(server.rerank), methods=["POST"]),
        Route("/rerank", wrap(server.rerank), methods=["POST"]),
    ]
    if server.cfg.webui and server.engine is not None:
        routes += [Route("/", wrap(server.page), methods=["GET"]),
                   Route("/static/{name}", wrap(server.page), methods=["GET"])]
    @contextlib.asynccontextmanager
    async def lifespan(app):
        from .connections import quiet_accept_errors

        quiet_accept_errors(asyncio.get_running_loop())
        if server.engine is not None and (llm.spec.tokenizer.chat_template or llm.config.runtime.chat_template):
            await asyncio.to_thread(llm.template_renderer.start)  # the first chat does not wait for it
        yield
        if server.engine is not None:
            server.engine.shutdown()
        server.embedder.shutdown()
        if on_shutdown is not None:
            on_shutdown()

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: bad_method, Exception: failed},
                    middleware=[Middleware(HostGuard,
                                           allowed=allowed_hosts(server.cfg.host, server.cfg.allowed_hosts))],
                    lifespan=lifespan)
    app.state.server = server
    return app
