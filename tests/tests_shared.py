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


def write_gguf_with_chat_template(src: Path, dst: Path, template: str) -> Path:
    """Copy GGUF ``src`` to ``dst`` field by field and tensor by tensor, adding ``tokenizer.chat_template``."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # GGUFWriter writes these itself
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub_type)
    writer.add_string("tokenizer.chat_template", template)
    for t in reader.tensors:  # t.data is (ne1, ne0) row-major, as GGUFWriter wants it
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
