"""The engine's request: a scheduler ``Request`` plus what generating its output needs."""

from __future__ import annotations

import numpy as np

from ..completion import Completion
from ..errors import InternalError
from ..sampling.reasoning_budget import reasoning_budget_for
from ..sampling.sampler import Sampler, SamplerScratch
from ..sampling_params import SamplingParams
from ..scheduler.request import Request
from .generate import TextStream


class EngineRequest(Request):
    """A scheduler Request plus what generating text needs: sampler, text stream and
    the sink its deltas go to (engine/handles.py)."""

    def __init__(self, request_id: str, prompt_ids: list[int], params: SamplingParams, tokenizer,
                 context_tokens: int, scratch: SamplerScratch, sink, grammar=None, proposer=None):
        super().__init__(request_id, prompt_ids, context_tokens, reserve_tokens=params.max_tokens)
        self.proposer = proposer
        """Speculative decoding's proposals for this request (engine/speculative.py), or None."""
        self.grammar = grammar
        self.matcher = grammar.new_matcher() if grammar is not None else None
        """Structured output (sampling/grammar.py): this sequence's walk through the grammar."""
        self.params = params
        self.sampler = Sampler(params, scratch.vocab_size, scratch, reasoning_budget_for(params, tokenizer, prompt_ids))
        self.stream = TextStream(tokenizer, prompt_ids, params)
        self.stop_ids = frozenset() if params.ignore_eos else tokenizer.stop_ids
        self.sink = sink
        self.first_token_time: float | None = None
        self.decode_steps = 0
        self.completion: Completion | None = None
        self.logprobs: list | None = [] if params.logprobs is not None else None
        """Per generated token: (token_id, logprob, top alternatives), with params.logprobs."""
        self.forks: list[EngineRequest] = []
        """Further samples of this prompt (``n`` > 1): requests that start, when this one's
        prompt is computed, from a fork of its cache sequence (sharing its pages), each
        sampling its own first token from the same logits."""
        self.fork_of: EngineRequest | None = None
        """For such a fork: the request it is waiting to be forked from (None once forked)."""
        self.prompt_logprobs: list[tuple[int, float, tuple]] = []
        """With ``prompt_logits``: per prompt token after the first, (token_id, logprob,
        top alternatives), filled chunk by chunk (engine/outputs.py)."""
        self.pooling: str | None = None
        """For an embedding (``embedding``): ``"mean"``, ``"cls"``, ``"last"`` or ``"rank"``
        (the last token's state, not normalised)."""
        self.pooled: np.ndarray | None = None
        """For an embedding: (dim,) f64, the running sum or pick of the final hidden states."""


def internal_error(req: Request, cause: BaseException) -> InternalError:
    """The error a request's consumer gets when the engine failed it: no internals in the
    message (the cause is logged, and chained for callers in-process)."""
    err = InternalError(f"request {req.request_id} failed inside the engine; it may be retried")
    err.__cause__ = cause
    return err
