"""Helpers shared by the tests that compare DualPath with llama.cpp on the same file."""

import numpy as np


def llamacpp_greedy(path, prompt, num_greedy: int, context: int):
    """llama.cpp's greedy run at 2 threads: its logits at the last prompt position and
    after each greedy token but the last (num_greedy, vocab), and the tokens."""
    import llama_cpp

    ref = llama_cpp.Llama(path, n_ctx=context, n_threads=2, n_batch=64, logits_all=True, verbose=False)
    try:
        ref.eval(prompt)
        rows, tokens = [], []
        for _ in range(num_greedy):
            logits = np.array(ref.scores[ref.n_tokens - 1], dtype=np.float32)
            rows.append(logits)
            tokens.append(int(logits.argmax()))
            ref.eval([tokens[-1]])
        return np.stack(rows), tokens
    finally:
        ref.close()


def dualpath_greedy(path, prompt, forced, accuracy_level: int, context: int):
    """(spec, our logits teacher-forced along ``forced`` (len(forced), vocab), our greedy
    tokens (as many)) at 2 threads."""
    from dualpath import LLM, load_config

    llm = LLM(path, load_config(None, {"runtime.max_context_tokens": context, "runtime.num_threads": 2,
                                       "runtime.quantized_matmul_accuracy": accuracy_level}))
    try:
        teacher = llm.runner.forward(prompt + forced[:-1], all_logits=True)[len(prompt) - 1:].copy()
        llm.runner.reset()
        logits, tokens = llm.runner.forward(prompt)[0], []
        for _ in range(len(forced)):
            tokens.append(int(logits.argmax()))
            logits = llm.runner.forward([tokens[-1]])[0]
        return llm.spec, teacher, tokens
    finally:
        del llm
