"""GGUF loading through the ``gguf`` package (the format's reference reader).

Supported: the architectures of ``families.py`` (llama, qwen2, qwen3, gemma2, gemma3,
phi3; the encoders bert and nomic-bert, whose matrices never take our kernels' form: one
ONNX graph runs them, graph/encoder.py) with tensor types F32, F16, BF16, Q8_0, Q4_0, and
Q6_K, Q4_K, Q5_K, Q3_K, Q2_K, Q5_0, Q4_1, Q5_1, IQ4_NL (the types of llama.cpp's
Q4_K_M / Q5_K_M / Q6_K / Q3_K / Q2_K files and their fallbacks).

* F32 stays a zero-copy view of the memory-mapped file.
* F16 and BF16 are widened to F32 at load: ONNX Runtime's CPU provider runs an fp16
  ``Gemm`` slower than fp32 in decode (docs/performance.md), so keeping fp16 would halve
  memory but cost decode speed; we choose exactness and speed and report the memory
  (``dualpath info``).
* Quantized types are repacked once into ``MatMulNBits`` form by ``quants.py`` (compiled
  code), which states per type what is exact and what is not (Q8_0 and Q4_0: the same
  values and scales, see ``spec.py``); the file's pages are not kept.
* A ``token_embd`` of the types other than Q8_0 and Q4_0 stays in its MatMulNBits form: the
  embedding gathers and dequantizes only the rows of a step (``quants.gather_rows``),
  and a tied classifier is a ``MatMulNBits`` over the same arrays. (Dequantized to f32
  it was 4 bytes a value: 1 GiB for Llama 3.2's 128256 x 2048 table, read whole by
  every decode step of a tied classifier.)
"""

from __future__ import annotations

import base64
import gc
import logging
import mmap
import os
import sys
from typing import Literal

import numpy as np

from ..errors import ModelLoadError
from ..tokenizer.spec import TokenizerSpec, default_add_bos
from . import quants
from .families import family
from .files import check_gguf_file, mapped_memmap
from .spec import ModelConfig, ModelSpec, Weight, check_config, check_weights

log = logging.getLogger(__name__)

SUPPORTED_TYPES = ("F32", "F16", "BF16") + quants.NBITS_TYPES


class _UnknownTensorType(Exception):
    def __init__(self, name: str, code: int):
        super().__init__(name, code)
        self.name, self.code = name, code


def _reader_class():
    """``gguf.GGUFReader`` with bounds checks it lacks (found by tests/models/test_fuzz_gguf.py):
    a read past the end of the file raises instead of returning an empty array; an array
    whose length cannot fit in the rest of the file is refused before its items are read
    (else 2^63 one-byte items loop forever past the end); a tensor type code gguf-py does
    not know is reported with the tensor's name."""
    import gguf
    from gguf import GGUFValueType as VT

    dtypes: dict = {}
    ARRAY = int(VT.ARRAY)

    class Reader(gguf.GGUFReader):
        string_spans: dict  # id(an array's part) -> its strings' (start, stop): see _get_field_parts

        def __init__(self, *args, **kwargs):
            self.string_spans = {}
            super().__init__(*args, **kwargs)

        def _get(self, offset, dtype, count=1, override_order=None):
            # gguf-py's _get (a typed view of `count` items at `offset`), with a bound check,
            # over a plain ndarray view of the np.memmap: slicing a memmap costs a Python-level
            # __array_finalize__ per call, and a large vocabulary makes a call per token and
            # field. The memmap stays reachable as `memmap` (and as the base).
            data = self.data
            if type(data) is np.memmap:
                self.memmap = data
                data = self.data = data.view(np.ndarray)
            count = int(count)
            dt = dtypes.get(dtype)
            if dt is None:
                dt = dtypes[dtype] = np.dtype(dtype)
            end = offset + dt.itemsize * count
            if count < 0 or end > len(data):
                raise ValueError(f"{count} x {dt.name} at byte {offset} run past the end "
                                 f"of the file ({len(data)} bytes)")
            arr = data[offset:end].view(dt)
            order = self.byte_order if override_order is None else override_order
            return arr if order == "I" else arr.view(dt.newbyteorder(order))

        def _get_field_parts(self, orig_offs, raw_type):
            if raw_type == ARRAY:  # an int constant: VT.ARRAY costs an enum lookup per item
                item_type = int(self._get(orig_offs, np.uint32)[0])
                num_items = int(self._get(orig_offs + 4, np.uint64)[0])
                try:
                    item = VT(item_type)
                except ValueError:
                    raise ValueError(f"array at byte {orig_offs} has unknown item type {item_type}") from None
                item_bytes = {VT.STRING: 8, VT.ARRAY: 12}.get(item) or np.dtype(self.gguf_scalar_to_np[item]).itemsize
                if num_items * item_bytes > len(self.data) - orig_offs - 12:
                    raise ValueError(f"array at byte {orig_offs} claims {num_items} items, more than the rest "
                                     "of the file holds")
                # gguf-py makes a part (a numpy view, two for a string) per item: a 262k-token
                # vocabulary takes seconds. One part holds all the items here instead.
                head = [self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)]
                if item == VT.STRING:
                    size, spans = _string_spans(self.data, orig_offs + 12, num_items, self.byte_order)
                    blob = self._get(orig_offs + 12, np.uint8, size)
                    self.string_spans[id(blob)] = spans
                    return 12 + size, head + [blob], [2], [VT.ARRAY, item]
                if item != VT.ARRAY:  # numbers: contents() flattens the part
                    items = self._get(orig_offs + 12, self.gguf_scalar_to_np[item], num_items)
                    return 12 + int(items.nbytes), head + [items], [2], [VT.ARRAY, item]
            return super()._get_field_parts(orig_offs, raw_type)

        def _build_tensors(self, start_offs, fields):
            known = {int(t) for t in gguf.GGMLQuantizationType}
            for f in fields:
                if int(f.parts[4][0]) not in known:
                    raise _UnknownTensorType(f.name, int(f.parts[4][0]))
            super()._build_tensors(start_offs, fields)

    return Reader


def _string_spans(data: np.ndarray, offset: int, count: int, byte_order: str) -> tuple[int, list]:
    """The bytes that ``count`` length-prefixed GGUF strings at ``offset`` of ``data`` take,
    and each one's (start, stop) relative to ``offset``; decoded when the metadata is read
    (``_Metadata.get``)."""
    view = memoryview(data)  # type: ignore[arg-type]  # numpy arrays are buffers
    order: Literal["little", "big"] = "little" if (byte_order == "I") == (sys.byteorder == "little") else "big"
    spans, pos, end = [], offset, len(data)
    for _ in range(count):
        if pos + 8 > end:
            raise ValueError(f"string at byte {pos} runs past the end of the file ({end} bytes)")
        n = int.from_bytes(view[pos:pos + 8], order)
        if n > end - pos - 8:
            raise ValueError(f"string at byte {pos} claims {n} bytes, more than the rest of the file holds")
        spans.append((pos + 8 - offset, pos + 8 + n - offset))
        pos += 8 + n
    return pos - offset, spans


def _check_tensor_offsets(path: str, reader) -> None:
    """The tensors' data must follow each other in file order, each padded to the
    alignment, as ggml's own reader requires (gguf.cpp: "tensor '%s' has offset %d,
    expected %d"): a misaligned, overlapping or mis-sized tensor would otherwise be read
    silently from another tensor's bytes."""
    expected = 0
    for t in reader.tensors:
        offset = int(t.field.parts[5][0])  # as stored: t.data_offset wraps around in uint64
        if offset != expected:
            raise ModelLoadError(path, f"tensor {t.name!r} ({t.tensor_type.name}, {int(t.n_bytes)} bytes) has data "
                                       f"offset {offset}, expected {expected}: tensor data must follow in order, "
                                       f"each padded to {int(reader.alignment)} bytes (corrupt file?)")
        expected += -(-int(t.n_bytes) // int(reader.alignment)) * int(reader.alignment)


def load_gguf(path: str | os.PathLike, sink=None) -> ModelSpec:
    """Read a GGUF file into a ModelSpec. Every problem raises ``ModelLoadError``.
    ``sink``: see ``load_model``."""
    path = os.fspath(path)
    check_gguf_file(path)
    reader = open_reader(path)
    meta = _Metadata(path, reader)
    fam = family(path, meta.get("general.architecture"))
    a = fam.name  # GGUF keys are prefixed with the architecture
    tensors = {t.name: t for t in reader.tensors}
    _check_tensor_offsets(path, reader)
    cfg = _model_config(path, meta, fam, tensors)
    weights = _convert_weights(path, reader, tensors, sink, has_classifier=cfg.causal)
    check_weights(path, cfg, weights)

    tok = _tokenizer_spec(path, meta, cfg.vocab_size)
    file_type = meta.get("general.file_type")
    metadata = {
        "name": meta.get("general.name", ""),
        "file_type": _FILE_TYPES.get(file_type, str(file_type)) if file_type is not None else "",
        "tensor_types": sorted({t.tensor_type.name for t in tensors.values()}),
        # llama.cpp's pooling types (1 mean, 2 cls, 3 last, 4 rank) for embeddings; mean when absent
        "pooling": {1: "mean", 2: "cls", 3: "last", 4: "rank"}.get(meta.get_int(f"{a}.pooling_type", 1), "mean"),
    }
    if not cfg.causal:
        metadata["pooling"] = _encoder_pooling(path, meta, a)
    if metadata["pooling"] == "rank":
        metadata["rank"] = _rank_metadata(path, meta, a, tok, tensors)
    header_bytes = int(reader.data_offset)
    del reader, tensors, meta
    gc.collect()  # the reader's memory map is released once nothing views it
    return ModelSpec(
        path=path,
        format="gguf",
        config=cfg,
        tokenizer=tok,
        weights=weights,
        metadata=metadata,
        header_bytes=header_bytes,
    )


def read_layout(path: str | os.PathLike) -> tuple[ModelConfig, dict[str, tuple[str, tuple[int, ...]]], int]:
    """What a memory plan needs, from the header alone (no tensor data is read): the
    checked hyper-parameters, each tensor's GGML type name and shape (out, in) / (n,),
    and the number of BPE merges."""
    path = os.fspath(path)
    check_gguf_file(path)
    reader = open_reader(path)
    meta = _Metadata(path, reader)
    fam = family(path, meta.get("general.architecture"))
    tensors = {t.name: t for t in reader.tensors}
    cfg = _model_config(path, meta, fam, tensors)
    layout = {}
    for name, t in tensors.items():
        shape = tuple(int(x) for x in reversed([int(n) for n in t.shape]))
        layout[name] = (getattr(t.tensor_type, "name", str(t.tensor_type)), shape[:1] if shape[1:] == (1,) else shape)
    merges = meta.fields.get("tokenizer.ggml.merges")
    return cfg, layout, len(merges.data) if merges is not None else 0


def read_tokenizer(path: str | os.PathLike) -> TokenizerSpec:
    """The tokenizer of a GGUF file, from its header alone: a vocabulary-only file (llama.cpp's
    ``models/ggml-vocab-*.gguf``) has no tensors or hyper-parameters to load."""
    path = os.fspath(path)
    check_gguf_file(path)
    meta = _Metadata(path, open_reader(path))
    return _tokenizer_spec(path, meta, len(meta.get_list("tokenizer.ggml.tokens", str) or ()))


def open_reader(path: str):
    """The checked ``gguf.GGUFReader`` of ``path``; whatever the reader raises becomes a ModelLoadError."""
    _Reader = _reader_class()
    try:
        return _Reader(path, "r")
    except _UnknownTensorType as e:
        raise ModelLoadError(path, f"tensor {e.name!r} has unknown type code {e.code} (not a GGML type this "
                                   f"gguf package knows; supported: {', '.join(SUPPORTED_TYPES)})") from None
    except Exception as e:  # the reader raises ValueError, IndexError, struct errors ...
        raise ModelLoadError(path, f"corrupt or truncated GGUF: {type(e).__name__}: {e}") from e


def _model_config(path: str, meta: _Metadata, fam, tensors: dict) -> ModelConfig:
    """The checked hyper-parameters: the keys every family has, then ``fam``'s own."""
    a = fam.name
    dim = meta.require_int(f"{a}.embedding_length")
    num_heads = meta.require_int(f"{a}.attention.head_count")
    if f"{a}.attention.key_length" not in meta.fields and num_heads > 0 and dim % num_heads:
        raise ModelLoadError(path, f"{a}.embedding_length={dim} is not a multiple of "
                                   f"{a}.attention.head_count={num_heads} (and no {a}.attention.key_length)")
    head_dim = meta.get_int(f"{a}.attention.key_length", dim // num_heads if num_heads else 0)
    value_dim = meta.get_int(f"{a}.attention.value_length", head_dim)
    if value_dim != head_dim:
        raise ModelLoadError(path, f"{a}.attention.value_length={value_dim} differs from key_length={head_dim} "
                                   "(not supported)")
    vocab_size = meta.get_int(f"{a}.vocab_size", 0)
    tokens = meta.get_list("tokenizer.ggml.tokens", str)
    if not vocab_size:
        vocab_size = len(tokens) if tokens else 0
    if not vocab_size and "token_embd.weight" in tensors:
        # No vocabulary anywhere: take the size from the embedding, so that the error
        # below is "no tokenizer", not a meaningless vocab_size=0.
        vocab_size = int(tensors["token_embd.weight"].shape[-1])
    common = dict(
        arch=a,
        dim=dim,
        hidden_dim=meta.require_int(f"{a}.feed_forward_length"),
        num_layers=meta.require_int(f"{a}.block_count"),
        num_heads=num_heads,
        num_kv_heads=meta.get_int(f"{a}.attention.head_count_kv", num_heads),
        head_dim=head_dim,
        vocab_size=vocab_size,
        context_length=meta.require_int(f"{a}.context_length"),
        rope_theta=meta.get_float(f"{a}.rope.freq_base", 10000.0),
        rope_dim=meta.get_int(f"{a}.rope.dimension_count", head_dim),
        rms_eps=meta.get_float(f"{a}.attention.layer_norm_rms_epsilon", 1e-5),
        tied_output="output.weight" not in tensors,
    )
    cfg = ModelConfig(**{**common, **fam.config_fields(meta, common, set(tensors))})
    check_config(path, cfg)
    if cfg.num_layers > len(tensors):  # else check_weights lists billions of expected names first
        raise ModelLoadError(path, f"{a}.block_count={cfg.num_layers} but the file holds only {len(tensors)} "
                                   "tensors (at least one per layer)")
    return cfg


def _encoder_pooling(path: str, meta: _Metadata, arch: str) -> str:
    """An encoder's pooling as llama.cpp reads it: ``{arch}.pooling_type``, none when absent."""
    kinds = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
    value = meta.get_int(f"{arch}.pooling_type", 0)
    if value not in kinds:
        raise ModelLoadError(path, f"{arch}.pooling_type={value} is not a pooling type "
                                   "(0 none, 1 mean, 2 cls, 3 last, 4 rank)")
    return kinds[value]


def _rank_metadata(path: str, meta: _Metadata, arch: str, tok: TokenizerSpec, tensors: dict) -> dict:
    """What a reranker's scoring reads (executor/rank_head.py, rerank.py): its labels (one
    output each; llama.cpp's ``n_cls_out``, 1 without labels), the ``rerank`` prompt template
    when the file has one, and else how llama.cpp's server joins a query and a document
    (``format_prompt_rerank``: BOS, query, EOS, SEP, document, EOS, each as the file's flags
    say; EOS falls back to SEP; WordPiece adds BOS and SEP by default)."""
    labels = meta.get_list(f"{arch}.classifier.output_labels", str) or []
    if meta.get_int(f"{arch}.classifier.pooling_type", 0) not in (0, 2) or "cls.norm.weight" in tensors:
        raise ModelLoadError(path, "a ModernBERT-style head (mean pooling before the classifier, or cls.norm) is "
                                   "not supported: only [CLS] / last-token rank pooling")
    out = tensors.get("cls.output.weight")
    num_out = max(1, len(labels))
    if out is not None and int(out.shape[-1]) != num_out:
        raise ModelLoadError(path, f"cls.output.weight has {int(out.shape[-1])} rows but the file names {num_out} "
                                   f"classifier output label(s) ({arch}.classifier.output_labels)")
    template = meta.get("tokenizer.chat_template.rerank")
    wpm = tok.model == "bert"

    def token(key: str, fallback):
        value = meta.get_int(key, -1) if key in meta.fields else -1
        return value if 0 <= value < len(tok.tokens) else fallback

    eos = token("tokenizer.ggml.eos_token_id", tok.eos_id)
    return {"labels": list(labels), "num_outputs": num_out,
            "template": template if isinstance(template, str) else None,
            "bos_id": token("tokenizer.ggml.bos_token_id", tok.bos_id),
            "eos_id": eos if eos is not None else token("tokenizer.ggml.seperator_token_id", tok.extra.get("sep_id")),
            "sep_id": token("tokenizer.ggml.seperator_token_id", tok.extra.get("sep_id")),
            "add_bos": bool(meta.get("tokenizer.ggml.add_bos_token", tok.add_bos)),
            "add_eos": bool(meta.get("tokenizer.ggml.add_eos_token", tok.add_eos)),
            "add_sep": bool(meta.get("tokenizer.ggml.add_sep_token", wpm))}


def _convert_weights(path: str, reader, tensors: dict, sink, has_classifier: bool = True) -> dict[str, Weight]:
    """Every ``.weight``/``.bias`` tensor as a Weight, each handed to ``sink`` once converted.
    A layer's matrices of our kernels' types take their form; so does the classifier where
    the model ``has_classifier`` (a decoder: ``output``, or the ``token_embd`` tied to it;
    an encoder's ``token_embd`` is only gathered).

    Zero copy pays when the file is mostly F32. When it is mostly converted weights
    (quantized or F16), the few F32 views (norms) would pin the whole mapping, whose
    pages the conversion touched: copy them so the mapping is released."""
    import gguf

    f32_bytes = sum(int(t.n_bytes) for t in tensors.values() if t.tensor_type == gguf.GGMLQuantizationType.F32)
    keep_views = f32_bytes >= 0.05 * os.path.getsize(path)
    weights: dict[str, Weight] = {}
    classifier = ("output.weight" if "output.weight" in tensors else "token_embd.weight") if has_classifier else ""
    for name, t in tensors.items():
        if name.endswith((".weight", ".bias")):  # "blk.0.attn_q.weight" -> "blk.0.attn_q"; biases keep ".bias"
            key = name.removesuffix(".weight")
            w = convert_tensor(path, name, t, key, name == classifier)
            view = not w.source_type and w.dtype == "f32"
            if view and not keep_views:
                w.data, view = np.array(w.data), False
            if sink is not None:
                w = sink(w, int(t.n_bytes))
                if not view:
                    _drop_source_pages(reader.memmap, int(t.data_offset), int(t.n_bytes))
            weights[key] = w
    return weights


def _drop_source_pages(data: np.memmap, offset: int, nbytes: int) -> None:
    """Forget the resident pages of a tensor just converted (streaming into a cache
    entry): the file's mapping then never holds more than one tensor's pages."""
    owner = mapped_memmap(data)
    m = None if owner is None else owner.base
    if m is None or not hasattr(m, "madvise"):
        return
    lo = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE
    hi = (offset + nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if hi > lo:
        m.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


_FILE_TYPES = {0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1", 7: "MOSTLY_Q8_0",
               8: "MOSTLY_Q5_0", 9: "MOSTLY_Q5_1", 10: "MOSTLY_Q2_K", 11: "MOSTLY_Q3_K_S", 12: "MOSTLY_Q3_K_M",
               13: "MOSTLY_Q3_K_L", 14: "MOSTLY_Q4_K_S", 15: "MOSTLY_Q4_K_M", 16: "MOSTLY_Q5_K_S",
               17: "MOSTLY_Q5_K_M", 18: "MOSTLY_Q6_K", 21: "MOSTLY_Q2_K_S", 25: "MOSTLY_IQ4_NL",
               32: "MOSTLY_BF16"}


class _Metadata:
    """Typed access to GGUF key/values with errors that name the key."""

    def __init__(self, path: str, reader):
        self.path = path
        self.fields = reader.fields
        self.string_spans = reader.string_spans

    def get(self, key: str, default=None):
        field = self.fields.get(key)
        if field is None:
            return default
        from gguf import GGUFValueType as VT

        try:
            if field.types == [VT.ARRAY, VT.STRING]:
                blob = field.parts[field.data[0]]  # the reader keeps an array's strings in one part
                raw = blob.tobytes()
                return [raw[a:b].decode("utf-8") for a, b in self.string_spans[id(blob)]]
            return field.contents()
        except Exception as e:
            raise ModelLoadError(self.path, f"metadata {key!r} is unreadable: {e}") from e

    def get_int(self, key: str, default: int) -> int:
        value = self.get(key, default)
        if isinstance(value, (list, tuple)) or isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ModelLoadError(self.path, f"metadata {key!r}={value!r} must be an integer")
        return int(value)

    def get_float(self, key: str, default: float) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise ModelLoadError(self.path, f"metadata {key!r}={value!r} must be a number")
        return float(value)

    def get_list(self, key: str, item_type: type) -> list | None:
        """An array of ``item_type`` (str, int or float), or None when the key is absent."""
        value = self.get(key)
        if value is None:
            return None
        kinds = {str: (str,), int: (int, np.integer), float: (int, float, np.integer, np.floating)}[item_type]
        if not isinstance(value, list) or not all(isinstance(v, kinds) and not isinstance(v, bool) for v in value):
            raise ModelLoadError(self.path, f"metadata {key!r} must be an array of {item_type.__name__}, "
                                            f"got {type(value).__name__}")
        return value

    def require_int(self, key: str) -> int:
        if key not in self.fields:
            raise ModelLoadError(self.path, f"missing metadata key {key!r}")
        return self.get_int(key, 0)


def convert_tensor(path: str, name: str, t, key: str, classifier: bool = False) -> Weight:
    """One GGUF tensor ``name`` -> the Weight ``key`` in ONNX Runtime's layout or our kernels'
    form (see spec.py); ``classifier``: it is the classifier (``output``, or a tied embedding)."""
    import gguf

    qtype = t.tensor_type
    type_name = getattr(qtype, "name", str(qtype))
    shape = tuple(int(x) for x in reversed([int(n) for n in t.shape]))  # (out, in) / (n,)
    if len(shape) == 2 and shape[1] == 1:  # gguf keeps a trailing 1 for vectors
        shape = (shape[0],)
    try:
        raw = t.data
        if qtype == gguf.GGMLQuantizationType.F32:
            data = np.asarray(raw, dtype=np.float32).reshape(shape)
            return Weight(key, "f32", shape, data)
        if qtype == gguf.GGMLQuantizationType.F16:
            data = np.asarray(raw, dtype=np.float16).reshape(shape).astype(np.float32)
            return Weight(key, "f32", shape, data, source_type="F16")
        if qtype == gguf.GGMLQuantizationType.BF16:
            bits = np.asarray(raw).view(np.uint16).astype(np.uint32) << 16
            data = bits.view(np.float32).reshape(shape)
            return Weight(key, "f32", shape, data, source_type="BF16")
        if type_name in quants.NBITS_TYPES:
            block = quants.block_size(type_name)
            if len(shape) != 2 or shape[1] % block:
                raise ModelLoadError(path, f"tensor {name!r} of type {type_name} has shape {shape}; "
                                           f"rows must be a multiple of {block}")
            raw = np.asarray(raw, dtype=np.uint8)
            if quants.kernel_form(key, type_name, shape, classifier):
                return Weight(key, type_name.lower(), shape, quants.to_kernel_form(raw, type_name, shape),
                              source_type=type_name, kernel_form=True)
            nb = quants.repack(raw, type_name, shape)
            return Weight(key, type_name.lower(), shape, nb.blob, nb.scales, bits=nb.bits,
                          block_size=nb.block_size, zero_points=nb.zero_points, mins=nb.mins)
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(path, f"tensor {name!r} ({type_name}, shape {shape}) is unreadable: {e}") from e
    raise ModelLoadError(path, f"tensor {name!r} has unsupported type {type_name} "
                               f"(supported: {', '.join(SUPPORTED_TYPES)})")


def _tokenizer_spec(path: str, meta: _Metadata, vocab_size: int) -> TokenizerSpec:
    model = meta.get("tokenizer.ggml.model")
    tokens = meta.get_list("tokenizer.ggml.tokens", str)
    if model is None or not tokens:
        missing = " and ".join(k for k, v in (("tokenizer.ggml.model", model), ("tokenizer.ggml.tokens", tokens))
                               if not v)
        raise ModelLoadError(path, f"no tokenizer in the file ({missing} missing)")
    if model not in ("llama", "gpt2", "bert", "t5"):
        raise ModelLoadError(path, f"unsupported tokenizer model {model!r} in tokenizer.ggml.model "
                                   "(supported: 'llama', 'gpt2', 'bert', 't5')")
    if len(tokens) != vocab_size:
        raise ModelLoadError(path, f"tokenizer has {len(tokens)} tokens but the model's vocab_size is {vocab_size}")

    def opt_id(key):
        if key not in meta.fields:
            return None
        value = meta.get_int(key, 0)
        return value if 0 <= value < len(tokens) else None  # e.g. 0xFFFFFFFF: unset

    pre, name = meta.get("tokenizer.ggml.pre"), meta.get("general.name")
    if pre is not None and not isinstance(pre, str):
        raise ModelLoadError(path, f"metadata 'tokenizer.ggml.pre'={pre!r} must be a string")
    scores = meta.get_list("tokenizer.ggml.scores", float)
    types = meta.get_list("tokenizer.ggml.token_type", int)
    merges = meta.get_list("tokenizer.ggml.merges", str)
    for key, arr in (("tokenizer.ggml.scores", scores), ("tokenizer.ggml.token_type", types)):
        if arr is not None and len(arr) != len(tokens):
            raise ModelLoadError(path, f"{key} has {len(arr)} entries, expected {len(tokens)}")
    if model == "gpt2" and not merges:
        raise ModelLoadError(path, "byte-level BPE tokenizer without tokenizer.ggml.merges")
    if model == "bert":
        return _wpm_spec(path, meta, tokens, types, opt_id)
    if model == "t5":
        return _ugm_spec(path, meta, tokens, scores, types, opt_id)
    return TokenizerSpec(
        model=model,
        tokens=tuple(tokens),
        scores=scores,
        token_types=types,
        merges=tuple(merges) if merges else None,
        bos_id=opt_id("tokenizer.ggml.bos_token_id"),
        eos_id=opt_id("tokenizer.ggml.eos_token_id"),
        unk_id=opt_id("tokenizer.ggml.unknown_token_id"),
        eot_id=opt_id("tokenizer.ggml.eot_token_id"),
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", default_add_bos(model, pre))),
        add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", model == "llama")),
        pre=pre,
        chat_template=meta.get("tokenizer.chat_template"),
        name=name if isinstance(name, str) else None,
        extra={"remove_extra_whitespaces": bool(meta.get("tokenizer.ggml.remove_extra_whitespaces", False))},
    )


def _wpm_spec(path: str, meta: _Metadata, tokens: list, types: list | None, opt_id) -> TokenizerSpec:
    """A WordPiece vocabulary (``tokenizer.ggml.model`` ``bert``) as llama.cpp loads it: [CLS]
    (the BOS id, default 101) before and [SEP] (``seperator_token_id``, default 102) after
    every text, unknown words as ``unknown_token_id`` (default 100); lowercase unless the file
    says otherwise, accents stripped as lowercase unless it says otherwise."""
    def role(key: str, default: int) -> int:
        value = opt_id(key)
        if value is None and key in meta.fields:  # set but outside the vocabulary
            raise ModelLoadError(path, f"metadata {key!r}={meta.get(key)!r} is not a token id "
                                       f"(vocabulary of {len(tokens)})")
        value = default if value is None else value
        if not 0 <= value < len(tokens):
            raise ModelLoadError(path, f"{key} is absent and llama.cpp's default {default} is outside the "
                                       f"vocabulary of {len(tokens)} tokens")
        return value

    lowercase = bool(meta.get("tokenizer.ggml.normalizer.lowercase", True))
    name = meta.get("general.name")
    return TokenizerSpec(
        model="bert", tokens=tuple(tokens), token_types=types,
        bos_id=role("tokenizer.ggml.bos_token_id", 101), unk_id=role("tokenizer.ggml.unknown_token_id", 100),
        eos_id=None, add_bos=True, add_eos=False, add_space_prefix=False,
        pre=meta.get("tokenizer.ggml.pre"), name=name if isinstance(name, str) else None,
        extra={"sep_id": role("tokenizer.ggml.seperator_token_id", 102), "lowercase": lowercase,
               "strip_accents": bool(meta.get("tokenizer.ggml.normalizer.strip_accents", lowercase))},
    )


def _ugm_spec(path: str, meta: _Metadata, tokens: list, scores: list | None, types: list | None,
              opt_id) -> TokenizerSpec:
    """A SentencePiece Unigram vocabulary (``tokenizer.ggml.model`` ``t5``) as llama.cpp loads
    it: EOS (default id 1) after every text and no BOS unless the file says otherwise (an
    XLM-R file says both: ``<s> text </s>``), unknown token default id 2, no space prefix
    and no whitespace merging unless the file asks; the charsmap kept as base64 text."""
    if scores is None:
        raise ModelLoadError(path, "a Unigram (t5) tokenizer needs tokenizer.ggml.scores, which is missing")

    def role(key: str, default: int | None) -> int | None:
        value = opt_id(key)
        if value is None and key not in meta.fields and default is not None and default < len(tokens):
            return default
        return value

    name = meta.get("general.name")
    return TokenizerSpec(
        model="t5", tokens=tuple(tokens), scores=scores, token_types=types,
        bos_id=role("tokenizer.ggml.bos_token_id", None), eos_id=role("tokenizer.ggml.eos_token_id", 1),
        unk_id=role("tokenizer.ggml.unknown_token_id", 2),
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", True)),
        add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", False)),
        pre=meta.get("tokenizer.ggml.pre"), name=name if isinstance(name, str) else None,
        extra={"remove_extra_whitespaces": bool(meta.get("tokenizer.ggml.remove_extra_whitespaces", False)),
               "precompiled_charsmap": _charsmap_base64(path, meta),
               # a reranker's pair is <s> query </s> [SEP] document </s> when add_sep (llama.cpp's
               # format_prompt_rerank); XLM-R's SEP is </s>
               "sep_id": role("tokenizer.ggml.seperator_token_id", None),
               "add_sep": bool(meta.get("tokenizer.ggml.add_sep_token", False))},
    )


def _charsmap_base64(path: str, meta: _Metadata) -> str | None:
    """``tokenizer.ggml.precompiled_charsmap`` as base64 text (None when absent), checked as
    llama.cpp checks it at load: an array of bytes, with its header and sizes consistent."""
    from gguf import GGUFValueType as VT

    from ..errors import TokenizerError
    from ..tokenizer.ugm import CHARSMAP_KEY, Charsmap

    field = meta.fields.get(CHARSMAP_KEY)
    if field is None:
        return None
    if field.types[:1] != [VT.ARRAY] or field.types[1:] not in ([VT.UINT8], [VT.INT8]):
        raise ModelLoadError(path, f"metadata {CHARSMAP_KEY!r} must be an array of uint8 or int8, "
                                   f"got {'/'.join(t.name for t in field.types)}")
    blob = np.asarray(field.parts[-1]).tobytes() if field.data else b""
    try:
        Charsmap(blob)
    except TokenizerError as e:
        raise ModelLoadError(path, str(e)) from None
    return base64.b64encode(blob).decode("ascii")


def declared_pooling(path: str | os.PathLike) -> str | None:
    """The pooling a GGUF's header declares (``{arch}.pooling_type``: none, mean, cls, last or
    rank), or None when it declares none or is not a GGUF: how a server tells a decoder
    trained as an embedder (Qwen3-Embedding: last) from a chat model, as llama.cpp reads it."""
    path = os.fspath(path)
    if not os.path.isfile(path):  # a Hugging Face folder: no GGUF header to read
        return None
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            return None
    meta = _Metadata(path, open_reader(path))
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or meta.get(f"{arch}.pooling_type") is None:
        return None
    return _encoder_pooling(path, meta, arch)
