"""``dualpath bench chat``: time to first token per turn of a conversation, with the
conversation's KV reused across turns (``dualpath.Chat``) and without (the prefix cache
emptied before each turn, so every turn prefills the whole conversation, as an engine
without reuse does). Both run the same greedy conversation in one process, interleaved
per repeat; medians per turn."""

from __future__ import annotations

import statistics

from ..config import CHAT_TEMPLATES
from .common import model_or_default, write_json

WORDS = ("the little boat sailed past the old lighthouse while the children counted the gulls and the wind "
         "carried the smell of salt and bread from the harbour where the fishermen mended their nets").split()


def _message(turn: int, tokens: int, tokenizer) -> str:
    """A user message of about ``tokens`` tokens, different for each turn."""
    words = [WORDS[(turn * 7 + i) % len(WORDS)] for i in range(tokens)]
    text = f"Question {turn + 1}: " + " ".join(words)
    while len(tokenizer.encode(text, add_bos=False)) > tokens and len(words) > 1:
        words.pop()
        text = f"Question {turn + 1}: " + " ".join(words)
    return text + " What happens next?"


def run_conversation(llm, turns: int, user_tokens: int, reply_tokens: int, reuse: bool) -> list[dict]:
    from ..chat import Chat
    from ..sampling_params import SamplingParams

    chat = Chat(llm, None, SamplingParams(temperature=0, max_tokens=reply_tokens, ignore_eos=True),
                reply_tokens=reply_tokens)
    rows = []
    for t in range(turns):
        if not reuse:
            llm.cache.evict_all()  # nothing of earlier turns is left to read
        for _ in chat.send(_message(t, user_tokens, llm.tokenizer)):
            pass
        st = chat.last
        rows.append({"turn": t + 1, "prompt_tokens": st.prompt_tokens, "cached_tokens": st.cached_tokens,
                     "ttft_ms": st.ttft_ms, "decode_tokens_per_s": st.decode_tokens_per_s})
    return rows


def cmd_bench_chat(args) -> int:
    from ..config import load_config
    from ..llm import LLM

    overrides = {"runtime.num_threads": args.threads, "runtime.max_context_tokens": args.ctx}
    if args.chat_template:
        overrides["runtime.chat_template"] = args.chat_template
    llm = LLM(model_or_default(args.model), load_config(None, overrides))
    run_conversation(llm, 2, 16, 4, True)  # warm-up: first runs, allocations
    runs: dict[bool, list] = {True: [], False: []}
    for _ in range(args.repeats):
        for reuse in (True, False):
            llm.cache.evict_all()
            runs[reuse].append(run_conversation(llm, args.turns, args.user_tokens, args.reply_tokens, reuse))
    print(f"{args.turns} turns of ~{args.user_tokens} user and {args.reply_tokens} reply tokens, "
          f"{args.threads} threads, medians of {args.repeats}; TTFT in ms")
    print(f"{'turn':>4} {'prompt':>7} {'reuse: cached':>14} {'TTFT':>8} {'no reuse: TTFT':>15}")
    table = []
    for t in range(args.turns):
        med = {r: statistics.median(run[t]["ttft_ms"] for run in runs[r]) for r in (True, False)}
        row = runs[True][0][t]
        table.append({**row, "ttft_ms": med[True], "ttft_no_reuse_ms": med[False]})
        print(f"{t + 1:>4} {row['prompt_tokens']:>7} {row['cached_tokens']:>14} {med[True]:>8.1f} {med[False]:>15.1f}")
    last, first = table[-1], table[0]
    print(f"turn {args.turns} / turn 1 TTFT: {last['ttft_ms'] / first['ttft_ms']:.2f}x with reuse, "
          f"{last['ttft_no_reuse_ms'] / first['ttft_no_reuse_ms']:.2f}x without")
    write_json(args.json, {"turns": table, "runs": {"reuse": runs[True], "no_reuse": runs[False]}})
    return 0


def add_parser(bs) -> None:
    c = bs.add_parser("chat", help="TTFT per turn of a conversation, KV reused across turns or not")
    c.add_argument("-m", "--model", help="GGUF file (default: a stories15M-shaped synth model, random weights)")
    c.add_argument("--chat-template", choices=CHAT_TEMPLATES,
                   help="a built-in template instead of the model's")
    c.add_argument("--turns", type=int, default=8)
    c.add_argument("--user-tokens", type=int, default=100, help="about this many tokens per user message")
    c.add_argument("--reply-tokens", type=int, default=100, help="tokens per reply (greedy, EOS ignored)")
    c.add_argument("--ctx", type=int, default=4096, help="context window")
    c.add_argument("-t", "--threads", type=int, default=2)
    c.add_argument("-r", "--repeats", type=int, default=3)
    c.add_argument("--json")
    c.set_defaults(func=cmd_bench_chat)
