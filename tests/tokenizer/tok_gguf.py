"""Vocab-only GGUF files for the tokenizer tests: a fast metadata reader and a writer.

``gguf.GGUFReader`` takes about 14 s on Llama 3's vocabulary (one numpy view per array
element); this reader walks the key/value section once and takes well under a second.
It is a test helper, not the production loader (``dualpath.models.gguf``).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from dualpath.tokenizer import TokenizerSpec
from dualpath.tokenizer.spec import default_add_bos

_NO_ID = 0xFFFFFFFF  # GGUF's "unset" token id
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
          12: "<f8"}
_STRING, _ARRAY = 8, 9


def read_gguf_metadata(path: str | Path) -> dict:
    """All key/value pairs of a GGUF v2/v3 file; string arrays as lists, numeric arrays as numpy arrays."""
    data = Path(path).read_bytes()
    if data[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    version, _num_tensors, num_kv = struct.unpack_from("<IQQ", data, 4)
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} is not supported by this helper")
    pos = 24

    def string() -> str:
        nonlocal pos
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + n
        return data[pos - n:pos].decode("utf-8", errors="surrogateescape")

    def value(kind: int):
        nonlocal pos
        if kind == _STRING:
            return string()
        if kind == _ARRAY:
            elem, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            if elem == _STRING:
                return [string() for _ in range(n)]
            if elem == _ARRAY:
                return [value(_ARRAY) for _ in range(n)]
            dtype = np.dtype(_NUMPY[elem])
            arr = np.frombuffer(data, dtype, n, pos).copy()
            pos += dtype.itemsize * n
            return arr
        fmt = _SCALARS[kind]
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    meta = {}
    for _ in range(num_kv):
        key = string()
        (kind,) = struct.unpack_from("<I", data, pos)
        pos += 4
        meta[key] = value(kind)
    return meta


def spec_from_metadata(meta: dict) -> TokenizerSpec:
    """A TokenizerSpec from ``tokenizer.ggml.*`` keys, with llama.cpp's defaults for missing ones."""
    def get(key, default=None):
        return meta.get(f"tokenizer.ggml.{key}", default)

    def token_id(key):
        v = get(key)
        return None if v is None or int(v) == _NO_ID else int(v)

    model = get("model")
    scores, types, merges = get("scores"), get("token_type"), get("merges")
    pre = get("pre")
    return TokenizerSpec(
        model=model,
        tokens=tuple(get("tokens")),
        scores=None if scores is None else tuple(float(s) for s in scores),
        token_types=None if types is None else tuple(int(t) for t in types),
        merges=None if merges is None else tuple(merges),
        bos_id=token_id("bos_token_id"),
        eos_id=token_id("eos_token_id"),
        unk_id=token_id("unknown_token_id"),
        eot_id=token_id("eot_token_id"),
        add_bos=bool(get("add_bos_token", default_add_bos(model, pre))),
        add_eos=bool(get("add_eos_token", False)),
        add_space_prefix=bool(get("add_space_prefix", model == "llama")),
        pre=pre,
        name=meta.get("general.name"),
        extra={"remove_extra_whitespaces": bool(get("remove_extra_whitespaces", False))},
    )


def spec_from_gguf(path: str | Path) -> TokenizerSpec:
    """The TokenizerSpec stored in a GGUF file (test helper, not the production loader)."""
    return spec_from_metadata(read_gguf_metadata(path))


def write_vocab_only_gguf(path: str | Path, spec: TokenizerSpec, *, name: str | None = None) -> Path:
    """A GGUF v3 file that llama.cpp loads with ``vocab_only=True``: an architecture, a tokenizer, no tensors.

    llama.cpp reads no hyper-parameters for a vocab_only load (llama-cpp-python 0.3.36).
    ``spec.pre`` must be a name llama.cpp knows ("gpt-2", not "gpt2") or it refuses the file.
    ``name`` (``general.name``) matters to llama.cpp for Phi-3: it gives every special token rstrip.
    Written directly (gguf-py's writer takes 50 ms per vocabulary; the tests write about a hundred).
    """
    kv: list[bytes] = []

    def key(k: str, kind: int, payload: bytes) -> None:
        kv.append(_gguf_string(k) + struct.pack("<I", kind) + payload)

    def string(k: str, v: str) -> None:
        key(k, _STRING, _gguf_string(v))

    def array(k: str, elem: int, items: bytes, n: int) -> None:
        key(k, _ARRAY, struct.pack("<IQ", elem, n) + items)

    string("general.architecture", "llama")
    if name is not None:
        string("general.name", name)
    string("tokenizer.ggml.model", spec.model)
    if spec.pre is not None:
        string("tokenizer.ggml.pre", spec.pre)
    array("tokenizer.ggml.tokens", _STRING, b"".join(map(_gguf_string, spec.tokens)), len(spec.tokens))
    if spec.token_types is not None:
        array("tokenizer.ggml.token_type", 5, np.asarray(spec.token_types, "<i4").tobytes(), len(spec.token_types))
    if spec.scores is not None:
        array("tokenizer.ggml.scores", 6, np.asarray(spec.scores, "<f4").tobytes(), len(spec.scores))
    if spec.merges is not None:
        array("tokenizer.ggml.merges", _STRING, b"".join(map(_gguf_string, spec.merges)), len(spec.merges))
    for k, v in (("bos", spec.bos_id), ("eos", spec.eos_id), ("eot", spec.eot_id), ("unknown", spec.unk_id)):
        if v is not None:
            key(f"tokenizer.ggml.{k}_token_id", 4, struct.pack("<I", v))
    key("tokenizer.ggml.add_bos_token", 7, struct.pack("<?", spec.add_bos))
    key("tokenizer.ggml.add_eos_token", 7, struct.pack("<?", spec.add_eos))
    if spec.model == "llama":
        key("tokenizer.ggml.add_space_prefix", 7, struct.pack("<?", spec.add_space_prefix))
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv)) + b"".join(kv)
    data += b"\0" * (-len(data) % 32)  # the (empty) tensor data starts at the default alignment
    Path(path).write_bytes(data)
    return Path(path)


def _gguf_string(text: str) -> bytes:
    raw = text.encode("utf-8", errors="surrogateescape")
    return struct.pack("<Q", len(raw)) + raw
