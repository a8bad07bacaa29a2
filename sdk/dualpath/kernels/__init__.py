"""The compiled kernels, the only Python entry to them.

Two extension modules sit underneath (built by setup.py from cython_ext/):

* ``_kvarena``: the KV arena (one allocation cut into blocks), the per-step
  attention stepper, the classifier's product (``QMatmul``), a layer's products over GGML
  blocks (``LMatmul``, ``lform_from_ggml``), an encoder's attention (``EncAttention``), the
  kernels' thread pool,
  and the run-time ISA dispatch;
  with the names of the C tables, the one list of each: ``KV_DTYPES`` (and
  ``KV_DTYPE_DOCS``, ``KV_HEAD_DIM_MULTIPLE``), ``KERNEL_ISAS`` and ``KERNEL_FEATURES`` (the ISAs that
  DUALPATH_DISABLE_CPU_FEATURES may name; an unknown name there fails the import
  with a ValueError that lists them);
* ``_kernels``: the token-embedding gather (f32, f16, Q8_0, Q4_0 tables), rows of a
  table read from its file (``read_rows``), and the conversion of GGML quantized blocks to MatMulNBits
  (``repack_ggml``, ``GGML_TYPES``).

Every other module imports these names from here, never from the extension
modules, so the compiled surface is one list (``__all__``) and a test checks it.
The NumPy oracle the kernels are tested against lives with the tests
(tests/kernels/attention_reference.py).
"""

from .._kernels import GGML_TYPES, embed, ggml_layout, read_rows, repack_ggml
from .._kvarena import (
                        KERNEL_FEATURES,
                        KERNEL_ISAS,
                        KV_DTYPE_DOCS,
                        KV_DTYPES,
                        KV_HEAD_DIM_MULTIPLE,
                        LFORM_TYPES,
                        ArenaStepper,
                        EncAttention,
                        KVArena,
                        LMatmul,
                        QMatmul,
                        ThreadPool,
                        available_kernels,
                        cpu_features,
                        default_kernel,
                        kv_tile_bytes,
                        lform_bytes,
                        lform_from_ggml,
                        lform_rows,
)

__all__ = ["GGML_TYPES", "KERNEL_FEATURES", "KERNEL_ISAS", "KV_DTYPE_DOCS", "KV_DTYPES", "KV_HEAD_DIM_MULTIPLE",
           "LFORM_TYPES", "ArenaStepper", "EncAttention", "KVArena", "LMatmul", "QMatmul", "ThreadPool",
           "available_kernels", "cpu_features", "default_kernel", "embed", "ggml_layout", "kv_tile_bytes",
           "lform_bytes", "lform_from_ggml", "lform_rows", "read_rows", "repack_ggml"]
