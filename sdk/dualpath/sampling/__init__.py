"""Sampling: the sampler over one row of logits, and grammars for structured output."""
