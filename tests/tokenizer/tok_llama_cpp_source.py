"""llama.cpp's pre-tokenizer table, read from its source (src/llama-vocab.cpp).

llama-cpp-python's wheel ships no C++ sources, so the folder comes from
``$DUALPATH_LLAMA_CPP_SRC`` or, by default, ``<repo>/../src/llama_cpp_python-<version>/vendor/llama.cpp``
for the installed llama_cpp version (where this project's environment keeps it). The same
folder's ``models/ggml-vocab-*.gguf`` are llama.cpp's own vocab-only test files (real
vocabularies: Llama 3, Qwen2, GPT-2, Phi-3, Llama 2 ...).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from tests_shared import REPO_ROOT


def llama_cpp_source_dir() -> Path | None:
    """The vendored llama.cpp source folder of the installed llama-cpp-python, or None."""
    env = os.environ.get("DUALPATH_LLAMA_CPP_SRC")
    if env:
        return Path(env)
    try:
        import llama_cpp
    except ImportError:
        return None
    path = REPO_ROOT.parent / "src" / f"llama_cpp_python-{llama_cpp.__version__}" / "vendor" / "llama.cpp"
    return path if path.is_dir() else None


@dataclass(frozen=True)
class LlamaCppPre:
    """What llama.cpp does for one ``tokenizer.ggml.pre`` name."""

    pre_type: str                 # LLAMA_VOCAB_PRE_TYPE_* without the prefix
    regexes: tuple[str, ...]      # regex_exprs, C escapes decoded
    ignore_merges: bool
    byte_encode: bool
    add_bos: bool                 # BOS by default (when the file has no tokenizer.ggml.add_bos_token)


_C_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "'": "'", "0": "\0"}


def _c_string(literal: str) -> str:
    return re.sub(r"\\(.)", lambda m: _C_ESCAPES[m.group(1)], literal)


def read_pre_tokenizers(source_dir: Path) -> dict[str, LlamaCppPre]:
    """name -> LlamaCppPre for every name llama_vocab::impl::load accepts for a BPE vocabulary."""
    src = (source_dir / "src" / "llama-vocab.cpp").read_text(encoding="utf-8")

    # The switch in llm_tokenizer_bpe's constructor: PRE_TYPE -> (regexes, byte_encode).
    start = src.index("struct llm_tokenizer_bpe : llm_tokenizer {")
    body = src[start:src.index("std::vector<std::string> regex_exprs;", start)]
    by_type: dict[str, tuple[tuple[str, ...], bool]] = {}
    for block in body.split("break;"):
        labels = re.findall(r"case LLAMA_VOCAB_PRE_TYPE_(\w+):", block)
        if "default:" in block:
            labels.append("DEFAULT")
        match = re.search(r"regex_exprs = \{(.*?)\n\s*\};", block, re.S)
        if not labels or not match:
            continue
        code = "\n".join(line for line in match.group(1).splitlines() if not line.strip().startswith("//"))
        regexes = tuple(_c_string(lit) for lit in re.findall(r'"((?:[^"\\]|\\.)*)"', code))
        for label in labels:
            by_type[label] = (regexes, "byte_encode = false" not in block)

    # The if-chain in llama_vocab::impl::load: name -> PRE_TYPE and flags.
    chain = src[src.index('} else if (tokenizer_pre == "default") {'):src.index('"unknown pre-tokenizer type')]
    out: dict[str, LlamaCppPre] = {}
    for branch in chain.split("} else if (")[1:]:
        names = re.findall(r'tokenizer_pre == "([^"]+)"', branch)
        pre_type = re.search(r"pre_type = LLAMA_VOCAB_PRE_TYPE_(\w+);", branch).group(1)
        regexes, byte_encode = by_type[pre_type]
        for name in names:
            out[name] = LlamaCppPre(pre_type, regexes, "ignore_merges = true" in branch, byte_encode,
                                    "add_bos = true" in branch)
    return out


def vocab_file(source_dir: Path, name: str) -> Path:
    """``models/ggml-vocab-<name>.gguf`` of the llama.cpp source folder."""
    return source_dir / "models" / f"ggml-vocab-{name}.gguf"
