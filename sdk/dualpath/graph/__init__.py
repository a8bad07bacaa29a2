"""ONNX graphs of a model (builder.py) and their files in its cache entry (parts.py)."""

OPSET = 21
"""The graphs' ONNX opset: the newest that ONNX Runtime 1.20 (our oldest, Termux's) loads.
RMSNorm is ONNX Runtime's SimplifiedLayerNormalization, registered in the ONNX domain in
every version we support (newer versions run opset 23's RMSNormalization with the same
kernel)."""


def own_attention(spec) -> bool:
    """Whether an encoder's attention runs in our kernels (graph/encoder.py): their ISAs take a
    head_dim in whole 8s, every real encoder's (32, 64; SigLIP's 72)."""
    return spec.config.head_dim % 8 == 0
