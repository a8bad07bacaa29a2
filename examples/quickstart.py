"""Generate a story: python examples/quickstart.py [MODEL] (default: the built-in stories260K)"""

import sys

import dualpath
from dualpath.models import embedded_model_path

model = sys.argv[1] if len(sys.argv) > 1 else embedded_model_path()
llm = dualpath.LLM(model)
params = dualpath.SamplingParams(temperature=0.8, seed=42, max_tokens=128)
for delta in llm.stream("Once upon a time", params):
    print(delta, end="", flush=True)
print()
done = llm.generate("Once upon a time", params)
print(f"[{done.finish_reason}: {done.usage.completion_tokens} tokens at {done.timings.decode_tokens_per_s:.0f} tok/s]")
