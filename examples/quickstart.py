"""Generate a story with the real test model: python examples/quickstart.py [MODEL]"""

import sys

import dualpath

model = sys.argv[1] if len(sys.argv) > 1 else "../shared/models/stories260K.gguf"
llm = dualpath.LLM(model)
params = dualpath.SamplingParams(temperature=0.8, seed=42, max_tokens=128)
for delta in llm.stream("Once upon a time", params):
    print(delta, end="", flush=True)
print()
done = llm.generate("Once upon a time", params)
print(f"[{done.finish_reason}: {done.usage.completion_tokens} tokens at {done.timings.decode_tokens_per_s:.0f} tok/s]")
