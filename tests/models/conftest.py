"""Fixtures for the model-loader tests: the shared test models, and a GGUF rewriter.

The shared models (``stories260K.gguf``, ``stories260K.bin``, ``tok512.bin``) live in
``$DUALPATH_TEST_MODELS`` (default ``<repo>/../shared/models``); tests that need them skip
when they are absent. Derived or corrupted copies are written to pytest's ``tmp_path``,
never into the repository.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(scope="session")
def llama2c_path(model_file) -> Path:
    """``stories260K.bin``: llama2.c legacy checkpoint, the same weights as the GGUF."""
    return model_file("stories260K.bin")



# --- GGUF rewriting -----------------------------------------------------------------------

@dataclass
class GGUFContents:
    """Everything in a GGUF file, in memory, ready to be edited and written back.

    ``fields``: key -> (value, GGUFValueType, array sub-type or None), in file order, without
    the reader's ``GGUF.*`` pseudo-keys and without ``general.architecture`` (see ``arch``).
    ``tensors``: name -> (array, raw GGML type or None). F32/F16/F64 arrays are in numpy
    order ``(out, in)``; other types are uint8 bytes ``(out, row_bytes)`` with their raw type.
    """

    arch: str
    fields: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)

    def copy(self) -> GGUFContents:
        return GGUFContents(self.arch, copy.deepcopy(self.fields), dict(self.tensors))

    def set_tensor(self, name: str, array: np.ndarray, raw_dtype=None) -> None:
        self.tensors[name] = (np.ascontiguousarray(array), raw_dtype)


def read_gguf(path) -> GGUFContents:
    """Read ``path`` into a GGUFContents (tensor data copied out of the memory map)."""
    import gguf

    reader = gguf.GGUFReader(str(path), "r")
    contents = GGUFContents(arch=reader.fields["general.architecture"].contents())
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = f.types[0]
        sub_type = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        contents.fields[key] = (f.contents(), vtype, sub_type)
    native = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F64)
    for t in reader.tensors:
        raw_dtype = None if t.tensor_type in native else t.tensor_type
        contents.set_tensor(t.name, np.array(t.data), raw_dtype)
    return contents


def write_gguf(path, contents: GGUFContents) -> Path:
    """Write ``contents`` as a GGUF v3 file with ``gguf.GGUFWriter``; returns the path."""
    import gguf

    path = Path(path)
    w = gguf.GGUFWriter(str(path), contents.arch)
    for key, (value, vtype, sub_type) in contents.fields.items():
        w.add_key_value(key, value, vtype, sub_type)
    for name, (array, raw_dtype) in contents.tensors.items():
        w.add_tensor(name, array, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="session")
def stories_gguf(gguf_path) -> GGUFContents:
    """The contents of stories260K.gguf; call ``.copy()`` before editing."""
    return read_gguf(gguf_path)


@pytest.fixture
def save_gguf(tmp_path):
    """``save_gguf(contents, name="model.gguf")`` writes ``contents`` into ``tmp_path``."""

    def save(contents: GGUFContents, name: str = "model.gguf") -> Path:
        return write_gguf(tmp_path / name, contents)

    return save
