"""``dualpath run`` and ``dualpath chat``: text from a prompt, a conversation."""

from __future__ import annotations

import contextlib
import os
import sys

from .common import ProgressBar, config_from_args, load_report, mmproj_path, model_path, sampling_from_args


def cmd_run(args) -> int:
    from ..llm import LLM

    llm = LLM(model_path(args), config_from_args(args), tokenizer_path=args.tokenizer, progress=ProgressBar(),
              mmproj=mmproj_path(args, bool(args.image)))
    if args.load_report:
        print(load_report(llm.load_stats), file=sys.stderr)
    prompt = args.prompt if args.prompt is not None else ""
    if args.image:  # the images' rows count as prompt tokens (--steps)
        from ..llm import _image_stream, _no_generation

        _no_generation(llm)
        gen = _image_stream(llm, prompt, args.image, lambda n: sampling_from_args(args, n))
    else:
        ids = llm.tokenize(prompt)
        gen = llm.stream(ids, sampling_from_args(args, len(ids)))  # checks the prompt fits before anything is printed
    out = sys.stdout
    if args.echo:
        out.write(prompt if args.image else llm.detokenize(ids))
        out.flush()
    for delta in gen:
        out.write(delta)
        out.flush()
    out.write("\n")
    out.flush()
    c = gen.completion
    assert c is not None  # the stream has ended
    t = c.timings
    print(f"dualpath: {c.usage.prompt_tokens} prompt tokens at {t.prefill_tokens_per_s:.1f} tok/s, "
          f"{c.usage.completion_tokens} generated at {t.decode_tokens_per_s:.1f} tok/s "
          + (f"(images ready in {t.image_ms:.0f} ms) " if args.image else "")
          + f"(finish: {c.finish_reason}, threads: {llm.config.runtime.effective_num_threads()})", file=sys.stderr)
    return 0


CHAT_HELP = """commands: /clear (forget the conversation), /system TEXT (a new system prompt), /save FILE,
/load FILE (the conversation as JSON messages), /stats (tokens, speed, cache reuse), /think on|off
(let a thinking model think, shown dimmed), /image FILE (a PNG or JPEG for your next message, with
--mmproj; /image alone drops it), /help; Ctrl-C stops a reply, Ctrl-D (or /exit) leaves"""
DIM, PLAIN = "\x1b[2m", "\x1b[0m"
"""Terminal attributes of a reply's thinking, and back."""


def _write_reply(reply, out, interactive: bool, stop) -> None:
    """Write a reply's pieces as they come: its thinking (``Thinking`` pieces) dimmed on a
    terminal and left out when piped (one reply per line), then the answer."""
    from ..chat import Thinking

    thinking = False
    try:
        for text in reply:
            if isinstance(text, Thinking):
                if interactive:
                    out.write((DIM if not thinking else "") + text)
                    thinking = True
            else:
                if thinking:
                    out.write(PLAIN + "\n\n")
                    thinking = False
                out.write(text)
            out.flush()
            if stop.is_set():
                reply.close()  # the reply so far stays in the conversation
                break
    finally:
        if thinking:
            out.write(PLAIN)


@contextlib.contextmanager
def _sigint(handler):
    """SIGINT handled by ``handler`` inside the block: set, not assumed, because a shell
    that starts us in the background leaves SIGINT ignored, and Python then raises no
    KeyboardInterrupt."""
    import signal

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def cmd_chat(args) -> int:
    import signal
    import threading

    from ..chat import Chat
    from ..errors import DualPathError
    from ..llm import LLM

    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input(), where Python has it)
        except ImportError:  # Termux's Python may lack it: a plain prompt then
            pass
    llm = LLM(model_path(args), config_from_args(args), tokenizer_path=args.tokenizer, progress=ProgressBar(),
              mmproj=mmproj_path(args))
    params = sampling_from_args(args, 0)
    chat = Chat(llm, args.system, params, reply_tokens=args.max_tokens)
    out, err = sys.stdout, sys.stderr
    if interactive:
        print(f"dualpath chat: {os.path.basename(str(llm.spec.path))}, context {llm.context_tokens} tokens. "
              f"{CHAT_HELP}", file=err)
    stop = threading.Event()
    failed = False  # piped: the exit status says whether every line got its reply
    images: list[str] = []  # /image: for the next message

    def on_sigint(signum, frame):  # while a reply streams: stop it, never interrupt the engine mid-step
        stop.set()

    while True:
        try:
            line = input(">>> " if interactive else "")
        except EOFError:
            if interactive:
                print(file=err)
            return 1 if failed and not interactive else 0
        except KeyboardInterrupt:  # at the prompt: a fresh line, the session goes on
            print("\n(Ctrl-D leaves)", file=err)
            continue
        line = line.strip()
        if not line:
            continue
        if interactive and line.startswith("/"):
            if _chat_command(chat, line, out, err, images):
                return 0
            continue
        try:  # the template, the tokenizer, the images: Ctrl-C interrupts them (the engine has nothing yet)
            with _sigint(signal.default_int_handler):
                reply = chat.send(line, images)
            images.clear()
        except KeyboardInterrupt:
            print("\n(stopped)", file=err)
            continue
        except DualPathError as e:
            print(f"(error: {e})", file=err)
            failed = True
            continue
        previous = signal.signal(signal.SIGINT, on_sigint)
        stop.clear()
        try:
            _write_reply(reply, out, interactive, stop)
        except DualPathError as e:  # this turn failed (too long, an engine error): the session goes on
            out.flush()
            print(f"\n(error: {e})", file=err)
            failed = True
            continue
        finally:
            signal.signal(signal.SIGINT, previous)
        out.write("\n")
        out.flush()
        st = chat.last
        if st.dropped_turns:
            print(f"(context full: dropped the {st.dropped_turns} oldest turn(s))", file=err)
        if stop.is_set() and interactive:
            print("(stopped)", file=err)


def _chat_command(chat, line: str, out, err, images: list[str]) -> bool:
    """One REPL command; True when the session should end. ``images``: /image's files, for
    the next message."""
    from ..errors import DualPathError

    name, _, arg = line.partition(" ")
    arg = arg.strip()
    if name in ("/exit", "/quit", "/bye"):
        return True
    if name == "/clear":
        chat.clear()
        print("(conversation cleared)", file=err)
    elif name == "/system":
        chat.set_system(arg)
        print(f"(system prompt {'set' if arg else 'removed'}; the conversation goes on under it)", file=err)
    elif name in ("/save", "/load") and arg:
        try:
            (chat.save if name == "/save" else chat.load)(arg)
        except (OSError, DualPathError) as e:
            print(f"(cannot {name[1:]}: {e})", file=err)
        else:
            print(f"({'saved' if name == '/save' else 'loaded'} {len(chat.messages)} messages "
                  f"{'to' if name == '/save' else 'from'} {arg})", file=err)
    elif name == "/think" and arg in ("on", "off"):
        chat.think(arg == "on")
        print(f"(thinking {arg})", file=err)
    elif name == "/image":
        _attach_image(chat, arg, err, images)
    elif name == "/stats":
        st = chat.last
        print(f"turns {chat.turns}, context {chat.context_used}/{chat.llm.context_tokens} tokens; last turn: prompt "
              f"{st.prompt_tokens} tokens ({st.cached_tokens} from the cache), reply {st.completion_tokens} "
              f"tokens, first token after {st.ttft_ms:.0f} ms, {st.decode_tokens_per_s:.1f} tok/s"
              + (f", its images ready after {st.image_ms:.0f} ms" if st.image_ms else ""), file=err)
    else:
        print(CHAT_HELP, file=err)
    return False


def _attach_image(chat, path: str, err, images: list[str]) -> None:
    """/image FILE: the file checked (decoded) now and kept for the next message; /image alone
    drops what was kept."""
    from ..errors import ImageError

    if not path:
        print(f"({len(images)} image(s) dropped)" if images else "(no image to drop)", file=err)
        images.clear()
    elif chat.llm.images is None:
        print("(this model takes no images: load it with its projector file, --mmproj FILE)", file=err)
    else:
        try:
            h, w = chat.llm.images.pixels(path).shape[:2]
        except ImageError as e:
            print(f"(cannot use {path}: {e})", file=err)
            return
        images.append(path)
        print(f"({path}, {w}x{h}, goes with your next message)", file=err)
