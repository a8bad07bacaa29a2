"""Fixtures the server tests share."""

from __future__ import annotations

import pytest

from tests_shared import write_gguf_with_chat_template


@pytest.fixture(scope="module")
def chat_gguf(gguf_path, tmp_path_factory):
    """stories260K with a chat template (test_server.CHAT_TEMPLATE), one copy per test module."""
    from test_server import CHAT_TEMPLATE

    return write_gguf_with_chat_template(gguf_path, tmp_path_factory.mktemp("chat") / "stories260K-chat.gguf",
                                         CHAT_TEMPLATE)
