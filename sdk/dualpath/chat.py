"""A multi-turn conversation over one ``LLM``: ``dualpath chat`` and the API's ``Chat``.

Each turn prefills only what is new. The conversation is kept as the token ids the
model saw and wrote (``ids``: every prompt, then every generated token), beside the
template's text of them (``text``). A new turn renders the whole conversation with the
chat template and, where that text starts with ``text`` (the usual case: templates
append), tokenizes only the rest and appends it to ``ids``. The prompt of turn N then
starts with turn N-1's prompt and reply, token for token, so the prefix cache serves
all its full pages and only the new message and the last partial page are computed.
Where the rendering does not extend the last one (a template that trims a reply's
whitespace, a system prompt changed), the whole conversation is tokenized again and
the prefix cache still serves the pages up to the first different token.

A message can carry images (a model loaded with its projector, ``LLM(path, mmproj=...)``):
its content is then a list of parts (``{"type": "image", "image": ...}`` and ``{"type":
"text", "text": ...}``). A conversation with images is rendered and tokenized whole every
turn, since an image's rows are laid out with its tokens (images.py); its embeddings come
from the image cache and its pages from the prefix cache, so only what is new is computed.

When a turn would not fit the context (with room for ``reply_tokens`` more), the
oldest turns are dropped (the system message stays) and ``dropped_turns`` says how
many: the caller tells the user. A conversation that cannot fit even with one turn
raises ``PromptTooLongError``.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass

from .errors import DualPathError, PromptTooLongError
from .llm import LLM
from .sampling_params import SamplingParams

__all__ = ["Chat", "Thinking", "TurnStats"]


class Thinking(str):
    """A piece of a reply's thinking (``<think>...</think>``): ``Chat.send`` yields these
    beside the answer's pieces (plain ``str``) when ``reasoning_format`` is not none."""


@dataclass
class TurnStats:
    """How one turn went."""

    prompt_tokens: int = 0
    """Tokens of the turn's whole prompt (the conversation so far and the new message)."""
    cached_tokens: int = 0
    """Of those, read from the prefix cache instead of computed."""
    completion_tokens: int = 0
    ttft_ms: float = 0.0
    """Time to the first token of the reply."""
    decode_tokens_per_s: float = 0.0
    image_ms: float = 0.0
    """Making the conversation's images ready (encoding new ones), before the prompt went in."""
    finish_reason: str = ""
    dropped_turns: int = 0
    """Oldest turns dropped before this one to make it fit the context."""


class Chat:
    """A conversation: ``for text in chat.send("Hi"): ...`` streams the reply."""

    def __init__(self, llm: LLM, system: str | None = None, params: SamplingParams | None = None,
                 reply_tokens: int = 512):
        self.llm = llm
        self.params = params or SamplingParams(temperature=0.7, top_p=0.95, max_tokens=reply_tokens)
        self.reply_tokens = min(reply_tokens, self.params.max_tokens)
        """Room kept free in the context for the reply."""
        self.system = system
        self.messages: list[dict] = []
        """The turns, ``{"role": "user" | "assistant", "content": str}``, oldest first (a user
        turn with images: content parts, as the module says)."""
        self.ids: list[int] = []
        """What the model saw and wrote, in order (empty: nothing yet, or to be rendered again)."""
        self.text = ""
        """The chat template's text of ``ids``."""
        self.last = TurnStats()
        self.reasoning_format = llm.config.reasoning.format
        """deepseek (or auto): a reply's thinking comes as ``Thinking`` pieces, and only its
        answer stays in the conversation; none: the text as the model wrote it."""
        self.chat_template_kwargs: dict = {}
        """Extra variables of the chat template (``think`` sets ``enable_thinking``)."""
        llm.apply_chat_template([{"role": "user", "content": "x"}])  # no template: ChatTemplateError now

    def think(self, on: bool) -> None:
        """Let the model think (its thinking budget: ``reasoning.budget_tokens``) or not
        (``enable_thinking`` false where the template reads it, and a budget of 0)."""
        self.chat_template_kwargs["enable_thinking"] = on
        self.params = dataclasses.replace(self.params, reasoning_budget=None if on else 0)
        self.ids, self.text = [], ""

    def _thinking(self) -> tuple[SamplingParams, dict]:
        """The turn's params (with its thinking budget) and template variables."""
        from .tokenizer.reasoning import budget_tokens_of, thinking_kwargs

        budget = budget_tokens_of(self.llm.config.reasoning.budget_tokens, self.params.reasoning_budget)
        params = dataclasses.replace(self.params, reasoning_budget=budget)
        return params, thinking_kwargs(self.llm.chat_template(), self.chat_template_kwargs, budget)

    # -- the conversation ---------------------------------------------------------
    def _all(self, messages: list[dict]) -> list[dict]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + messages

    def clear(self) -> None:
        """Forget every turn (the system message stays)."""
        self.messages, self.ids, self.text = [], [], ""

    def set_system(self, system: str | None) -> None:
        self.system = system or None
        self.ids, self.text = [], ""

    def save(self, path: str | os.PathLike) -> None:
        """The conversation as JSON messages (OpenAI's shape), system message first; images
        as ``image_url`` parts with ``data:`` URLs."""
        messages = [{**m, "content": [_saved_part(p) for p in m["content"]]} if isinstance(m["content"], list) else m
                    for m in self._all(self.messages)]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(messages, f, ensure_ascii=False, indent=1)
            f.write("\n")

    def load(self, path: str | os.PathLike) -> None:
        """Replace the conversation with the messages of a file written by ``save`` (or any
        list of ``{"role", "content"}`` objects, a content a string or a list of ``text`` and
        ``image_url`` parts); a leading system message becomes ``system``."""
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise DualPathError(f"{path}: cannot read a conversation ({e})") from None
        if not isinstance(doc, list) or not all(
                isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
                and (isinstance(m.get("content"), str) or m.get("role") == "user" and _parts(m.get("content")))
                for m in doc):
            raise DualPathError(f"{path}: a conversation is a JSON list of {{\"role\": \"system\" | \"user\" | "
                                f"\"assistant\", \"content\": string}} objects (a user's content may be a list "
                                f"of \"text\" and \"image_url\" parts)")
        system = doc[0]["content"] if doc and doc[0]["role"] == "system" else None
        self.set_system(system)
        self.messages = [{"role": m["role"], "content": m["content"]} for m in doc[1 if system is not None else 0:]]

    # -- one turn -------------------------------------------------------------------
    def _prompt(self, messages: list[dict]) -> tuple[list[int], str, tuple]:
        """Prompt ids, text and image rows (``Request.embeds``) of ``messages`` and a
        generation prompt, extending ``ids`` where the rendering extends ``text``."""
        from .images import message_images
        from .llm import _rendered_prompt

        llm = self.llm
        kwargs = self._thinking()[1]
        plain, images = message_images(self._all(messages))
        full = llm.apply_chat_template(plain, chat_template_kwargs=kwargs)
        if self.ids and full.startswith(self.text) and not images:
            new = llm.tokenizer.encode(full[len(self.text):], add_bos=False, parse_special=True)
            return self.ids + new, full, ()
        ids, embeds = _rendered_prompt(llm, full, images)  # (the template rendered once)
        return ids, full, embeds

    def _fit(self, user: dict) -> tuple[list[int], str, int, tuple]:
        """The prompt of the next turn, dropping the oldest turns until it leaves room for
        the reply (the conversation is changed only once it fits)."""
        limit = self.llm.context_tokens - self.reply_tokens
        messages, dropped = self.messages, 0
        while True:
            ids, text, embeds = self._prompt(messages + [user])
            if len(ids) <= limit:
                if dropped:
                    self.messages = messages
                return ids, text, dropped, embeds
            if not messages:
                raise PromptTooLongError(f"the message and the system prompt take {len(ids)} tokens; with "
                                         f"{self.reply_tokens} for the reply that is over the context of "
                                         f"{self.llm.context_tokens} tokens")
            # the oldest user turn and its reply go; the conversation is rendered afresh
            cut = next((i for i, m in enumerate(messages[1:], 1) if m["role"] == "user"), len(messages))
            messages = messages[cut:]
            self.ids, self.text = [], ""
            dropped += 1

    def send(self, message: str, images: Sequence = ()) -> Generator[str, None, None]:
        """Stream the reply to ``message``; the turn is in the conversation once the reply
        ends, or is cut short (the iterator closed early, or Ctrl-C while it streams):
        then the reply so far is kept, as the model wrote it. The prompt is rendered and
        tokenized before this returns, so a caller can let Ctrl-C interrupt that part
        (nothing is in the engine yet) and keep it from the engine's steps. ``images``
        (PNG or JPEG bytes, paths, or RGB arrays; ``LLM.stream`` says where they go) are
        encoded then too."""
        from .llm import _image_input, _ms_since

        if images:
            _image_input(self.llm)  # a model without a projector: refused before anything else
        user = {"role": "user", "content": _with_images(message, images) if images else message}
        t0 = time.perf_counter()
        ids, text, dropped, embeds = self._fit(user)
        return self._reply(user, ids, text, dropped, embeds, _ms_since(t0) if embeds else 0.0)

    def _reply(self, user: dict, ids: list[int], text: str, dropped: int, embeds: tuple,
               image_ms: float) -> Generator[str, None, None]:
        from .llm import Generation
        from .tokenizer.reasoning import ReasoningSplitter, prompt_opens_thinking

        params = self._thinking()[0]
        gen = (Generation(self.llm.engine, ids, params, embeds, image_ms=image_ms) if embeds
               else self.llm.stream(ids, params))

        t0 = time.perf_counter()
        first = None
        parts: list[str] = []
        split = (ReasoningSplitter(prompt_opens_thinking(self.llm.tokenizer, ids))
                 if self.reasoning_format != "none" else None)

        def pieces(thought: str, answer: str):  # the answer alone is kept in the conversation
            if thought:
                yield Thinking(thought)
            if answer:
                parts.append(answer)
                yield answer
        try:
            for delta in gen:
                if first is None:
                    first = time.perf_counter()
                yield from pieces(*split.feed(delta)) if split is not None else pieces("", delta)
            if split is not None:
                yield from pieces(*split.finish())
        finally:
            gen.close()
            c = gen.completion
            reply = "".join(parts)
            generated = list(c.token_ids) if c is not None else list(gen.request.generated)
            self.messages += [user, {"role": "assistant", "content": reply}]
            self.ids, self.text = ids + generated, text + self.llm.detokenize(generated)
            now = time.perf_counter()
            cached = c.usage.cached_prompt_tokens if c is not None else (gen.request.cached_tokens or 0)
            decode_s = now - first if first is not None else 0.0
            self.last = TurnStats(len(ids), cached, len(generated), ((first or now) - t0) * 1e3,
                                  (len(generated) - 1) / decode_s if decode_s > 0 and len(generated) > 1 else 0.0,
                                  image_ms, c.finish_reason if c is not None else "interrupted", dropped)

    @property
    def turns(self) -> int:
        """User messages in the conversation."""
        return sum(m["role"] == "user" for m in self.messages)

    @property
    def context_used(self) -> int:
        """Tokens of the conversation held for the next turn."""
        return len(self.ids)



def _with_images(message: str, images: Sequence) -> list[dict]:
    """A user message's content parts: each image at a ``<__media__>`` marker of ``message``
    where it has one per image, else all of them before its text (as ``LLM.stream``)."""
    from .vision.prompt import MARKER

    texts = message.split(MARKER) if message.count(MARKER) == len(images) else [""] * len(images) + [message]
    parts: list[dict] = []
    for i, t in enumerate(texts):
        if t:
            parts.append({"type": "text", "text": t})
        if i < len(images):
            parts.append({"type": "image", "image": images[i]})
    return parts


def _parts(content) -> bool:
    """Whether ``content`` is a list of ``text`` and ``image_url`` parts (a saved message with images)."""
    return isinstance(content, list) and all(
        isinstance(p, dict) and (p.get("type") == "text" and isinstance(p.get("text"), str)
                                 or p.get("type") == "image_url" and isinstance(p.get("image_url"), dict)
                                 and isinstance(p["image_url"].get("url"), str)) for p in content)


def _saved_part(part: dict) -> dict:
    """An ``image`` part as an ``image_url`` part with a ``data:`` URL (PNG or JPEG bytes as
    they are; a file's bytes; an RGB array as PNG); other parts as they are."""
    if part.get("type") != "image":
        return part
    image = part["image"]
    if isinstance(image, (str, os.PathLike)):
        with open(image, "rb") as f:
            image = f.read()
    if isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
        kind = "png" if data.startswith(b"\x89PNG") else "jpeg"
    else:
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(image).save(buf, format="PNG")
        data, kind = buf.getvalue(), "png"
    return {"type": "image_url", "image_url": {"url": f"data:image/{kind};base64,{base64.b64encode(data).decode()}"}}
