"""``POST /v1/embeddings``: which model answers it, and the route itself.

Three servers, decided once at start (``Embeddings``):

* an embedding-only server (``dualpath serve -m bert.gguf``): its encoder answers, and the
  generation routes are a 400 saying the model is an embedding model;
* a chat model with an embedding model beside it (``--embedding-model``, server.embedding_model):
  the encoder answers, its work batched in the chat engine's steps (engine/encoder_queue.py);
* a chat model alone: as llama-server (which refuses embeddings unless started with
  ``--embeddings``), its own hidden states answer only when asked (``--embeddings``,
  server.embeddings: on) or when its file declares a pooling type (a decoder trained as an
  embedder); otherwise a 400 naming ``--embedding-model``.

The texts of concurrent requests to an encoder are run together: every request is a job on
one queue, stepped by the chat engine's loop or by the queue's own thread.

``dimensions``: GGUF has no key saying a model was trained with Matryoshka representation
learning (llama.cpp's ``embedding_length_out`` is a projection's size, not a set of cuts),
so the shorter sizes are the operator's to declare (server.embedding_dimensions, from the
model card); a vector is then cut to its first ``dimensions`` values and L2-normalised again.
Any other size is a 400 naming the sizes allowed.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Callable

import numpy as np

from ..config import Config, with_overrides
from ..engine.encoder_queue import EmbedJob, EncoderQueue, Job
from ..errors import ConfigError, DualPathError
from ..executor.encoder import l2_normalize
from ..models.gguf import declared_pooling
from .errors import api_error, bad_request, engine_call
from .parsing import EMBEDDING_FIELDS, check_fields, embedding_inputs, get_field

ENCODER_SLICE_TOKENS = 2048
"""Tokens one encoder run takes at most (the memory plan counts one slice in flight)."""


def load_embedder(config: Config):
    """The ``LLM`` of ``server.embedding_model`` (None when unset); ConfigError when it is not
    an embedding model. Its load is held to no budget of its own: ``chat_config`` takes its
    share out of the chat model's."""
    path = config.server.embedding_model
    if not path:
        return None
    from ..llm import LLM

    llm = LLM(path, with_overrides(config, {"runtime.memory_budget_mb": 0}), prefix_cache=False)
    if llm.encoder is None:
        raise ConfigError(f"server.embedding_model={path!r} is a {llm.spec.config.arch} text-generation model, "
                          "not an embedding model (an encoder: bert, nomic-bert); serve it with -m, and "
                          "--embeddings to answer /v1/embeddings from it")
    return llm


def embedder_bytes(embedder) -> int:
    """Resident bytes the embedding model adds (executor/memory_plan.py ``encoder_parts``)."""
    from ..executor.memory_plan import encoder_parts

    return sum(encoder_parts(embedder.spec, ENCODER_SLICE_TOKENS).values())


def chat_config(config: Config, embedder) -> Config:
    """The chat model's config beside ``embedder``: a budget in MiB less the embedder's
    planned bytes (``auto`` reads the memory left once the embedder is loaded)."""
    from ..executor.memory_plan import MiB

    budget = config.runtime.memory_budget_mb
    if embedder is None or budget <= 0:
        return config
    need = embedder_bytes(embedder)
    left = budget - -(-need // MiB)
    if left < 1:
        raise ConfigError(f"runtime.memory_budget_mb={budget}: the embedding model "
                          f"{os.path.basename(str(embedder.spec.path))} alone is planned at {need / MiB:,.0f} MiB; "
                          "raise the budget")
    return with_overrides(config, {"runtime.memory_budget_mb": left})


class Embeddings:
    """What answers /v1/embeddings on a server of ``llm`` (and ``embedder``): see the module docstring."""

    def __init__(self, llm, embedder=None):
        cfg = llm.config.server
        self.llm = llm
        self.encoder_llm = llm if llm.encoder is not None else embedder
        self.queue: EncoderQueue | None = None
        self.refusal = ""
        """The 400's message when nothing here answers /v1/embeddings."""
        if self.encoder_llm is not None:
            self.queue = EncoderQueue(self.encoder_llm.encoder, share=llm.config.runtime.encoder_share,
                                      max_batch_tokens=ENCODER_SLICE_TOKENS,
                                      max_jobs=cfg.max_queued_requests)
            if llm.encoder is not None:
                self.queue.start()  # no engine: the queue steps itself
            else:
                llm.engine.attach_encoder(self.queue)
            self.source = self.encoder_llm
        else:
            self.source = llm
            declared = declared_pooling(llm.spec.path) if cfg.embeddings == "auto" else None
            if declared == "rank":
                self.refusal = (f"{os.path.basename(str(llm.spec.path))} is a reranker (pooling type rank): it "
                                "gives relevance scores, not embeddings: use POST /v1/rerank")
            elif cfg.embeddings == "off" or (cfg.embeddings == "auto" and declared in (None, "none")):
                why = "server.embeddings is off" if cfg.embeddings == "off" else "its file declares no pooling type"
                self.refusal = (f"this server's model {os.path.basename(str(llm.spec.path))} is a text-generation "
                                f"model ({why}): serve an embedding model beside it with --embedding-model FILE "
                                "(server.embedding_model), or start the server with --embeddings "
                                "(server.embeddings: on) to pool this model's hidden states")
        dim = self.source.spec.config.dim
        cuts = {int(p) for p in cfg.embedding_dimensions.split(",") if p.strip()}
        self.dimensions = sorted({dim} | {d for d in cuts if d < dim}, reverse=True)
        """Sizes a request's ``dimensions`` may ask: the model's, then the declared shorter ones."""
        self.model_name = os.path.basename(str(self.source.spec.path))

    @property
    def pooling(self) -> str:
        if self.queue is not None:
            return self.queue.runner.pooling
        return str(self.source.spec.metadata.get("pooling", "mean"))

    def model_entry(self, created: int) -> dict:
        """/v1/models' entry of an embedding model served beside a chat model."""
        return {"id": self.model_name, "object": "model", "created": created, "owned_by": "dualpath",
                "context_length": self.source.context_tokens, "embedding_dimensions": self.dimensions[0]}

    async def answer(self, body: dict, model_name: str) -> dict:
        """The response body of a checked request ``body``."""
        check_fields(body, EMBEDDING_FIELDS, "/v1/embeddings")
        if self.refusal:
            raise bad_request(self.refusal, "input", "model_not_supported")
        if self.pooling in ("none", "rank"):
            what = "a vector per token" if self.pooling == "none" else "relevance scores"
            hint = "; use POST /v1/rerank" if self.pooling == "rank" else ""
            raise bad_request(f"{self.model_name} has pooling type {self.pooling}: it gives {what}, "
                              f"not one embedding per input{hint}", "input", "model_not_supported")
        fmt = get_field(body, "encoding_format", (str,), "float", check=lambda v: v in ("float", "base64"),
                        allowed="'float' or 'base64'")
        size = get_field(body, "dimensions", (int,), self.dimensions[0], check=lambda v: v in self.dimensions,
                         allowed=" or ".join(map(str, self.dimensions)) + " (this model's sizes; shorter ones "
                         "are declared in server.embedding_dimensions for a Matryoshka-trained model)")
        truncate = get_field(body, "truncate", (bool,), False)
        prompts = await asyncio.to_thread(embedding_inputs, self.source, body.get("input"))
        ctx = self.source.context_tokens
        for i, p in enumerate(prompts):
            if len(p) > ctx and not truncate:
                raise bad_request(f"input[{i}] has {len(p)} tokens, more than the {ctx} positions of "
                                  f"{self.model_name}; send \"truncate\": true to embed its first {ctx} tokens",
                                  "input", "context_length_exceeded")
            prompts[i] = p[:ctx]
            if self.queue is not None:
                try:  # token ids outside the vocabulary: a 400 naming the input
                    self.queue.runner.check(prompts[i], i)
                except DualPathError as e:
                    raise api_error(e, "input") from None
        vectors = await self._vectors(prompts)
        data = []
        for i, v in enumerate(vectors):
            if size < len(v):
                v = l2_normalize(np.asarray(v, np.float32)[:size])
            value = (base64.b64encode(np.asarray(v, "<f4").tobytes()).decode() if fmt == "base64"
                     else [float(x) for x in v])
            data.append({"object": "embedding", "index": i, "embedding": value})
        tokens = sum(len(p) for p in prompts)
        return {"object": "list", "data": data, "model": model_name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    async def _vectors(self, prompts: list[list[int]]) -> list:
        if self.queue is None:  # the chat model's own hidden states, batched by its scheduler
            return await engine_call(self.llm.engine.embed(prompts, self.pooling), "input")
        return await self.queued(lambda on_done: EmbedJob(prompts, on_done, self.pooling), "input")

    async def queued(self, make_job: Callable[[Callable], Job], param: str) -> list:
        """The results of the job ``make_job(on_done)`` on the encoder queue; its errors as
        400s naming ``param``."""
        assert self.queue is not None
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def settle(results, error):
            if not done.done():
                done.set_exception(error) if error is not None else done.set_result(results)

        job = make_job(lambda r, e: loop.call_soon_threadsafe(settle, r, e))
        self.queue.submit(job)
        try:
            return await engine_call(done, param)
        except asyncio.CancelledError:
            self.queue.cancel(job)
            raise

    def shutdown(self) -> None:
        if self.queue is not None:
            self.queue.shutdown()


def warm_up(embeddings: Embeddings) -> None:
    """One short text through the encoder before the server listens: its weights are paged
    in and ONNX Runtime's first-run allocations made here, not in the first request."""
    if embeddings.queue is not None:
        runner = embeddings.queue.runner
        runner.embed([[0]], runner.pooling if runner.pooling in ("mean", "cls", "last") else "mean")
