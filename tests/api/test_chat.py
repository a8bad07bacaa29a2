"""``dualpath chat`` and ``dualpath.Chat``: a conversation whose turns prefill only what
is new, saved and loaded as JSON; the REPL in a real terminal (a pty) on the real Gemma 3
270M, piped, and without a chat template."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import dualpath
from dualpath import SamplingParams

GEMMA = os.environ.get("DUALPATH_GEMMA3_270M") or os.path.expanduser(
    "~/.cache/dualpath-test-models/gemma-3-270m-q4_k_m.gguf")


def _llm(path, **overrides):
    return dualpath.LLM(path, dualpath.load_config(None, {"runtime.max_context_tokens": 256,
                                                          "runtime.chat_template": "chatml", **overrides}))


def test_each_turn_extends_the_last_prompt_token_for_token_and_reads_it_from_the_cache(gguf_path):
    llm = _llm(gguf_path)
    chat = dualpath.Chat(llm, "You tell stories.", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    replies, prompts = [], []
    for message in ("Lily had a dog.", "What did the dog do?", "And then?"):
        before = list(chat.ids)
        replies.append("".join(chat.send(message)))
        prompts.append(chat.last.prompt_tokens)
        assert chat.ids[:len(before)] == before  # the new prompt starts with the whole last turn
    assert [m["role"] for m in chat.messages] == ["user", "assistant"] * 3
    assert [m["content"] for m in chat.messages[1::2]] == replies
    st = chat.last
    assert st.completion_tokens == 20 and st.finish_reason == "length"
    page = llm.config.kv_cache.page_tokens
    # turn 3's prompt is turn 2's prompt and reply plus the new message: every full page of
    # what turn 2 computed (its prompt and all but its last token) comes from the cache
    assert st.cached_tokens == (prompts[1] + 20 - 1) // page * page > 0


def test_a_full_context_drops_the_oldest_turns_and_keeps_the_system_prompt(gguf_path):
    llm = _llm(gguf_path, **{"runtime.max_context_tokens": 128})
    chat = dualpath.Chat(llm, "Be short.", SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    dropped = 0
    for i in range(8):
        "".join(chat.send(f"Tell me about the {['dog', 'cat', 'sun', 'tree'][i % 4]} number {i}."))
        dropped += chat.last.dropped_turns
        assert chat.last.prompt_tokens + 24 <= 128
    assert dropped > 0 and chat.system == "Be short."
    assert chat.messages[0]["role"] == "user" and len(chat.messages) < 16
    kept = list(chat.messages)
    with pytest.raises(dualpath.PromptTooLongError, match="over the context of 128 tokens"):
        "".join(chat.send("word " * 200))
    assert chat.messages == kept  # a turn that cannot fit changes nothing
    "".join(chat.send("And the dog?"))  # the conversation goes on


def test_save_and_load_restore_the_conversation(gguf_path, tmp_path):
    llm = _llm(gguf_path)
    chat = dualpath.Chat(llm, "Sys.", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    "".join(chat.send("Hi"))
    chat.save(tmp_path / "c.json")
    saved = json.loads((tmp_path / "c.json").read_text())
    assert saved == [{"role": "system", "content": "Sys."}] + chat.messages
    other = dualpath.Chat(llm)
    other.load(tmp_path / "c.json")
    assert other.system == "Sys." and other.messages == chat.messages
    (tmp_path / "bad.json").write_text('{"role": "user"}')
    with pytest.raises(dualpath.DualPathError, match="a conversation is a JSON list"):
        other.load(tmp_path / "bad.json")


def test_a_model_without_a_chat_template_names_the_built_ins(gguf_path):
    r = subprocess.run([sys.executable, "-m", "dualpath.cli", "chat", "-m", str(gguf_path)], input="Hi\n",
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    from dualpath.config import CHAT_TEMPLATES

    assert "no chat template" in r.stderr and f"--chat-template {{{','.join(CHAT_TEMPLATES)}}}" in r.stderr
    assert "vicuna" in CHAT_TEMPLATES


def test_a_piped_line_too_long_for_the_context_is_reported_and_the_next_is_answered(gguf_path):
    r = subprocess.run([sys.executable, "-m", "dualpath.cli", "chat", "-m", str(gguf_path), "--chat-template",
                        "chatml", "-n", "12", "--ctx-size", "64"], input="word " * 100 + "\nTom\n",
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "over the context of 64 tokens" in r.stderr
    assert r.stdout.strip()  # the second line got its reply


def test_piped_stdin_gets_one_reply_per_line_and_no_decoration(gguf_path):
    r = subprocess.run([sys.executable, "-m", "dualpath.cli", "chat", "-m", str(gguf_path), "--chat-template",
                        "chatml", "-n", "12", "--temperature", "0"], input="Lily\n\nTom\n",
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert ">>>" not in r.stdout and "dualpath chat" not in r.stderr
    assert r.stdout.endswith("\n") and r.stdout.strip()


class Terminal:
    """A program in a pseudo-terminal: what it prints, and keys sent to it."""

    def __init__(self, argv):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the program, with the pty as its terminal
            os.execvp(argv[0], argv)
        self.out = ""

    def read(self, timeout_s: float = 0.2) -> str:
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if ready:
            try:
                chunk = os.read(self.fd, 65536).decode("utf-8", "replace")
            except OSError:
                return ""
            self.out += chunk
            return chunk
        return ""

    def expect(self, text: str, timeout_s: float = 240.0, start: int = 0) -> int:
        deadline = time.monotonic() + timeout_s
        while text not in self.out[start:]:
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} did not appear; the terminal shows:\n{self.out[-2000:]}")
            self.read()
        return self.out.index(text, start) + len(text)

    def send(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def close(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):  # it ended and was waited for already
            pass
        os.close(self.fd)


@pytest.mark.skipif(not os.path.isfile(GEMMA), reason=f"the real Gemma 3 270M is not at {GEMMA}: "
                    "fetch it with ../shared/models/get_gemma3_270m.sh (or set DUALPATH_GEMMA3_270M)")
def test_chat_in_a_terminal_on_gemma_streams_stops_on_ctrl_c_and_saves_and_loads(tmp_path):
    term = Terminal([sys.executable, "-m", "dualpath.cli", "chat", "-m", GEMMA, "--chat-template", "gemma",
                     "-n", "400", "--seed", "1", "--ctx-size", "2048"])
    try:
        at = term.expect(">>> ")
        term.send("Name three colors.\r")
        at = term.expect(">>> ", start=at)                   # turn 1 answered, back at the prompt
        term.send("Which one is the sky?\r")
        # turn 2 streams: its reply grows over several reads before the prompt comes back
        sizes, start = [], len(term.out)
        while ">>> " not in term.out[start:]:
            term.read(0.05)
            sizes.append(len(term.out) - start)
            if len(sizes) > 20000:
                raise AssertionError(term.out[-2000:])
        assert len({s for s in sizes if s > 40}) >= 3, sizes[-10:]
        at = term.out.index(">>> ", start) + 4
        term.send("Tell me a very long story about the sea.\r")
        while len(term.out) - at < 80:                       # it is streaming ...
            term.read(0.05)
        term.send("\x03")                                    # ... Ctrl-C stops the reply, not the session
        at = term.expect("(stopped)", 60, at)
        at = term.expect(">>> ", 60, at)
        term.send("/stats\r")
        at = term.expect("turns 3,", 30, at)
        term.send(f"/save {tmp_path / 'conv.json'}\r")
        at = term.expect("(saved 6 messages", 30, at)
        saved = json.loads((tmp_path / "conv.json").read_text())
        assert [m["role"] for m in saved] == ["user", "assistant"] * 3
        assert saved[0]["content"] == "Name three colors." and saved[4]["content"].startswith("Tell me a very long")
        term.send("/clear\r")
        at = term.expect("(conversation cleared)", 30, at)
        term.send(f"/load {tmp_path / 'conv.json'}\r")
        at = term.expect("(loaded 6 messages", 30, at)
        term.send("And the grass?\r")                        # the next turn works on the loaded conversation
        at = term.expect(">>> ", 240, at)
        term.send("/stats\r")
        at = term.expect("turns 4,", 30, at)
        at = term.expect(">>> ", 30, at)
        term.send("\x04")                                    # Ctrl-D leaves
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            term.read(0.1)
            done, status = os.waitpid(term.pid, os.WNOHANG)
            if done:
                assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
                break
        else:
            raise AssertionError("Ctrl-D did not end the session")
    finally:
        term.close()


def test_chat_in_a_terminal_takes_an_image_for_the_next_message(tmp_path):
    """/image FILE in the REPL: checked at once (a broken file is named, nothing is kept), then
    sent with the next message; /stats says when its images were ready."""
    pytest.importorskip("PIL", reason="the [vision] extra (Pillow) decodes images")
    from PIL import Image

    from dualpath.models.synth_vision import synth_mmproj, synth_text

    text = synth_text(tmp_path / "text.gguf", "smolvlm-tiny", "F16")
    mmproj = synth_mmproj(tmp_path / "mmproj.gguf", "smolvlm-tiny", "F16")
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (48, 80, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    term = Terminal([sys.executable, "-m", "dualpath.cli", "chat", "-m", str(text), "--mmproj", str(mmproj),
                     "--chat-template", "chatml", "-n", "4", "--seed", "1", "-t", "2"])
    try:
        at = term.expect(">>> ")
        term.send(f"/image {tmp_path / 'broken.png'}\r")
        at = term.expect("(cannot use", 30, at)
        term.send(f"/image {tmp_path / 'a.png'}\r")
        at = term.expect("80x48, goes with your next message)", 30, at)
        term.send("What is it?\r")
        at = term.expect(">>> ", 120, at)
        term.send("/stats\r")
        at = term.expect("its images ready after", 30, at)
        term.send(f"/save {tmp_path / 'conv.json'}\r")
        at = term.expect("(saved 2 messages", 30, at)
        saved = json.loads((tmp_path / "conv.json").read_text())
        assert [p["type"] for p in saved[0]["content"]] == ["image_url", "text"]
        term.send("/image\r")
        at = term.expect("(no image to drop)", 30, at)  # it went with the message
    finally:
        term.close()
