"""The high-level API: ``LLM(model_path).generate(prompt, params)``."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .completion import Completion
from .config import REASONING_FORMATS, Config, load_config
from .engine.engine import Engine, SyncStream
from .errors import ChatTemplateError, ToolsNotRenderedError
from .models import ModelSpec
from .models.store import CorruptEntry, ModelStore, Progress
from .sampling_params import SamplingParams
from .tokenizer.chat_inputs import template_variables, tools_not_rendered
from .tokenizer.chat_templates import BUILTIN as BUILTIN_CHAT_TEMPLATES
from .tokenizer.tool_formats import ToolFormat, detect_format
from .versions import check_versions

if TYPE_CHECKING:
    from .executor.encoder import EncoderRunner
    from .executor.memory_plan import MemoryPlan

log = logging.getLogger(__name__)


def resident_mb() -> float | None:
    """This process's resident memory now (VmRSS), in MiB; None where /proc is not Linux's."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    except (OSError, ValueError, IndexError):
        return None


class LLM:
    """A loaded model ready to generate text on the CPU.

    ``config`` is a ``Config``, a path to a YAML file, or None for the defaults.
    Requests go through ``engine`` (continuous batching): several ``stream``s can be
    interleaved, and requests reuse the KV cache pages of a common prompt prefix
    (page_tokens at a time). ``engine.submit`` is the async API.

    ``prefix_cache`` keeps full prompt pages on disk, so that a restarted process reads
    a prefix it saw before instead of computing it (cache/disk.py): True (in
    ``prefix_cache.dir``), a folder, False, or None to follow ``prefix_cache.use``.

    ``memory_budget`` (MiB, or ``"auto"``; None: ``runtime.memory_budget_mb``) holds the
    load to that much resident memory: the largest context and KV type that fit, planned
    from the file's header, or a ConfigError before any weight is read (``memory_plan``).
    """

    def __init__(self, model_path: str | os.PathLike, config: Config | str | os.PathLike | None = None,
                 *, tokenizer_path: str | os.PathLike | None = None, governor=None,
                 progress: Progress | None = None, prefix_cache: bool | str | os.PathLike | None = None,
                 memory_budget: int | str | None = None, mmproj: str | os.PathLike | None = None):
        t0 = time.perf_counter()
        check_versions()  # a dependency older than we declare is refused before any file is read
        if config is None or isinstance(config, (str, os.PathLike)):
            config = load_config(config)
        if memory_budget is not None:
            from .config import with_overrides

            config = with_overrides(config, {"runtime.memory_budget_mb": -1 if memory_budget == "auto"
                                             else memory_budget})
        self.config = config
        self.load_stats: dict = {}
        """How the load went: ``cache`` ("hit", "miss" or "off") and the seconds of each stage."""
        mc = config.model_cache
        if mc.enabled:
            store = ModelStore(mc.dir or None, int(mc.max_size_gb * (1 << 30)))
        else:  # convert into a temporary entry, removed once loaded (the mappings keep the files)
            store = ModelStore(tempfile.mkdtemp(prefix="dualpath-model-"))
        self.images = None
        """The image input (images.py) of a model loaded with its projector file ``mmproj``, else None."""
        try:
            self._load(store, model_path, tokenizer_path, progress, governor, prefix_cache, t0)
            if mmproj is not None:
                self.images = _load_images(self, store, mmproj)
        finally:
            if not mc.enabled:
                shutil.rmtree(store.root, ignore_errors=True)
                self.load_stats["cache"] = "off"
        from .tokenizer.render import TemplateRenderer

        rt = config.runtime
        self.template_renderer = TemplateRenderer(rt.chat_template_timeout_s, rt.chat_template_max_chars,
                                                  f"{os.path.basename(str(self.spec.path))}: the chat template")
        """Renders the chat template in a worker process (started on first use, ended with the LLM)."""
        weakref.finalize(self, self.template_renderer.close)

    def _load(self, store: ModelStore, model_path, tokenizer_path, progress, governor, prefix_cache,
              t0: float) -> None:
        from .cache.geometry import model_kv_geometry
        from .tokenizer import build_tokenizer

        config = self.config
        self.memory_plan: MemoryPlan | None = None
        """The memory plan the load was held to (executor/memory_plan.py), with a budget."""
        if config.runtime.memory_budget_mb:
            config = self.config = self._fit_budget(model_path)
        rss = self.load_stats["rss_mb"] = {"start": resident_mb()}
        """Resident MiB after each stage (``dualpath bench memory`` reads it)."""
        self.spec: ModelSpec = store.load(model_path, tokenizer_path, progress, self.load_stats)
        t1 = time.perf_counter()
        self.tokenizer = build_tokenizer(self.spec.tokenizer)
        self.load_stats["tokenizer_s"] = time.perf_counter() - t1
        rss["tokenizer"] = resident_mb()
        rt = config.runtime
        self.encoder: EncoderRunner | None = None
        """The encoder's runner (``embed``) when the model is one; it then has no engine."""
        if not self.spec.config.causal:
            self.encoder = _load_encoder(self, model_path, t0)
            return
        ctx = self._context()
        self.governor = governor if governor is not None else _make_governor(config)
        """The power-aware governor (platform.Governor), or None on uniform cores."""
        self.prefix_store = _open_prefix_store(
            self, prefix_cache, model_kv_geometry(config.kv_cache, self.spec.config, ctx, rt.kv_cache_tokens))
        """The prefix cache on disk (cache/disk.PrefixStore), or None."""
        try:
            try:
                driver = self._driver(ctx, progress)
            except CorruptEntry as e:  # a cached array failed its checksum on first use
                store.discard(self.spec.entry, str(e))
                self.spec = store.load(model_path, tokenizer_path, progress, self.load_stats)
                driver = self._driver(ctx, progress)
        except MemoryError as e:
            from .errors import CacheFullError, ConfigError

            if isinstance(e, CacheFullError):
                raise
            raise ConfigError(f"{model_path}: out of memory building the runner for a context of {ctx:,} tokens "
                              f"({e or type(e).__name__}); lower runtime.max_context_tokens (--ctx-size) or "
                              "let --memory-budget auto choose one that fits") from e
        self.load_stats.update(driver.runner.load_stats)
        rss["sessions"] = resident_mb()
        draft = _draft(self, store, ctx) if rt.speculative == "draft" else None
        self.engine = Engine(driver, self.tokenizer, max_queued_requests=config.server.max_queued_requests,
                             profile_name=config.power.profile, speculative=rt.speculative,
                             speculative_tokens=rt.speculative_tokens, draft=draft)
        """The continuous-batching engine every request goes through."""
        self.load_stats["total_s"] = time.perf_counter() - t0
        log.info("loaded %s (%s, %d layers, dim %d) in %.2fs (converted-model cache: %s)", model_path,
                 self.spec.format, self.spec.config.num_layers, self.spec.config.dim,
                 self.load_stats["total_s"], self.load_stats["cache"])

    def _context(self) -> int:
        """The context of this load: the budget's, or the configured one checked against
        this machine's memory (``context_without_budget``)."""
        rt = self.config.runtime
        if rt.memory_budget_mb:  # _fit_budget chose it
            ctx = rt.max_context_tokens
        else:
            from .executor.memory_plan import context_without_budget

            ctx = context_without_budget(self.spec, self.config)
        if rt.kv_cache_tokens and rt.kv_cache_tokens < ctx:
            from .errors import ConfigError

            raise ConfigError(f"runtime.kv_cache_tokens={rt.kv_cache_tokens} must hold at least one full "
                              f"context ({ctx} tokens), or one request could never finish")
        return ctx

    @property
    def runner(self):
        """The engine's driver (engine/driver.py): the single-sequence API (``begin``,
        ``forward``, ``warm_up``) over the engine's scheduler, and reads of the runner's state."""
        return self.engine.driver

    @property
    def cache(self):
        """The engine's KV cache, to read (stats, checks): only its scheduler changes it."""
        return self.engine.scheduler.cache

    def _fit_budget(self, model_path) -> Config:
        """The config with the context and KV type ``runtime.memory_budget_mb`` allows
        (ConfigError, before any weight is read, when the model does not fit)."""
        from .config import with_overrides
        from .executor.memory_plan import MiB, budget_bytes, fit

        config = self.config
        budget = budget_bytes(config.runtime.memory_budget_mb)
        plan = self.memory_plan = fit(model_path, config, budget)
        log.info("memory budget %.0f MiB: %s", budget / MiB, plan.describe())
        return with_overrides(config, {"runtime.max_context_tokens": plan.context,
                                       "kv_cache.kv_dtype": plan.kv_dtype})

    def _driver(self, ctx: int, progress, spec=None, kv_cache_tokens=None, disk=None):
        """The cache, scheduler and runner of ``spec`` (None: the model's) at context ``ctx``,
        stepped by one driver (engine/driver.py)."""
        from .engine.driver import build_driver

        rt = self.config.runtime
        chunk = min(rt.prefill_chunk_tokens, ctx)
        # at most the rows of the graph's RoPE tables (the model's context): ONNX Runtime's
        # RotaryEmbedding refuses a step of more tokens than its tables have rows
        batch_tokens = max(min(rt.effective_max_batch_tokens(), (spec or self.spec).config.context_length), 1)
        return build_driver(spec or self.spec, self.config, max_context_tokens=ctx,
                            max_step_tokens=max(chunk, batch_tokens), max_batch_tokens=batch_tokens,
                            kv_cache_tokens=rt.kv_cache_tokens if kv_cache_tokens is None else kv_cache_tokens,
                            governor=self.governor, progress=progress,
                            disk=None if disk is False else self.prefix_store)

    @classmethod
    def from_pretrained(cls, repo_id: str, quant: str | None = None, filename: str | None = None,
                        config: Config | str | os.PathLike | None = None, *, revision: str | None = None,
                        **kwargs) -> LLM:
        """Load a GGUF from the Hugging Face Hub: ``repo_id`` is ``OWNER/NAME`` (or
        ``OWNER/NAME:QUANT``), ``quant`` a tag such as ``Q4_K_M`` (default: the first of
        ``models.hub.DEFAULT_QUANTS`` present), ``filename`` a file in the repository.
        Downloads through huggingface_hub's cache (offline with ``HF_HUB_OFFLINE=1``), then
        loads the file as ``LLM(path, config, **kwargs)``. Raises ``ModelLoadError``."""
        from .models.hub import resolve_hf_model

        found = resolve_hf_model(repo_id, quant, filename, revision=revision)
        return cls(found.path, config, **kwargs)

    @property
    def context_tokens(self) -> int:
        if self.encoder is not None:
            return self.encoder.context_tokens
        return self.engine.runner.max_context_tokens

    def embed(self, texts: str | Sequence[str], *, normalize: bool = True, truncate: bool = False):
        """Embeddings of ``texts``, pooled as the file says (an encoder, or a decoder embedder): ``rerank.embed``."""
        from . import rerank  # here: it imports the executor (ONNX Runtime)

        return rerank.embed(self, texts, normalize, truncate)

    def rerank(self, query: str, documents: Sequence[str], top_n: int | None = None, *, truncate: bool = False):
        """``documents`` scored against ``query`` by a reranker, best first: ``rerank.rerank``."""
        from . import rerank

        return rerank.rerank(self, query, documents, top_n, truncate)

    # -- tokens ----------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool | None = None) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    # -- generation ------------------------------------------------------------
    def stream(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
               images: Sequence | None = None) -> Generation:
        """Text deltas as they are generated; the returned object's ``completion``
        holds the full result once iteration ends. ``images`` (PNG or JPEG bytes, paths, or
        (height, width, 3) uint8 arrays; a model loaded with ``mmproj``): each goes where the
        prompt's text has the marker ``<__media__>``, or all of them before the text."""
        _no_generation(self)
        if images:
            return _image_stream(self, prompt, images, lambda _: params or SamplingParams())
        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        return Generation(self.engine, ids, params or SamplingParams())

    def generate(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
                 images: Sequence | None = None) -> Completion:
        gen = self.stream(prompt, params, images=images)
        for _ in gen:
            pass
        assert gen.completion is not None  # the last delta carries it (a failed request raised)
        return gen.completion

    def warm(self, prompt: str | Sequence[int]) -> dict:
        """Compute ``prompt``'s KV now, so that later requests starting with it reuse its
        pages, and, with the prefix cache on disk, so that a restarted process does too
        (returns once those pages are written). Returns ``prompt_tokens``,
        ``cached_tokens`` (already cached before) and ``stored_tokens`` (the prompt's
        tokens in full pages: what a later request can reuse)."""
        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        c = self.generate(ids, SamplingParams(max_tokens=1, temperature=0.0))
        if self.prefix_store is not None:
            self.prefix_store.flush()
        P = self.cache.page_tokens
        return {"prompt_tokens": len(ids), "cached_tokens": c.usage.cached_prompt_tokens,
                "stored_tokens": len(ids) // P * P}

    def chat_template(self) -> str:
        """The chat template's Jinja source: the built-in one configured, else the model's
        (ChatTemplateError when there is neither)."""
        return _required_template(self)

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True, *,
                            tools=None, chat_template_kwargs: dict | None = None) -> str:
        """``messages`` (OpenAI's shapes, tool calls and results included) rendered by the chat
        template with ``tools`` and ``chat_template_kwargs`` (tokenizer/chat_inputs.py; e.g.
        ``{"enable_thinking": False}``, merged into its variables as llama.cpp does).
        ChatTemplateError when the template fails, or ignores ``tools`` it was given."""
        return _render_chat(self, messages, add_generation_prompt, tools, chat_template_kwargs)

    @property
    def tool_format(self) -> ToolFormat:
        """How this model writes tool calls, from its chat template (tokenizer/tool_formats.py)."""
        return detect_format(_template_source(self))

    def chat_prompt_ids(self, messages: Sequence[dict], *, tools=None,
                        chat_template_kwargs: dict | None = None) -> list[int]:
        """The prompt token ids of ``messages`` rendered by the chat template (text only:
        ``chat_prompt`` takes images)."""
        ids, embeds = self.chat_prompt(messages, tools=tools, chat_template_kwargs=chat_template_kwargs)
        if embeds:
            raise TypeError("the messages hold images: their prompt is ids and embeddings (chat_prompt)")
        return ids

    def chat_prompt(self, messages: Sequence[dict], *, tools=None, chat_template_kwargs: dict | None = None,
                    images: Sequence | None = None) -> tuple[list[int], tuple]:
        """The prompt of ``messages`` rendered by the chat template: its token ids, and the
        rows of its images (``Request.embeds``; content parts ``image_url`` with a ``data:``
        URL, or ``image`` with bytes, a path or an RGB array, for a model loaded with
        ``mmproj``), each where the part was. ``images``: the messages' images taken out
        already, their parts replaced by the marker (``images.message_images``)."""
        return _chat_prompt(self, messages, tools, chat_template_kwargs, images)

    def chat(self, messages: Sequence[dict], params: SamplingParams | None = None, *,
             chat_template_kwargs: dict | None = None, reasoning_format: str | None = None) -> Completion:
        """Generate the assistant's reply to ``messages`` ([{"role", "content"}, ...]). A model that
        thinks (``<think>...</think>``): with ``reasoning_format`` (None: ``reasoning.format``)
        deepseek the thinking comes back in ``reasoning_content`` and ``text`` is the answer;
        ``params.reasoning_budget`` (None: ``reasoning.budget_tokens``) bounds it, and 0 also
        sets ``enable_thinking`` false for templates that read it."""
        _no_generation(self)
        return _chat(self, messages, params or SamplingParams(), chat_template_kwargs,
                     reasoning_format or self.config.reasoning.format)


def _open_prefix_store(llm: LLM, prefix_cache, geometry):
    """The prefix cache on disk (cache/disk.PrefixStore) for a KV cache of ``geometry``,
    or None; the engine's cache is built with it."""
    import onnxruntime

    from .cache.disk import PrefixStore, default_root
    from .executor.session import nbits8_graphs, prefix_salt
    from .kernels import default_kernel

    pc, rt = llm.config.prefix_cache, llm.config.runtime
    if prefix_cache is None:
        prefix_cache = pc.use == "always"
    if prefix_cache is False:
        return None
    root = pc.dir or default_root() if prefix_cache is True else os.fspath(prefix_cache)
    g = geometry
    # Everything that decides a page's bytes: a store made under any other value is never read.
    namespace = {"model": prefix_salt(llm.spec).decode(), "source": os.path.basename(str(llm.spec.path)),
                 "kv_dtype": g.kv_dtype, "page_tokens": g.page_tokens,
                 "num_layers": g.num_layers, "num_kv_heads": g.num_kv_heads, "head_dim": g.head_dim,
                 "onnxruntime": onnxruntime.__version__, "accuracy_level": rt.quantized_matmul_accuracy,
                 "nbits8_graphs": nbits8_graphs(llm.spec),
                 "kernel": default_kernel() if rt.kernel_isa == "auto" else rt.kernel_isa}
    store = PrefixStore(root, namespace, page_tokens=g.page_tokens, num_layers=g.num_layers,
                        tile_bytes=g.page_bytes, max_bytes=int(pc.max_size_gb * (1 << 30)))
    weakref.finalize(llm, store.close)  # pages still queued are written before the process exits
    return store


def _image_input(llm: LLM):
    """``llm.images``, or an ImageError for a model loaded without a projector."""
    if llm.images is None:
        from .errors import ImageError

        raise ImageError(f"{os.path.basename(str(llm.spec.path))} takes text only: load it with its "
                         "projector file to give it images (LLM(path, mmproj=...), --mmproj)")
    return llm.images


def _load_images(llm: LLM, store: ModelStore, mmproj):
    """The image input of ``llm`` with the projector file ``mmproj``: its embeddings kept beside
    the prefix cache's pages on disk where those are, its encodes beside the engine's chats
    (``ImageInput.attach``)."""
    from .images import ImageInput

    rt, disk = llm.config.runtime, llm.prefix_store
    threads = rt.effective_num_threads()
    split = rt.image_encoder_threads or max(1, threads // 2)  # the encode's threads beside chats
    images = ImageInput(store.load(mmproj, projector=True), llm.spec, llm.tokenizer, threads,
                        rt.quantized_matmul_accuracy, disk_root=disk.root if disk is not None else None,
                        disk_bytes=disk.max_bytes if disk is not None else 0, lend=split < threads)
    images.attach(llm.engine, rt.image_encoder_share, split)
    return images


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def _image_stream(llm: LLM, prompt, images, params_for: Callable[[int], SamplingParams]) -> Generation:
    """``LLM.stream`` of a prompt with images, ``params_for(prompt tokens)`` its params (``dualpath
    run`` counts the images' rows against ``--steps``); ``timings.image_ms`` the prompt's making."""
    if not isinstance(prompt, str):
        raise TypeError("a prompt with images is text (the images go at its <__media__> markers)")
    t0 = time.perf_counter()
    ids, embeds = _image_input(llm).prompt(prompt, images)
    return Generation(llm.engine, ids, params_for(len(ids)), embeds, image_ms=_ms_since(t0))


def _chat_prompt(llm: LLM, messages: Sequence[dict], tools, chat_template_kwargs: dict | None,
                 images: Sequence | None) -> tuple[list[int], tuple]:
    """``LLM.chat_prompt``."""
    from .images import message_images

    if images is None:
        messages, images = message_images(messages)
    if images:
        _image_input(llm)
    text = llm.apply_chat_template(messages, tools=tools, chat_template_kwargs=chat_template_kwargs)
    return _rendered_prompt(llm, text, images)


def _rendered_prompt(llm: LLM, text: str, images: Sequence) -> tuple[list[int], tuple]:
    """Token ids and ``Request.embeds`` of a chat template's ``text`` with ``images`` at its markers."""
    bos = llm.tokenizer.spec.tokens[llm.tokenizer.bos_id] if llm.tokenizer.bos_id is not None else None
    # Templates usually write the BOS text themselves: do not add a second one.
    add_bos = not (bos and text.startswith(bos))
    if images:
        return _image_input(llm).prompt(text, images, add_bos)
    return llm.tokenizer.encode(text, add_bos=add_bos, parse_special=True), ()


def _chat(llm: LLM, messages: Sequence[dict], params: SamplingParams, chat_template_kwargs: dict | None,
          reasoning_format: str) -> Completion:
    """``LLM.chat``: the thinking budget into the params and the template's variables, then
    the reply, its thinking split off unless the format is none."""
    from .tokenizer.reasoning import budget_tokens_of, prompt_opens_thinking, split_reasoning, thinking_kwargs

    if reasoning_format not in REASONING_FORMATS:
        raise ValueError(f"reasoning_format={reasoning_format!r} must be one of {', '.join(REASONING_FORMATS)}")
    budget = budget_tokens_of(llm.config.reasoning.budget_tokens, params.reasoning_budget)
    if budget != params.reasoning_budget:
        params = dataclasses.replace(params, reasoning_budget=budget)
    kwargs = thinking_kwargs(llm.chat_template(), chat_template_kwargs, budget)
    t0 = time.perf_counter()
    ids, embeds = llm.chat_prompt(messages, chat_template_kwargs=kwargs)
    gen = Generation(llm.engine, ids, params, embeds, image_ms=_ms_since(t0) if embeds else 0.0)
    for _ in gen:
        pass
    c = gen.completion
    assert c is not None  # the last delta carries it (a failed request raised)
    if reasoning_format == "none":
        return c
    reasoning, content = split_reasoning(c.text, prompt_opens_thinking(llm.tokenizer, ids))
    return dataclasses.replace(c, text=content, reasoning_content=reasoning)


def _required_template(llm: LLM) -> str:
    template = _template_source(llm)
    if not template:
        raise ChatTemplateError(f"{os.path.basename(str(llm.spec.path))}: the model has no chat template "
                                "(no tokenizer.chat_template in its file); use a plain prompt, or a "
                                f"built-in template: --chat-template {{{','.join(BUILTIN_CHAT_TEMPLATES)}}}")
    return template


def _render_chat(llm: LLM, messages: Sequence[dict], add_generation_prompt: bool, tools,
                 chat_template_kwargs: dict | None) -> str:
    """``LLM.apply_chat_template``."""
    text = llm.template_renderer.render(_required_template(llm), _chat_variables(
        llm.tokenizer, messages, add_generation_prompt, tools, chat_template_kwargs))
    missing = tools_not_rendered(text, tools)
    if missing:
        raise ToolsNotRenderedError(f"the chat template does not render 'tools' (the prompt never names "
                                    f"{', '.join(map(repr, missing))}), so the model would not know them; "
                                    "use a model or --chat-template whose template writes tools "
                                    "(the built-in chatml does)")
    return text


def _template_source(llm: LLM) -> str | None:
    """The chat template in use: a built-in one named in the config, else the file's."""
    builtin = llm.config.runtime.chat_template
    return BUILTIN_CHAT_TEMPLATES[builtin] if builtin else llm.spec.tokenizer.chat_template


def _chat_variables(tok, messages, add_generation_prompt: bool, tools, kwargs) -> dict:
    try:
        return template_variables(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                  bos_token=tok.spec.tokens[tok.bos_id] if tok.bos_id is not None else "",
                                  eos_token=tok.spec.tokens[tok.eos_id] if tok.eos_id is not None else "",
                                  chat_template_kwargs=kwargs)
    except ValueError as e:
        raise ChatTemplateError(str(e)) from None


class Generation:
    """Text deltas of one request, as they are generated; ``completion`` is set once
    it ends. Iterating again continues the same generation, never restarts it. One
    thread may iterate while another calls ``close``."""

    def __init__(self, engine: Engine, prompt_ids: list[int], params: SamplingParams, embeds: tuple = (),
                 image_ms: float = 0.0):
        self._stream = SyncStream(engine, prompt_ids, params, embeds=embeds)
        self._image_ms = image_ms
        """The completion's ``timings.image_ms``: the caller made the images ready."""
        self.request = self._stream.request
        """The engine's Request (its ``seq_id`` names its KV cache sequence while it runs)."""
        self.request_id = self.request.request_id

    @property
    def completion(self) -> Completion | None:
        c = self._stream.completion
        if c is None or not self._image_ms:
            return c
        return dataclasses.replace(c, timings=dataclasses.replace(c.timings, image_ms=self._image_ms))

    def __iter__(self):
        return self

    def __next__(self) -> str:
        while True:
            delta = self._stream.next_delta()
            if delta is None:
                raise StopIteration
            if delta.text:
                return delta.text

    def __del__(self) -> None:
        stream = getattr(self, "_stream", None)
        if stream is not None and not stream.done:
            stream.engine.abort(self.request_id)  # dropped unfinished: nobody reads it

    def close(self) -> None:
        """Stop early: the request ends (finish_reason ``abort``) and frees its cache;
        its full prompt pages stay in the prefix cache."""
        if not self._stream.done:
            self._stream.engine.abort(self.request_id)
            while self._stream.next_delta() is not None:
                pass


def _draft(llm: LLM, store: ModelStore, ctx: int):
    """The draft model of ``speculative: draft``: refused unless it shares the vocabulary."""
    from .engine.speculative import DraftModel
    from .errors import ConfigError

    rt = llm.config.runtime
    if not rt.draft_model:
        raise ConfigError("runtime.speculative=draft needs runtime.draft_model: a smaller GGUF with this "
                          "model's vocabulary (or use speculative: ngram, which needs no second model)")
    spec = store.load(rt.draft_model)
    mine, theirs = llm.spec.tokenizer.tokens, spec.tokenizer.tokens
    if list(mine) != list(theirs):
        differ = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        raise ConfigError(f"runtime.draft_model={rt.draft_model!r}: its vocabulary ({len(theirs)} tokens) is not "
                          f"this model's ({len(mine)} tokens; they differ from token {differ} on): proposals "
                          "would be other tokens' ids")
    # A sequence per running request, each up to the context.
    return DraftModel(llm._driver(ctx, None, spec=spec, kv_cache_tokens=ctx * rt.max_num_seqs, disk=False))


def _load_encoder(llm: LLM, model_path, t0: float) -> EncoderRunner:
    """An encoder's runner, in place of the engine: no KV cache, no governor, no prefix cache."""
    from .executor.encoder import EncoderRunner

    rt = llm.config.runtime
    llm.governor = None
    llm.prefix_store = None
    runner = EncoderRunner(llm.spec, rt.effective_num_threads(), rt.quantized_matmul_accuracy,
                           kernel=None if rt.kernel_isa == "auto" else rt.kernel_isa)
    llm.load_stats["rss_mb"]["sessions"] = resident_mb()
    llm.load_stats["total_s"] = time.perf_counter() - t0
    log.info("loaded encoder %s (%s) in %.2fs", model_path, llm.spec.config.arch, llm.load_stats["total_s"])
    return runner


def _no_generation(llm: LLM) -> None:
    """ModelTaskError for an embedding-only model (an encoder has no engine)."""
    if llm.encoder is not None:
        from .errors import ModelTaskError

        raise ModelTaskError(f"{os.path.basename(str(llm.spec.path))} is an embedding model "
                             f"({llm.spec.config.arch}, an encoder): it cannot generate text; use LLM.embed"
                             + (" or LLM.rerank" if llm.spec.metadata.get("pooling") == "rank" else ""))


def _make_governor(config: Config):
    """The power-aware governor, where it has something to decide: cores that differ
    (big/little, P/E, or a ``power.cpu_classes`` override) with ``power.pin_threads``
    on. On a machine whose cores are all alike, one unpinned session set on ONNX
    Runtime's shared thread pool is faster and there is nothing to choose."""
    import functools

    from .platform import BackgroundPowerReader, Governor, load_topology, read_power_state

    pc = config.power
    if not pc.pin_threads:
        return None
    topology = load_topology(pc.cpu_classes)
    if topology.uniform:
        log.info("all cores are alike: no core classes to schedule on")
        return None
    reader = None
    if pc.profile == "auto":
        reader = BackgroundPowerReader(functools.partial(read_power_state, timeout_s=pc.termux_timeout_s),
                                       interval_s=pc.poll_interval_s).start()
    return Governor(topology, reader, config)
