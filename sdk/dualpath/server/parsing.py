"""Request parsing: the body read under its size limit, every field checked and turned
into what the engine takes (token ids, ``SamplingParams``), or a 400 naming the field.

Nothing here touches the engine: a request is refused before it is queued.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from ..errors import ChatTemplateError, SamplingParamsError, ToolsNotRenderedError
from ..sampling_params import SamplingParams
from .errors import APIError, bad_request

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
                         "functions", "function_call", "reasoning_format", "reasoning_budget",
                         "chat_template_kwargs"}
EMBEDDING_FIELDS = {"model", "input", "encoding_format", "dimensions", "user", "truncate"}
WARM_FIELDS = {"model", "prompt", "messages"}
MAX_EMBEDDING_INPUTS = 2048
"""OpenAI's limit on the inputs of one embeddings request."""


def get_field(body: dict, key: str, kinds: tuple, default: Any = None, *, check=None, allowed: str = "") -> Any:
    """``body[key]`` if it is one of ``kinds`` (a bool only where ``bool`` is listed) and
    passes ``check``; ``default`` where it is absent or null; else a 400 naming it."""
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds:
        raise bad_request(f"'{key}' must be {allowed or ' or '.join(k.__name__ for k in kinds)}, got {value!r}", key)
    if not isinstance(value, kinds):
        raise bad_request(f"'{key}' must be {allowed or ' or '.join(k.__name__ for k in kinds)}, "
                          f"got {type(value).__name__}", key)
    if check is not None and not check(value):
        raise bad_request(f"'{key}'={value!r} must be {allowed}", key)
    return value


def check_fields(body: dict, known: set[str], endpoint: str) -> None:
    """400 naming the first field that is unknown, or known but asking for what is not done."""
    for key in body:
        if key not in known:
            raise bad_request(f"unknown field '{key}' for {endpoint}", key, "unknown_field")
    refuse = {
        "suffix": lambda v: v not in (None, ""),
        "best_of": lambda v: v not in (None, 1) and v != body.get("n", 1),
        "audio": lambda v: v is not None,
        "modalities": lambda v: v not in (None, ["text"]),
        "prediction": lambda v: v is not None,
        "web_search_options": lambda v: v is not None,
        "functions": lambda v: v is not None,
        "function_call": lambda v: v is not None,
        "store": lambda v: v not in (None, False),
    }
    for key, refused in refuse.items():
        if key in body and refused(body[key]):
            raise bad_request(f"'{key}'={json.dumps(body[key])[:200]} is not supported by this server", key,
                              "unsupported_field")


async def read_body(request: Request, limit_bytes: int) -> dict:
    """The request's JSON object, read up to ``limit_bytes`` (server.max_body_bytes): 415
    unless it is declared ``application/json``, 413 beyond the limit (announced or
    streamed), 400 for anything but a JSON object."""
    # A web page can POST text/plain, a form or a typeless blob to any address without a
    # preflight, but not application/json: refusing the rest keeps pages from driving the server.
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise APIError(415, f"the request body must be sent as 'Content-Type: application/json', not "
                            f"{kind or 'without a Content-Type'!r}", code="unsupported_media_type")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit_bytes:
        raise APIError(413, f"request body of {length} bytes is over the limit of {limit_bytes} bytes",
                       code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit_bytes:
            raise APIError(413, f"request body is over the limit of {limit_bytes} bytes", code="request_too_large")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply to be read", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_json")
    return body


def check_model(body: dict, served: tuple[str, ...], strict: bool) -> None:
    """``model`` must be a string; with ``strict`` (server.strict_model_name) one of
    ``served``, else 404."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    if model is not None and strict and model not in served:
        raise APIError(404, f"the model '{model}' does not exist; this server serves "
                            f"{' or '.join(repr(m) for m in served)}", param="model", code="model_not_found")


def num_choices(body: dict, max_num_seqs: int) -> int:
    """``n``: the samples of one prompt, which run at once, so at most runtime.max_num_seqs."""
    return get_field(body, "n", (int,), 1, check=lambda v: 1 <= v <= max_num_seqs,
                     allowed=f"between 1 and {max_num_seqs} (runtime.max_num_seqs: the samples run at once)")


def include_usage(body: dict) -> bool:
    """``stream_options.include_usage``: a last chunk carries the usage."""
    options = get_field(body, "stream_options", (dict,), {})
    return get_field(options, "include_usage", (bool,), False)


def logprobs_count(body: dict, key: str) -> int | None:
    """``logprobs`` (completions) or ``top_logprobs`` (chat): alternatives per token, 0..20."""
    return get_field(body, key, (int,), None, check=lambda v: 0 <= v <= 20, allowed="an integer between 0 and 20")


def sampling_params(body: dict, default_max_tokens: int | None, context_tokens: int,
                    logprobs: int | None = None) -> SamplingParams:
    """OpenAI request fields -> SamplingParams (OpenAI's defaults: temperature 1,
    top_p 1, no top_k or min_p unless given as extra fields)."""
    bias: Any = get_field(body, "logit_bias", (dict,), {})
    try:
        bias = {int(k): v for k, v in bias.items()}
    except (TypeError, ValueError):
        raise bad_request("'logit_bias' must map token ids (as strings of digits) to numbers",
                          "logit_bias") from None
    max_tokens = get_field(body, "max_completion_tokens", (int,), None) or get_field(body, "max_tokens", (int,), None)
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
        raise bad_request("'stop' must be a string or a list of at most 16 strings", "stop")
    num = (int, float)
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=float(get_field(body, "temperature", num, 1.0)),
            top_p=float(get_field(body, "top_p", num, 1.0)),
            top_k=get_field(body, "top_k", (int,), 0),
            min_p=float(get_field(body, "min_p", num, 0.0)),
            repetition_penalty=float(get_field(body, "repetition_penalty", num, 1.0)),
            seed=get_field(body, "seed", (int,), None),
            stop=stop,
            ignore_eos=get_field(body, "ignore_eos", (bool,), False),
            presence_penalty=float(get_field(body, "presence_penalty", num, 0.0)),
            frequency_penalty=float(get_field(body, "frequency_penalty", num, 0.0)),
            logit_bias=bias,
            logprobs=logprobs,
        )
    except SamplingParamsError as e:
        raise bad_request(str(e), code="invalid_value") from None


def _is_ids(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool)
                                                           for t in value)


def prompt_ids(llm, prompt) -> list[int]:
    """The token ids of a completion's ``prompt``: text, token ids, or a list of one of those."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return llm.tokenize(prompt)
    if _is_ids(prompt):
        return list(prompt)
    raise bad_request("'prompt' must be a string, a list of token ids, or a list holding one of those", "prompt")


def embedding_inputs(llm, raw) -> list[list[int]]:
    """The token ids of each of an embeddings request's ``input``: a string, token ids, or
    a list of 1 to 2048 of those."""
    if isinstance(raw, str) or _is_ids(raw):
        raw = [raw]
    if not isinstance(raw, list) or not raw or len(raw) > MAX_EMBEDDING_INPUTS:
        raise bad_request(f"'input' must be a string, a list of token ids, or a list of 1 to "
                          f"{MAX_EMBEDDING_INPUTS} of those", "input")
    prompts = []
    for i, item in enumerate(raw):
        if isinstance(item, str) and item:
            prompts.append(llm.tokenize(item))
        elif _is_ids(item):
            prompts.append(list(item))
        else:
            raise bad_request(f"input[{i}] must be a non-empty string or a non-empty list of token ids", "input")
    return prompts


def _text_content(i: int, content, nullable: bool) -> str | None:
    if isinstance(content, list):  # content parts: text only
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "image_url":  # nothing here encodes images yet: said, not dropped
                raise bad_request(f"messages[{i}].content[{j}] is an image: this model takes text only",
                                  "messages")
            if kind != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"messages[{i}].content[{j}]: only text parts are supported", "messages")
            texts.append(part["text"])
        return "".join(texts)
    if content is None:
        return None if nullable else ""
    if not isinstance(content, str):
        raise bad_request(f"messages[{i}].content must be a string or a list of text parts", "messages")
    return content


def _tool_calls(i: int, calls) -> list[dict]:
    """An assistant turn's ``tool_calls``, checked: each ``{"id", "type": "function",
    "function": {"name", "arguments"}}`` with the arguments a JSON string (or an object)."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise bad_request(f"{where} must be a list of tool calls", "messages")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        kind = call.get("type", "function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or kind != "function":
            raise bad_request(f"{where}[{j}] must be {{\"id\", \"type\": \"function\", \"function\": "
                              "{\"name\", \"arguments\"}}", "messages")
        args = fn.get("arguments", "{}")
        if not isinstance(args, (str, dict)):
            raise bad_request(f"{where}[{j}].function.arguments must be a JSON string", "messages")
        clean = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
        if isinstance(call.get("id"), str):
            clean["id"] = call["id"]
        out.append(clean)
    return out


def chat_messages(messages) -> list[dict]:
    """A chat's ``messages`` checked, in the shapes templates read: text content, an
    assistant's ``tool_calls`` (its content may then be null), a ``tool`` turn's
    ``tool_call_id`` and ``name``."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of {role, content} objects", "messages")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a string 'role'", "messages")
        out: dict = {"role": m["role"], "content": _text_content(i, m.get("content"), False)}
        if m.get("tool_calls") is not None:
            if m["role"] != "assistant":
                raise bad_request(f"messages[{i}]: only an assistant message has 'tool_calls'", "messages")
            out["tool_calls"] = _tool_calls(i, m["tool_calls"])
        for key in ("tool_call_id", "name"):
            if m.get(key) is not None:
                if not isinstance(m[key], str):
                    raise bad_request(f"messages[{i}].{key} must be a string", "messages")
                out[key] = m[key]
        if isinstance(m.get("reasoning_content"), str):  # an earlier reply's thinking, for templates that read it
            out["reasoning_content"] = m["reasoning_content"]
        if m["role"] == "tool" and "tool_call_id" not in out:
            raise bad_request(f"messages[{i}]: a 'tool' message needs the 'tool_call_id' it answers", "messages")
        clean.append(out)
    return clean


def chat_ids(llm, messages, tools=None, chat_template_kwargs=None) -> tuple[list[int], tuple]:
    """The prompt of a chat's ``messages`` (with ``tools`` and ``chat_template_kwargs``),
    rendered by the chat template: token ids, and its images' rows (``Request.embeds``) where
    the model takes images (``image_url`` parts with ``data:`` URLs; an ImageError, a 400,
    for a bad one). Run off the event loop: it decodes and encodes the images."""
    images: list = []
    if llm.images is not None and isinstance(messages, list):  # else an image part is refused by name below
        from ..images import message_images

        messages, images = message_images(messages)
    clean = chat_messages(messages)
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
        raise bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    try:
        return llm.chat_prompt(clean, tools=tools, chat_template_kwargs=chat_template_kwargs, images=images)
    except ToolsNotRenderedError as e:
        raise bad_request(str(e), "tools", "chat_template") from None
    except ChatTemplateError as e:
        raise bad_request(f"{e} (send it to /v1/completions)", "messages", "chat_template") from None
