"""Tests of the public API: LLM, generation, the CLI."""
