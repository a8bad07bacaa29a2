"""The guest side of ``dualpath bench arm``: run by the aarch64 userland's Python under
``qemu-aarch64`` (``python3.11 _arm_worker.py ARGS_JSON RESULT_PATH``), with DualPath's
cross-compiled build on its PYTHONPATH.

Loads the model with one thread, then generates ``num_generate`` tokens greedily from
``prompt_ids`` (or, given ``text``, from its first ``num_prompt_tokens`` ids, which the
result returns so that every engine starts from the same ids). Writes a JSON result to
RESULT_PATH: the generated ids, the kernels DualPath chose, whether the model came from
the converted-model cache. With ``maps_out``, also copies /proc/self/maps there (QEMU's
emulation of it gives guest addresses) so that the host can attribute the instruction
counts of the run to the functions of its files.

The process ends with ``os._exit`` once that is written: the interpreter's teardown would
only add instructions that tell nothing about a token. Stdlib imports only at module
level (the worker runs from the checkout, dualpath from the guest's PYTHONPATH).
"""

import json
import os
import shutil
import sys


def worker(model: str, num_generate: int, n_ctx: int, kernel_isa: str = "auto",
           prompt_ids: list | None = None, text: str = "", num_prompt_tokens: int = 0,
           maps_out: str = "") -> dict:
    import dualpath.kernels as kernels
    from dualpath import LLM
    from dualpath.config import load_config
    from dualpath.sampling.sampler import SamplingParams

    # One thread, unpinned (no core classes to schedule on: the governor stays out), and
    # the driver's context, so that both engines size their caches alike.
    config = load_config(None, {"runtime.num_threads": 1, "power.pin_threads": False,
                                "runtime.max_context_tokens": n_ctx,
                                "runtime.kernel_isa": kernel_isa})
    llm = LLM(model, config)
    if text:
        ids = llm.tokenize(text)
        if len(ids) < num_prompt_tokens:
            raise ValueError(f"the prompt text makes {len(ids)} tokens, fewer than the {num_prompt_tokens} asked for")
        prompt_ids = ids[:num_prompt_tokens]
    assert prompt_ids is not None  # given, or made from the text above
    c = llm.generate([int(t) for t in prompt_ids],
                     SamplingParams(temperature=0.0, max_tokens=num_generate, ignore_eos=True))
    if len(c.token_ids) != num_generate:
        raise RuntimeError(f"generated {len(c.token_ids)} tokens, not {num_generate} (finish: {c.finish_reason})")
    if maps_out:
        shutil.copyfile("/proc/self/maps", maps_out)
    return {"prompt_ids": list(prompt_ids), "ids": list(c.token_ids), "cache": llm.load_stats.get("cache"),
            "default_kernel": kernels.default_kernel(), "available_kernels": list(kernels.available_kernels()),
            "cpu_features": kernels.cpu_features(), "kernel_isa": kernel_isa,
            "disabled": os.environ.get("DUALPATH_DISABLE_CPU_FEATURES", "")}


if __name__ == "__main__":
    result = worker(**json.loads(sys.argv[1]))
    with open(sys.argv[2] + ".part", "w") as f:
        json.dump(result, f)
    os.replace(sys.argv[2] + ".part", sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
