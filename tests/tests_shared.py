"""Helpers shared by the test conftests (importable: tests/ is on sys.path)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def models_dir_path() -> Path:
    return Path(os.environ.get("DUALPATH_TEST_MODELS", REPO_ROOT.parent / "shared" / "models"))


def require_file(path: Path) -> Path:
    if not path.is_file():
        pytest.skip(f"test model file {path} not found (set DUALPATH_TEST_MODELS)")
    return path


def copy_gguf(src: Path, dst: Path, fields: dict | None = None, drop: frozenset[str] = frozenset(),
              tensors: dict | None = None) -> Path:
    """Copy GGUF ``src`` to ``dst`` field by field and tensor by tensor; ``fields`` maps a
    key to (value, GGUFValueType), or (values, ARRAY, the items' GGUFValueType), replacing
    the key's value where ``src`` has it, else added after the others; the keys and tensors
    named in ``drop`` are left out; ``tensors`` (name -> f32 array, or (raw blocks, its
    GGMLQuantizationType)) are added after the others."""
    import gguf

    fields = dict(fields or {})
    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop:
            continue  # GGUFWriter writes the first two itself
        if key in fields:
            writer.add_key_value(key, *fields.pop(key))
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub_type)
    for key, value in fields.items():
        writer.add_key_value(key, *value)
    for t in reader.tensors:  # t.data is (ne1, ne0) row-major, as GGUFWriter wants it
        if t.name in drop:
            continue
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    for name, array in (tensors or {}).items():
        data, raw_dtype = array if isinstance(array, tuple) else (array, None)
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def write_gguf_with_chat_template(src: Path, dst: Path, template: str) -> Path:
    """Copy GGUF ``src`` to ``dst``, adding ``tokenizer.chat_template``."""
    import gguf

    return copy_gguf(src, dst, {"tokenizer.chat_template": (template, gguf.GGUFValueType.STRING)})


THINK_TEMPLATE = ("{% for m in messages %}{% if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}"
                  "</think>{% endif %}{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}"
                  "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
                  "{% else %}<think>\n{% endif %}{% endif %}")
"""A chat template that thinks as Qwen3's does: its generation prompt opens ``<think>``
(the reply starts inside the thinking), or with ``enable_thinking`` false closes it empty;
an earlier reply's ``reasoning_content`` is rendered before its content."""
PLAIN_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
"""A template that leaves the reply to open its thinking itself."""
THINK_PROMPT = [{"role": "user", "content": "Once upon a time"}]
THINK_TOKEN, THINK_END_TOKEN = 441, 511
"""Under ``PLAIN_TEMPLATE`` stories260K greedily writes token 441 ("O") first for
``THINK_PROMPT``: ``write_thinking_gguf(marker_tokens=True)`` renames it ``<think>`` and the
seldom-used 511 ``</think>`` (user-defined tokens, as Qwen3's markers are), so the model
opens its thinking with one token of its own."""


def write_thinking_gguf(src: Path, dst: Path, template: str, marker_tokens: bool = False) -> Path:
    """Copy GGUF ``src`` (stories260K) to ``dst`` with ``template``; ``marker_tokens``: with
    ``<think>`` and ``</think>`` as single tokens (see THINK_TOKEN)."""
    import gguf

    fields = {"tokenizer.chat_template": (template, gguf.GGUFValueType.STRING)}
    if marker_tokens:
        reader = gguf.GGUFReader(str(src))
        tokens = list(reader.fields["tokenizer.ggml.tokens"].contents())
        types = list(reader.fields["tokenizer.ggml.token_type"].contents())
        for token_id, text in ((THINK_TOKEN, "<think>"), (THINK_END_TOKEN, "</think>")):
            tokens[token_id], types[token_id] = text, 4  # USER_DEFINED: decoded as text
        fields["tokenizer.ggml.tokens"] = (tokens, gguf.GGUFValueType.ARRAY)
        fields["tokenizer.ggml.token_type"] = (types, gguf.GGUFValueType.ARRAY)
    return copy_gguf(src, dst, fields)


NEAR_TIE = 0.05
"""Largest f32 logit gap between run.c's token and the runner-up at which an f16 KV cache
may pick the runner-up (its rounding moves these logits by up to ~2e-2)."""


def assert_golden_ids(got: list[int], want: list[int], prompt_ids: list[int], kv_dtype: str, f32_runner,
                      name: str = "") -> None:
    """``got`` equals run.c's greedy ids ``want``; with an f16 KV cache the runs may part at
    a near-tie of the f32 model: there ``got`` must hold the f32 runner-up, less than
    NEAR_TIE behind (greedy_zoe_cafe's generated index 232 is 0.017 apart in f32 and
    1.9e-6 under an f16 cache, so the kernels' summation order decides). ``f32_runner()``
    makes a ModelRunner over the same model with an f32 cache."""
    if kv_dtype == "f32" or got == want:
        assert got == want, name
        return
    m = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    assert m < min(len(got), len(want)), (name, "lengths differ with no differing id")
    runner = f32_runner()
    runner.begin([])
    prefix = list(prompt_ids) + list(want[:m])
    for i in range(0, len(prefix), 64):
        logits = runner.forward(prefix[i:i + 64])[-1]
    top2 = logits.argsort()[::-1][:2]
    gap = float(logits[top2[0]] - logits[top2[1]])
    assert top2[0] == want[m] and got[m] == top2[1] and gap < NEAR_TIE, (name, m, gap)


def synth_bert_head_dim_20(path: Path) -> str:
    """bert-tiny's twin with head_dim 20 (dim 80, 4 heads), F32: its attention is ONNX Runtime's
    over padded texts, since ours takes a head_dim in whole 8s (graph/encoder.py)."""
    from dataclasses import replace

    from dualpath.models.synth import PRESETS, synth_gguf

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(PRESETS, "bert-hd20-tiny", replace(PRESETS["bert-tiny"], dim=80, hidden_dim=320))
        return synth_gguf(path, "bert-hd20-tiny", "F32")
