"""Fuzzing the GGUF loader with a K-quant file: whatever the bytes, ``load_model`` either
returns a ModelSpec or raises ``ModelLoadError``; it never crashes the process. Projector
files (``--mmproj``, ``load_projector``) get a smaller set of the same kinds of cases.

The file is llama.cpp's own Q4_K_M quantization of the ``kquant-tiny`` preset (made once
per module by ``synth_gguf``, through llama-cpp-python's quantizer). Every case is a copy
of it with a few edits: a truncation, or bytes put at an offset. Cases are derived from
the file's layout (as ``gguf.GGUFReader`` sees it) and from seeded generators, so the same
cases run every time:

* truncations: every byte of the 24-byte header, each key/value, each tensor info, the
  alignment padding, the first data byte, each tensor's data, the last byte;
* "slots": one field of the header, of a key/value (key length, value type code, string
  length, array item type and length, a few array items, the value) or of a tensor info
  (name length, n_dims, each dim, type code, data offset), set to a value chosen to hurt
  (0, 1, off by one, 2^31, 2^32, 2^63, 2^64 - 1, every type code, ...);
* random overwrites and bit flips in the header, the key/values, the tensor infos and
  the padding, and in the tensor data.

The cases run in a child process (``python test_fuzz_gguf.py --fuzz-worker SPEC``) that
loads them one by one and prints one JSON line per case, so a crash (SIGSEGV, SIGBUS,
abort) or a hang is pinned to its case, and the child is restarted after it. The child's
address space is capped (``RLIMIT_AS``): a bogus dimension that would make numpy allocate
terabytes fails with MemoryError (a failure of the case) instead of swapping the machine.

Default run: ~600 cases, ~35 s on one core. ``DUALPATH_NIGHTLY=1`` runs the nightly set
(every slot with every value, ~12,500 cases, one child per CPU) as well; its test carries
the ``nightly`` marker, so ``DUALPATH_NIGHTLY=1 pytest -m nightly`` runs it alone. An
environment variable rather than ``addopts = "-m 'not nightly'"``: a ``-m`` on the command
line replaces the one in addopts, so ``pytest -m "not slow"`` would silently pull the
nightly run back in, and naming the test by its node id would silently deselect it.

Speed: ``gguf.GGUFReader`` parses every string of the vocabulary in Python, which is
most of a load of the 4096-token file (~0.25 s). Most cases therefore run on a copy with
the vocabulary cut to 512 tokens (token_embd and output sliced to their first 512 rows,
every block byte as llama.cpp wrote it, same tensor order and alignment); a smaller set
runs on llama.cpp's file as written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

NIGHTLY = os.environ.get("DUALPATH_NIGHTLY") == "1"
SEED = 20240611
MEMORY_LIMIT_BYTES = 4 << 30
"""RLIMIT_AS of the child: python, numpy and gguf take ~0.5 GB of address space; a
load of the file itself needs far less than the rest."""
CASE_TIMEOUT_S = 60.0
"""A case that takes longer than this is reported as a hang (a load takes < 1 s)."""
STARTUP_TIMEOUT_S = 120.0
"""For the child's imports, before its first case (not counted in the case's time)."""
TRIMMED_VOCAB = 512
OK_OUTCOMES = ("loaded", "ModelLoadError")


# --- the K-quant files -----------------------------------------------------------------------

def copy_gguf(src: Path, dst: Path, *, num_tokens: int | None = None, arch: str | None = None,
              replace: dict[str, tuple[np.ndarray, object]] | None = None) -> Path:
    """Copy GGUF ``src`` to ``dst`` field by field and tensor by tensor, in the same order.

    ``num_tokens``: keep only the first tokens (the tokenizer arrays, ``<arch>.vocab_size``
    and the rows of token_embd / output, their blocks byte for byte). ``arch``: a new
    ``general.architecture`` (the other keys keep their names). ``replace``: tensor name ->
    (array, raw GGML type), as ``GGUFWriter.add_tensor`` takes them."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    old_arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch or old_arch)
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # GGUFWriter writes these itself
        vtype = f.types[0]
        sub_type = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = f.contents()
        if num_tokens and key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            value = value[:num_tokens]
        elif num_tokens and key == f"{old_arch}.vocab_size":
            value = num_tokens
        writer.add_key_value(key, value, vtype, sub_type)
    for t in reader.tensors:  # t.data: (rows, row_bytes) uint8 for block types, (rows, cols) for F32
        data, raw_dtype = (replace or {}).get(t.name, (t.data, t.tensor_type))
        if num_tokens and t.name in ("token_embd.weight", "output.weight"):
            data = data[:num_tokens]
        writer.add_tensor(t.name, np.ascontiguousarray(data), raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.fixture(scope="module")
def kquant_files(tmp_path_factory) -> dict[str, Path]:
    """``{"q4km": llama.cpp's Q4_K_M file, "q4km-v512": the same with 512 tokens}``."""
    pytest.importorskip("llama_cpp", reason="the K-quant file is made by llama-cpp-python's quantizer")
    from dualpath.models.synth import synth_gguf

    folder = tmp_path_factory.mktemp("fuzz_gguf")
    full = Path(synth_gguf(folder / "kquant-tiny-Q4_K_M.gguf", "kquant-tiny", "Q4_K_M"))
    trimmed = copy_gguf(full, folder / f"kquant-tiny-Q4_K_M-v{TRIMMED_VOCAB}.gguf", num_tokens=TRIMMED_VOCAB)
    return {"q4km": full, f"q4km-v{TRIMMED_VOCAB}": trimmed}


# --- where everything is in a GGUF file ------------------------------------------------------

@dataclass(frozen=True)
class Slot:
    """One field of the file that a case can overwrite."""

    name: str
    """e.g. ``kv[llama.block_count].value``, ``tensor[blk.0.attn_q.weight].dims[1]``."""
    offset: int
    size_bytes: int
    kind: str
    """Which values are worth writing there (see ``slot_edits``): ``version``, ``count``,
    ``length``, ``vtype``, ``ndims``, ``dim``, ``ttype``, ``toffset``, ``bytes``, or
    ``scalar:<GGUFValueType name>``."""
    value: int | float | None = None
    """The value in the file (None for byte strings)."""


@dataclass(frozen=True)
class Layout:
    """The byte layout of one GGUF file, read with ``gguf.GGUFReader``."""

    base: str
    size_bytes: int
    slots: tuple[Slot, ...]
    kv_fields: tuple[tuple[str, int, int], ...]
    """(key, first byte, end) of every key/value."""
    tensor_infos: tuple[tuple[str, int, int], ...]
    """(tensor name, first byte, end) of every tensor info."""
    tensor_data: tuple[tuple[str, int, int], ...]
    """(tensor name, first byte, number of bytes) of every tensor's data."""
    data_start: int
    """First byte of the tensor data (after the alignment padding)."""

    @property
    def kv_end(self) -> int:
        return self.kv_fields[-1][2]

    @property
    def ti_end(self) -> int:
        return self.tensor_infos[-1][2]

    def where(self, offset: int) -> str:
        """A name for the place of byte ``offset``: the innermost slot or region holding it."""
        inner = [s for s in self.slots if s.offset <= offset < s.offset + s.size_bytes]
        if inner:
            return min(inner, key=lambda s: s.size_bytes).name
        for what, table in (("kv", self.kv_fields), ("tensor", self.tensor_infos)):
            for name, start, end in table:
                if start <= offset < end:
                    return f"{what}[{name}]"
        if self.ti_end <= offset < self.data_start:
            return "padding"
        for name, start, nbytes in self.tensor_data:
            if start <= offset < start + nbytes:
                return f"data[{name}]+{offset - start}"
        return "end" if offset >= self.size_bytes else "?"


_SCALAR_FORMATS = {"UINT8": "<B", "INT8": "<b", "UINT16": "<H", "INT16": "<h", "UINT32": "<I", "INT32": "<i",
                   "FLOAT32": "<f", "UINT64": "<Q", "INT64": "<q", "FLOAT64": "<d", "BOOL": "<B"}


def read_layout(base: str, path: Path) -> Layout:
    import gguf

    vt = gguf.GGUFValueType
    reader = gguf.GGUFReader(str(path))
    slots = [Slot("header.version", 4, 4, "version", 3),
             Slot("header.tensor_count", 8, 8, "count", len(reader.tensors)),
             Slot("header.kv_count", 16, 8, "count", len(reader.fields) - 3)]

    def part_offsets(f) -> list[int]:
        out, at = [], f.offset
        for part in f.parts:
            out.append(at)
            at += int(part.nbytes)
        return out + [at]

    def scalar(name: str, at: int, part, vtype) -> Slot:
        return Slot(name, at, int(part.nbytes), f"scalar:{vtype.name}", part.tolist()[0])

    kv_fields = []
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        at = part_offsets(f)
        kv_fields.append((key, f.offset, at[-1]))
        p = f"kv[{key}]"
        slots += [Slot(p + ".key_len", at[0], 8, "length", len(key)), Slot(p + ".key", at[1], len(key), "bytes"),
                  Slot(p + ".type", at[2], 4, "vtype", int(f.types[0]))]
        if f.types[0] == vt.STRING:
            slots += [Slot(p + ".str_len", at[3], 8, "length", int(f.parts[3][0])),
                      Slot(p + ".str", at[4], int(f.parts[4].nbytes), "bytes")]
        elif f.types[0] == vt.ARRAY:
            item_type, num_items = f.types[-1], int(f.parts[4][0])
            slots += [Slot(p + ".item_type", at[3], 4, "vtype", int(item_type)),
                      Slot(p + ".arr_len", at[4], 8, "length", num_items)]
            for i in sorted({0, 1, num_items // 2, num_items - 1} & set(range(num_items))):
                if item_type == vt.STRING:  # (length, bytes) per item
                    j = 5 + 2 * i
                    slots += [Slot(f"{p}[{i}].str_len", at[j], 8, "length", int(f.parts[j][0])),
                              Slot(f"{p}[{i}].str", at[j + 1], int(f.parts[j + 1].nbytes), "bytes")]
                else:
                    slots.append(scalar(f"{p}[{i}]", at[5 + i], f.parts[5 + i], item_type))
        else:
            slots.append(scalar(p + ".value", at[3], f.parts[3], f.types[0]))

    tensor_infos, tensor_data = [], []
    for t in reader.tensors:
        f = t.field
        at = part_offsets(f)
        tensor_infos.append((t.name, f.offset, at[-1]))
        tensor_data.append((t.name, int(t.data_offset), int(t.n_bytes)))
        p = f"tensor[{t.name}]"
        slots += [Slot(p + ".name_len", at[0], 8, "length", len(t.name)),
                  Slot(p + ".name", at[1], int(f.parts[1].nbytes), "bytes"),
                  Slot(p + ".n_dims", at[2], 4, "ndims", int(f.parts[2][0]))]
        slots += [Slot(f"{p}.dims[{j}]", at[3] + 8 * j, 8, "dim", int(d)) for j, d in enumerate(f.parts[3])]
        slots += [Slot(p + ".type", at[4], 4, "ttype", int(t.tensor_type)),
                  Slot(p + ".offset", at[5], 8, "toffset", int(f.parts[5][0]))]
    return Layout(base=base, size_bytes=path.stat().st_size, slots=tuple(slots), kv_fields=tuple(kv_fields),
                  tensor_infos=tuple(tensor_infos), tensor_data=tuple(tensor_data),
                  data_start=int(reader.data_offset))


# --- the cases -------------------------------------------------------------------------------

@dataclass
class Case:
    """One mutated copy of a base file: ``puts`` (offset, bytes) applied, then cut to ``cut`` bytes."""

    name: str
    base: str
    kind: str
    """``control``, ``truncate``, ``slot``, ``overwrite`` (metadata) or ``data``."""
    puts: list[tuple[int, bytes]] = field(default_factory=list)
    cut: int | None = None
    selftest: str | None = None
    """Harness self-test only: ``segfault`` or ``huge_alloc`` instead of a load."""

    def to_json(self) -> dict:
        return {"name": self.name, "base": self.base, "cut": self.cut, "selftest": self.selftest,
                "puts": [[off, data.hex()] for off, data in self.puts]}


U64_MAX = 2**64 - 1


def _u32(v: int) -> bytes:
    return struct.pack("<I", v)


def _u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def _around(v: int) -> list[int]:
    return [0, 1, v - 1, v + 1, 2 * v, v // 2]


def _uniq(values, bits: int, original) -> list[int]:
    out = []
    for v in values:
        if 0 <= v < 2**bits and v != original and v not in out:
            out.append(v)
    return out


def slot_edits(slot: Slot, layout: Layout, rng: np.random.Generator) -> list[tuple[str, bytes, int]]:
    """(label, bytes, offset) edits worth trying on ``slot``, worst first."""
    import gguf

    v, kind = slot.value, slot.kind
    if kind == "version":
        return [(f"={x:#x}", _u32(x), slot.offset) for x in _uniq([0, 1, 2, 4, 0xFFFF, 0x03000000, 2**32 - 1], 32, v)]
    if kind in ("count", "length", "dim"):
        values = _around(v) + [v + 8, 255, 2**16, 2**31, 2**32, 2**32 + v, 2**40, 2**62, 2**63, U64_MAX]
        return [(f"={x:#x}", _u64(x), slot.offset) for x in _uniq(values, 64, v)]
    if kind == "toffset":
        values = [0, v + 1, v + 16, v + 32, v - 32, v + 2**20, layout.size_bytes, 2**32, 2**40, 2**63, U64_MAX]
        values += [off - layout.data_start for _, off, _ in layout.tensor_data]  # overlap another tensor
        return [(f"={x:#x}", _u64(x), slot.offset) for x in _uniq(values, 64, v)]
    if kind == "vtype":
        values = list(range(14)) + [255, 2**16, 2**31, 2**32 - 1]
        return [(f"={x}", _u32(x), slot.offset) for x in _uniq(values, 32, v)]
    if kind == "ndims":
        values = [0, 1, 2, 3, 4, 5, 8, 255, 2**16, 2**31, 2**32 - 1]
        return [(f"={x}", _u32(x), slot.offset) for x in _uniq(values, 32, v)]
    if kind == "ttype":  # every type gguf knows, codes it does not, and garbage
        values = [int(t) for t in gguf.GGMLQuantizationType] + [4, 5, 31, 42, 100, 255, 2**16, 2**31, 2**32 - 1]
        return [(f"={x}", _u32(x), slot.offset) for x in _uniq(values, 32, v)]
    if kind == "bytes":
        if slot.size_bytes == 0:
            return []
        last = slot.offset + slot.size_bytes - 1
        mid = slot.offset + slot.size_bytes // 2
        at = int(rng.integers(slot.offset, slot.offset + slot.size_bytes))
        return [("[0]=0x00", b"\x00", slot.offset), ("[mid]=0xff", b"\xff", mid), ("[-1]=0x80", b"\x80", last),
                (f"[{at - slot.offset}]=0xc3", b"\xc3", at), ("[0]='.'", b".", slot.offset)]
    if kind.startswith("scalar:"):
        vtype = kind.split(":", 1)[1]
        fmt = _SCALAR_FORMATS.get(vtype)
        if fmt is None:
            return []
        if vtype.startswith("FLOAT"):
            values = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, -1.0, 1e-45, 3.0e38]
            return [(f"={x!r}", struct.pack(fmt, x), slot.offset) for x in values if repr(x) != repr(v)]
        bits = struct.calcsize(fmt) * 8
        lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if fmt[1].islower() else (0, 2**bits - 1)  # "<b" signed
        values = [0, 1, 2, 3, 7, 255, lo, hi, v + 1, 2 * v, v - 1] if isinstance(v, int) else [0, 1, lo, hi]
        out = []
        for x in values:
            if lo <= x <= hi and x != v and x not in [o for o, _, _ in out]:
                out.append((x, struct.pack(fmt, x), slot.offset))
        return [(f"={x}", data, off) for x, data, off in out]
    raise AssertionError(f"no edits for slot kind {kind!r}")


def truncation_cases(layout: Layout, rng: np.random.Generator, num_random: int, stride: int = 0,
                     dense: bool = False) -> list[Case]:
    """Cuts at every byte of the header, at the start and at a random byte of every
    key/value and tensor info (``dense``: also 4 and 8 bytes in and the last byte), in the
    alignment padding, around the first data byte, in every tensor's data and at the last
    byte; with ``stride``, also every ``stride`` bytes through the key/values and tensor infos."""
    cuts = set(range(0, 25))
    for table in (layout.kv_fields, layout.tensor_infos):
        for _, start, end in table:
            cuts |= {start, int(rng.integers(start, end))} | ({start + 4, start + 8, end - 1} if dense else set())
    cuts |= {layout.kv_end, layout.ti_end, layout.data_start - 1, layout.data_start, layout.data_start + 1}
    padding = range(layout.ti_end, layout.data_start)
    cuts |= set(padding) if dense else set(padding[::8])  # inside the alignment padding
    for _, start, nbytes in layout.tensor_data:
        cuts |= {start + 1, start + nbytes // 2} | ({start + nbytes - 1} if dense else set())
    cuts |= {layout.size_bytes - 1, layout.size_bytes - 2}
    cuts |= {int(x) for x in rng.integers(1, layout.size_bytes, size=num_random)}
    if stride:
        cuts |= set(range(25, layout.data_start + stride, stride))
    cuts = sorted(c for c in cuts if 0 <= c < layout.size_bytes)
    return [Case(f"{layout.base} cut@{c} ({layout.where(c)})", layout.base, "truncate", cut=c) for c in cuts]


def slot_cases(layout: Layout, rng: np.random.Generator, per_slot: int | None) -> list[Case]:
    """Each slot set to ``per_slot`` of its values (seeded choice; None: every value).
    Header slots always get every value."""
    cases = []
    for slot in layout.slots:
        edits = slot_edits(slot, layout, rng)
        if per_slot is not None and not slot.name.startswith("header.") and len(edits) > per_slot:
            keep = sorted(rng.choice(len(edits), size=per_slot, replace=False))
            edits = [edits[i] for i in keep]
        cases += [Case(f"{layout.base} {slot.name}{label}", layout.base, "slot", puts=[(off, data)])
                  for label, data, off in edits]
    return cases


def _random_put(rng: np.random.Generator, base_bytes: bytes, start: int, end: int) -> tuple[int, bytes, str]:
    """A random edit inside [start, end): a bit flip, 1-8 random bytes, or a run of 0x00 / 0xff."""
    at = int(rng.integers(start, end))
    n = int(min(rng.integers(1, 9), end - at))
    mode = int(rng.integers(4))
    if mode == 0:
        bit = int(rng.integers(8))
        return at, bytes([base_bytes[at] ^ (1 << bit)]), f"^bit{bit}"
    if mode == 1:
        return at, rng.integers(0, 256, size=n, dtype=np.uint8).tobytes(), "random"
    return at, (b"\x00" if mode == 2 else b"\xff") * n, "zeros" if mode == 2 else "ones"


def overwrite_cases(layout: Layout, base_bytes: bytes, rng: np.random.Generator, num_cases: int,
                    regions: dict[str, tuple[int, int]], kind: str) -> list[Case]:
    """``num_cases`` cases of 1-4 random edits each, in the named regions (chosen uniformly)."""
    names = [n for n, (a, b) in regions.items() if b > a]
    cases = []
    for _ in range(num_cases):
        puts, labels = [], []
        for _ in range(int(rng.integers(1, 5))):
            region = names[int(rng.integers(len(names)))]
            at, data, how = _random_put(rng, base_bytes, *regions[region])
            puts.append((at, data))
            labels.append(f"{layout.where(at)}@{at}:{how}:{data.hex()}")
        cases.append(Case(f"{layout.base} {kind} " + " ".join(labels), layout.base, kind, puts=puts))
    return cases


def metadata_regions(layout: Layout) -> dict[str, tuple[int, int]]:
    return {"header": (0, 24), "kv": (24, layout.kv_end), "tensor_infos": (layout.kv_end, layout.ti_end),
            "padding": (layout.ti_end, layout.data_start)}


def data_regions(layout: Layout) -> dict[str, tuple[int, int]]:
    return {name: (start, start + nbytes) for name, start, nbytes in layout.tensor_data}


def fuzz_cases(layouts: dict[str, Layout], files: dict[str, Path], nightly: bool) -> list[Case]:
    """The deterministic case list: ~600 cases by default, > 10,000 for the nightly run.
    The trimmed file gets most; llama.cpp's file as written gets a few truncations,
    slots and overwrites (its loads are ~4x slower)."""
    cases = []
    for base, layout in layouts.items():
        rng = np.random.default_rng([SEED, int(nightly), sum(map(ord, base))])
        data = files[base].read_bytes()
        trimmed = base != "q4km"
        cases.append(Case(f"{base} unmodified", base, "control"))
        if nightly:
            cases += truncation_cases(layout, rng, num_random=500, stride=7 if trimmed else 101, dense=True)
            cases += slot_cases(layout, rng, per_slot=None if trimmed else 2)
            cases += overwrite_cases(layout, data, rng, 2500 if trimmed else 500, metadata_regions(layout), "overwrite")
            cases += overwrite_cases(layout, data, rng, 500 if trimmed else 100, data_regions(layout), "data")
        elif trimmed:
            cases += truncation_cases(layout, rng, num_random=10)
            cases += slot_cases(layout, rng, per_slot=1)
            cases += overwrite_cases(layout, data, rng, 60, metadata_regions(layout), "overwrite")
            cases += overwrite_cases(layout, data, rng, 25, data_regions(layout), "data")
        else:  # llama.cpp's file as written: ~40 cases of the kinds the trimmed copy might hide
            cuts = sorted({0, 4, 8, 16, 24, layout.kv_fields[-1][1], layout.tensor_infos[0][1], layout.ti_end,
                           layout.data_start - 1, layout.data_start, layout.size_bytes - 1}
                          | {int(x) for x in rng.integers(layout.kv_end, layout.size_bytes, size=8)})
            cases += [Case(f"{base} cut@{c} ({layout.where(c)})", base, "truncate", cut=c) for c in cuts]
            big = [s for s in layout.slots if s.name.startswith(("tensor[token_embd", "tensor[output.",
                                                                  "kv[tokenizer.ggml.tokens].arr_len"))]
            cases += slot_cases(dataclasses.replace(layout, slots=tuple(big)), rng, per_slot=1)
            cases += overwrite_cases(layout, data, rng, 8, metadata_regions(layout), "overwrite")
    return cases


# --- the child process -----------------------------------------------------------------------

def _worker_main(spec_path: str) -> None:
    """Child: load every case from ``start`` on; one JSON line per case on stdout."""
    import faulthandler
    import traceback

    faulthandler.enable()  # a crash prints the Python stack to stderr before the signal kills us
    spec = json.loads(Path(spec_path).read_text())
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if spec["memory_limit_bytes"]:
            resource.setrlimit(resource.RLIMIT_AS, (spec["memory_limit_bytes"], spec["memory_limit_bytes"]))
    except (ImportError, ValueError, OSError):  # no resource module (Windows): no cap
        pass
    from dualpath.errors import ModelLoadError
    from dualpath.models import load_model
    from dualpath.models.mmproj import load_projector

    load = load_projector if spec.get("loader") == "projector" else load_model

    bases = {name: Path(p).read_bytes() for name, p in spec["files"].items()}
    scratch = Path(spec["scratch"])
    print(json.dumps({"ready": True}), flush=True)  # the parent starts timing cases from here
    for i in range(spec["start"], len(spec["cases"])):
        case = spec["cases"][i]
        path = scratch / f"case{i}.gguf"  # a new file per case: an old mapping never sees new bytes
        data = bytearray(bases[case["base"]])
        for off, hexdata in case["puts"]:
            chunk = bytes.fromhex(hexdata)
            data[off:off + len(chunk)] = chunk
        if case["cut"] is not None:
            del data[case["cut"]:]
        path.write_bytes(bytes(data))
        del data
        t0 = time.perf_counter()
        try:
            if case["selftest"] == "segfault":
                import ctypes

                ctypes.string_at(0)
            elif case["selftest"] == "huge_alloc":
                np.empty(8 << 30, np.uint8)  # 8 GiB of address space: over the cap
            model = load(path)
            outcome, detail = "loaded", f"dim={model.config.dim} vocab={model.config.vocab_size}"
            del model
        except ModelLoadError as e:
            if str(path) in str(e) and e.path == str(path):
                outcome, detail = "ModelLoadError", e.problem
            else:
                outcome, detail = "error", f"ModelLoadError that does not name the file: {e}"
        except Exception as e:  # noqa: BLE001 - every other exception is the finding
            tb = traceback.format_exception(type(e), e, e.__traceback__, limit=-4)
            outcome, detail = "error", f"{type(e).__name__}: {e}\n" + "".join(tb)
        elapsed_ms = (time.perf_counter() - t0) * 1000
        path.unlink()  # load_gguf has let go of its mapping (and unlinking a mapped file is safe)
        print(json.dumps({"i": i, "outcome": outcome, "detail": detail[:2000], "ms": round(elapsed_ms, 1)}),
              flush=True)


@dataclass
class Result:
    case: Case
    outcome: str
    """``loaded``, ``ModelLoadError``, ``error`` (another exception), ``crash`` or ``hang``."""
    detail: str
    ms: float = 0.0


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def run_cases(cases: list[Case], files: dict[str, Path], scratch: Path, *, timeout_s: float = CASE_TIMEOUT_S,
              memory_limit_bytes: int = MEMORY_LIMIT_BYTES, loader: str = "model") -> tuple[list[Result], list[str]]:
    """Run ``cases`` in a child process, restarting it after a crash or a hang.
    Returns one Result per case, and the abnormal exits not pinned to a case. ``loader``:
    ``model`` (``load_model``) or ``projector`` (``load_projector``, an ``--mmproj`` file)."""
    scratch.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONFAULTHANDLER="1")
    results: list[Result | None] = [None] * len(cases)
    stray: list[str] = []
    start, launch = 0, 0
    while start < len(cases):
        spec_path = scratch / f"spec{launch}.json"
        spec_path.write_text(json.dumps({
            "files": {k: str(v) for k, v in files.items()}, "cases": [c.to_json() for c in cases],
            "start": start, "scratch": str(scratch), "memory_limit_bytes": memory_limit_bytes, "loader": loader}))
        stderr_path = scratch / f"stderr{launch}.txt"
        launch += 1
        with open(stderr_path, "wb") as stderr:
            proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--fuzz-worker", str(spec_path)],
                                    stdout=subprocess.PIPE, stderr=stderr, env=env, cwd=scratch)
            lines: queue.Queue = queue.Queue()  # the child's result lines, then None at its end
            threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
            i, hung, ready = start, False, False
            while True:
                try:
                    line = lines.get(timeout=timeout_s if ready else STARTUP_TIMEOUT_S)
                except queue.Empty:
                    proc.kill()
                    hung = True
                    break
                if line is None:
                    break
                r = json.loads(line)
                if r.get("ready"):
                    ready = True
                    continue
                results[r["i"]] = Result(cases[r["i"]], r["outcome"], r["detail"], r["ms"])
                i = r["i"] + 1
            rc = proc.wait()
            proc.stdout.close()
        tail = stderr_path.read_text(errors="replace")[-3000:]
        how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
        if i < len(cases):  # the child stopped during case i
            if hung:
                results[i] = Result(cases[i], "hang", f"no result after {timeout_s:.0f} s; child killed\n{tail}")
            else:
                results[i] = Result(cases[i], "crash", f"child died with {how} during this case\n{tail}")
            i += 1
        elif hung or rc != 0:
            stray.append(f"child {'hung' if hung else f'exited with {how}'} after its last case\n{tail}")
        start = i
    return results, stray


def run_cases_parallel(cases: list[Case], files: dict[str, Path], scratch: Path,
                       num_workers: int) -> tuple[list[Result], list[str]]:
    """``run_cases`` over ``num_workers`` interleaved shares of ``cases``, one child each."""
    from concurrent.futures import ThreadPoolExecutor

    shares = [cases[w::num_workers] for w in range(num_workers)]
    with ThreadPoolExecutor(num_workers) as pool:
        done = list(pool.map(lambda w: run_cases(shares[w], files, scratch / f"worker{w}"), range(num_workers)))
    results: list[Result] = [None] * len(cases)  # type: ignore[list-item]
    for w, (share_results, _) in enumerate(done):
        results[w::num_workers] = share_results
    return results, [s for _, stray in done for s in stray]


def summarize(results: list[Result]) -> str:
    by_kind = Counter((r.case.kind, r.outcome) for r in results)
    kinds = sorted({r.case.kind for r in results})
    lines = [f"{len(results)} cases: " + ", ".join(f"{o} {n}" for o, n in Counter(r.outcome for r in results).items())]
    for k in kinds:
        lines.append(f"  {k}: " + ", ".join(f"{o} {n}" for (kk, o), n in sorted(by_kind.items()) if kk == k))
    problems = Counter(r.detail.split(":")[0].split("(")[0][:60] for r in results if r.outcome == "ModelLoadError")
    lines.append("  ModelLoadError kinds: " + "; ".join(f"{p.strip()} x{n}" for p, n in problems.most_common(12)))
    slow = sorted(results, key=lambda r: -r.ms)[:3]
    lines.append("  slowest: " + "; ".join(f"{r.case.name} {r.ms:.0f} ms" for r in slow))
    return "\n".join(lines)


def failure_report(results: list[Result], stray: list[str], limit: int = 15) -> str:
    bad = [r for r in results if r.outcome not in OK_OUTCOMES]
    out = [f"{len(bad)} of {len(results)} cases neither loaded nor raised ModelLoadError:"]
    for r in bad[:limit]:
        edits = f"cut={r.case.cut} " if r.case.cut is not None else ""
        edits += " ".join(f"{off}:{data.hex()}" for off, data in r.case.puts)
        out.append(f"- [{r.outcome}] {r.case.name}\n    edits: {edits or '-'}\n    " + r.detail.replace("\n", "\n    "))
    out += [f"- {s}" for s in stray]
    return "\n".join(out)


def check_results(results: list[Result], stray: list[str]) -> None:
    print(summarize(results))
    control = [r for r in results if r.case.kind == "control"]
    assert control and all(r.outcome == "loaded" for r in control), [(r.case.name, r.detail) for r in control]
    assert not stray and all(r.outcome in OK_OUTCOMES for r in results), failure_report(results, stray)
    loaded_truncations = [r.case.name for r in results if r.case.kind == "truncate" and r.outcome == "loaded"]
    assert not loaded_truncations, f"a truncated file loaded: {loaded_truncations[:10]}"


# --- tests -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def layouts(kquant_files) -> dict[str, Layout]:
    return {base: read_layout(base, path) for base, path in kquant_files.items()}


def test_fuzz_case_list_is_deterministic_and_covers_every_part_of_the_file(kquant_files, layouts):
    cases = fuzz_cases(layouts, kquant_files, nightly=False)
    again = fuzz_cases(layouts, kquant_files, nightly=False)
    assert [c.to_json() for c in cases] == [c.to_json() for c in again]
    assert len(cases) >= 500
    trimmed = layouts[f"q4km-v{TRIMMED_VOCAB}"]
    names = " ".join(c.name for c in cases if c.base == trimmed.base)
    for part in ("header.version", "header.tensor_count", "header.kv_count", ".key_len", ".type=", ".str_len",
                 ".item_type", ".arr_len", ".n_dims", ".dims[0]", ".dims[1]", "].offset", "].type=",
                 "(padding)", "(data[", "(kv[", "(tensor[", "(header.", "data data["):
        assert part in names, f"no case touches {part!r}"
    cuts = {c.cut for c in cases if c.base == trimmed.base and c.kind == "truncate"}
    assert {trimmed.data_start - 1, trimmed.data_start, trimmed.size_bytes - 1} <= cuts
    assert set(range(25)) <= cuts
    assert trimmed.ti_end < trimmed.data_start, "expected alignment padding before the tensor data"


def test_mutated_and_truncated_kquant_file_loads_or_raises_model_load_error(kquant_files, layouts, tmp_path):
    cases = fuzz_cases(layouts, kquant_files, nightly=False)
    results, stray = run_cases(cases, kquant_files, tmp_path / "scratch")
    check_results(results, stray)


@pytest.mark.nightly
@pytest.mark.skipif(not NIGHTLY, reason="nightly fuzz run (>= 10,000 cases): set DUALPATH_NIGHTLY=1")
def test_nightly_mutated_and_truncated_kquant_file_loads_or_raises_model_load_error(kquant_files, layouts,
                                                                                   tmp_path):
    cases = fuzz_cases(layouts, kquant_files, nightly=True)
    assert len(cases) >= 10_000
    results, stray = run_cases_parallel(cases, kquant_files, tmp_path / "scratch", max(1, os.cpu_count() or 1))
    check_results(results, stray)


@pytest.fixture(scope="module")
def projector_files(tmp_path_factory) -> dict[str, Path]:
    """Projector files (``--mmproj``) of two kinds: LLaVA's (F16, as its legacy converter writes
    them) and SmolVLM's (Q8_0, as the current one does)."""
    from dualpath.models.synth_vision import synth_mmproj

    folder = tmp_path_factory.mktemp("fuzz_mmproj")
    return {"llava-f16": Path(synth_mmproj(folder / "llava.gguf", "llava-tiny", "F16")),
            "smolvlm-q8": Path(synth_mmproj(folder / "smolvlm.gguf", "smolvlm-tiny", "Q8_0"))}


def test_mutated_and_truncated_projector_file_loads_or_raises_model_load_error(projector_files, tmp_path):
    """The projector reader (``read_mmproj``, then ``load_projector``) under the same kinds of
    cases as the text loader: truncations, hurtful values in every field, overwrites."""
    cases = []
    for base, path in projector_files.items():
        layout = read_layout(base, path)
        rng = np.random.default_rng([SEED, sum(map(ord, base))])
        data = path.read_bytes()
        cases.append(Case(f"{base} unmodified", base, "control"))
        cases += truncation_cases(layout, rng, num_random=10)
        cases += slot_cases(layout, rng, per_slot=1)
        cases += overwrite_cases(layout, data, rng, 40, metadata_regions(layout), "overwrite")
        cases += overwrite_cases(layout, data, rng, 10, data_regions(layout), "data")
    assert len(cases) >= 300
    results, stray = run_cases(cases, projector_files, tmp_path / "scratch", loader="projector")
    check_results(results, stray)


def test_fuzz_harness_pins_a_crash_and_an_over_cap_allocation_to_their_cases(kquant_files, tmp_path):
    """The harness itself: a segfault in one case is reported for that case and the
    cases after it still run; the address-space cap turns an 8 GiB allocation into
    MemoryError (an ``error`` outcome), not a swapping machine."""
    base = f"q4km-v{TRIMMED_VOCAB}"
    cases = [Case("first", base, "control"), Case("segfault", base, "control", selftest="segfault"),
             Case("after the crash", base, "control"), Case("huge", base, "control", selftest="huge_alloc"),
             Case("last", base, "truncate", cut=100)]
    results, stray = run_cases(cases, kquant_files, tmp_path / "scratch")
    assert [r.outcome for r in results] == ["loaded", "crash", "loaded", "error", "ModelLoadError"], \
        [(r.case.name, r.outcome, r.detail[:300]) for r in results]
    assert "SIGSEGV" in results[1].detail and "Fatal Python error" in results[1].detail
    assert results[3].detail.startswith("MemoryError")
    assert not stray


# --- bugs the fuzzing found, fixed in models/gguf.py (these pin the fixes) ----------------------

def _edit(layout: Layout, name: str, *edits: tuple[str, bytes]) -> Case:
    """A case of ``layout``'s file with each (slot name, bytes) edit applied."""
    slots = {s.name: s for s in layout.slots}
    return Case(f"{layout.base} {name}", layout.base, "slot", puts=[(slots[n].offset, b) for n, b in edits])


_READER_LOOP = ("BUG (fuzz report): gguf.GGUFReader does not check an array's length against the file: items past "
                "the end are empty reads, so the loop never ends and allocates until MemoryError (~20 s per 2 GB; "
                "the MemoryError then escapes load_model)")
NEVER_ENDING = {  # name -> (edits, why it hangs today)
    "scores: 2^63 UINT8 items": (
        [("kv[tokenizer.ggml.scores].item_type", _u32(0)), ("kv[tokenizer.ggml.scores].arr_len", _u64(2**63))],
        _READER_LOOP),
    "general.architecture typed ARRAY": ([("kv[general.architecture].type", _u32(9))], _READER_LOOP + "; here the "
                                         "string's bytes become an array of arrays with garbage lengths"),
    "tokens: items typed ARRAY": ([("kv[tokenizer.ggml.tokens].item_type", _u32(9))], _READER_LOOP),
    "block_count 2^32 - 1": ([("kv[llama.block_count].value", _u32(2**32 - 1))],
                             "BUG (fuzz report): block_count is not bounded by the tensors in the file; "
                             "check_weights first lists the expected tensors of 4 billion layers"),
}


@pytest.fixture(scope="module")
def never_ending_results(kquant_files, layouts, tmp_path_factory) -> dict[str, Result]:
    """The NEVER_ENDING cases, run in one child series: 2 s per case (a load takes ~0.1 s),
    1 GiB of address space."""
    layout = layouts[f"q4km-v{TRIMMED_VOCAB}"]
    cases = [_edit(layout, name, *edits) for name, (edits, _) in NEVER_ENDING.items()]
    results, _ = run_cases(cases, kquant_files, tmp_path_factory.mktemp("never_ending"), timeout_s=2,
                           memory_limit_bytes=1 << 30)
    return {name: r for name, r in zip(NEVER_ENDING, results)}


@pytest.mark.parametrize("name", list(NEVER_ENDING))
def test_metadata_that_would_never_end_fails_at_once(never_ending_results, name):
    r = never_ending_results[name]
    assert r.outcome == "ModelLoadError", failure_report([r], [])


def test_array_length_past_the_end_fails_without_walking_the_file(kquant_files, layouts, tmp_path):
    case = _edit(layouts[f"q4km-v{TRIMMED_VOCAB}"], "scores: 2^63 items",
                 ("kv[tokenizer.ggml.scores].arr_len", _u64(2**63)))
    results, stray = run_cases([case], kquant_files, tmp_path / "scratch", timeout_s=30)
    assert results[0].outcome == "ModelLoadError", failure_report(results, stray)
    assert results[0].ms < 1000, f"took {results[0].ms:.0f} ms to reject a 2^63-item array"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN scales from the wrong bytes, an offset that wraps
@pytest.mark.parametrize("tensor, field, value", [
    ("blk.0.attn_k.weight", "offset", "+1"),            # misaligned
    ("blk.0.attn_k.weight", "offset", U64_MAX),         # data_start + 2^64 - 1 wraps to data_start - 1
    ("blk.0.attn_k.weight", "offset", "token_embd"),    # the same bytes as token_embd
    ("blk.0.attn_k.weight", "type", 13),                # Q4_K -> Q5_K: 176-byte blocks run into attn_norm
    ("blk.0.attn_norm.weight", "type", 1),              # F32 -> F16: half the bytes, the rest a gap
])
def test_tensor_data_not_where_the_tensor_infos_put_it_is_rejected(kquant_files, layouts, tmp_path, tensor, field,
                                                                    value):
    layout = layouts[f"q4km-v{TRIMMED_VOCAB}"]
    slot = next(s for s in layout.slots if s.name == f"tensor[{tensor}].{field}")
    if value == "+1":
        value = slot.value + 1
    elif value == "token_embd":
        value = next(off for name, off, _ in layout.tensor_data if name == "token_embd.weight") - layout.data_start
    data = bytearray(kquant_files[layout.base].read_bytes())
    data[slot.offset:slot.offset + slot.size_bytes] = (_u64 if field == "offset" else _u32)(value)
    path = tmp_path / "model.gguf"
    path.write_bytes(bytes(data))
    # A tensor of the wrong size shows up where the next one's data should start.
    names = [name for name, _, _ in layout.tensor_data]
    following = names[names.index(tensor) + 1]
    problem = _problem(path)
    assert f"'{tensor}'" in problem or f"'{following}'" in problem, problem


# --- well-formed K-quant files with what we do not support -----------------------------------

def _problem(path: Path) -> str:
    from dualpath.errors import ModelLoadError
    from dualpath.models import load_model

    with pytest.raises(ModelLoadError) as info:
        load_model(path)
    assert info.value.path == str(path) and str(path) in str(info.value)
    return info.value.problem


def test_unsupported_architecture_in_a_kquant_file_names_the_key_and_what_is_supported(kquant_files, tmp_path):
    """llama.cpp's Q4_K_M file, relabelled ``mamba`` (its keys keep their ``llama.`` names:
    the architecture is checked first). The list of architectures grows; llama stays."""
    path = copy_gguf(kquant_files[f"q4km-v{TRIMMED_VOCAB}"], tmp_path / "mamba.gguf", arch="mamba")
    problem = _problem(path)
    for phrase in ("'mamba'", "general.architecture", "supported", "llama"):
        assert phrase in problem, f"{phrase!r} not in {problem!r}"


def _unsupported_tensor(src: Path, dst: Path, type_name: str) -> Path:
    """``src`` with ``blk.0.attn_q.weight`` (256 x 256) replaced by random bytes of ``type_name``."""
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    byte_shape = gguf.quants.quant_shape_to_byte_shape((256, 256), qtype)
    data = np.random.default_rng(0).integers(0, 256, size=byte_shape, dtype=np.uint8)
    return copy_gguf(src, dst, replace={"blk.0.attn_q.weight": (data, qtype)})


@pytest.mark.parametrize("type_name", ["TQ1_0", "TQ2_0", "IQ1_M", "IQ3_XXS", "IQ4_XS"])
def test_unsupported_tensor_type_in_a_kquant_file_names_the_tensor_and_what_is_supported(kquant_files, tmp_path,
                                                                                         type_name):
    path = _unsupported_tensor(kquant_files[f"q4km-v{TRIMMED_VOCAB}"], tmp_path / "model.gguf", type_name)
    problem = _problem(path)
    # Q4_K and Q6_K: the types of the rest of this very file, which must stay supported.
    for phrase in ("'blk.0.attn_q.weight'", f"unsupported type {type_name}", "supported", "Q4_K", "Q6_K"):
        assert phrase in problem, f"{phrase!r} not in {problem!r}"


@pytest.mark.parametrize("code", [42, 100])
def test_unknown_tensor_type_code_names_the_tensor_and_what_is_supported(kquant_files, tmp_path, code):
    """A tensor of type code ``code``, unknown to gguf-py: written as TQ1_0, then its code patched."""
    path = _unsupported_tensor(kquant_files[f"q4km-v{TRIMMED_VOCAB}"], tmp_path / "model.gguf", "TQ1_0")
    slot = next(s for s in read_layout("x", path).slots if s.name == "tensor[blk.0.attn_q.weight].type")
    with open(path, "r+b") as f:
        f.seek(slot.offset)
        f.write(_u32(code))
    problem = _problem(path)
    for phrase in ("'blk.0.attn_q.weight'", str(code), "supported", "Q4_K"):
        assert phrase in problem, f"{phrase!r} not in {problem!r}"


if __name__ == "__main__" and sys.argv[1:2] == ["--fuzz-worker"]:
    _worker_main(sys.argv[2])
