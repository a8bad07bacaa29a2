"""Helpers shared by the tests that compare DualPath with llama.cpp on the same file."""

import numpy as np


def dequantized_copy(src: str, dst: str, drop: tuple[str, ...] = ()) -> str:
    """``src`` with every tensor dequantized to F32 by gguf-py (metadata unchanged but the
    file type), without the tensors named in ``drop``."""
    import gguf

    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        sub_type = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), f.types[0], sub_type)
    w.add_file_type(0)
    for t in reader.tensors:
        if t.name in drop:
            continue
        w.add_tensor(t.name, gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
