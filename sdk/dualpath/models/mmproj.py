"""Projector files: llama.cpp's ``--mmproj`` GGUF (``general.architecture`` ``clip``), read and
checked before anything is built from them.

A vision model on the Hub is two files: the text model, and a projector file that holds the
image encoder (a ViT: a patch embedding, learned positions, pre-norm blocks, a final norm) and
the projector that maps the encoder's output into the text model's embedding space.
llama.cpp's converter writes the projector file (``convert_hf_to_gguf.py --mmproj``) with
``clip.*`` keys; they are read here as llama.cpp's ``tools/mtmd/clip.cpp`` reads them,
defaults included. ``PROJECTORS`` lists the kinds whose tensors are known here; any other
kind, and any tensor a known kind does not have, is refused by name rather than ignored, so
that nothing in a file is silently left out of the image's embeddings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import ModelLoadError
from .spec import ModelConfig, ModelSpec, Weight

PROJECTORS = {
    "idefics3": "SmolVLM and Idefics3: SigLIP, then a pixel shuffle by the scale factor and one matrix",
    "gemma3": "Gemma 3: SigLIP, then an average pool by the scale factor, an RMS norm and one matrix",
    "mlp": "LLaVA 1.5 and its kin (BakLLaVA, ShareGPT4V, llava-phi-3): CLIP with a class token and a "
           "norm before the layers, then two matrices with a GELU between",
}
"""Projector kinds (``clip.projector_type``) and what follows their encoder."""

DEFAULT_MERGE = {"idefics3": 1, "gemma3": 4, "mlp": 1}
"""``clip.vision.projector.scale_factor`` when the file has none, as llama.cpp defaults it."""

WEIGHT_TYPES = ("F32", "F16", "Q8_0")
"""Matrix types a projector file may hold."""


@dataclass(frozen=True)
class VisionSpec:
    """A projector file's encoder and projector, as checked by ``read_mmproj``."""

    path: str
    projector: str
    """A key of ``PROJECTORS``."""
    image_size: int
    """Side of the square the encoder sees, in pixels."""
    patch_size: int
    dim: int
    """The encoder's width (``clip.vision.embedding_length``)."""
    ffn_dim: int
    num_layers: int
    num_heads: int
    eps: float
    """LayerNorm epsilon of the encoder's norms (and the RMS norm of Gemma 3's projector)."""
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    merge: int
    """Patches merged per side: the pixel shuffle's or the pool's factor."""
    text_dim: int
    """Width of the embeddings it makes (``clip.vision.projection_dim``): the text model's."""
    activation: str
    """The MLP's: ``gelu`` (tanh approximation, as ggml's), ``silu`` or ``gelu_quick``."""
    longest_edge: int
    """Idefics3's preprocessing: an image is resized so that its longer side is this
    (``clip.vision.preproc_image_size``), then cut into tiles of ``image_size``; 0 when the
    file does not say (older conversions)."""
    tensors: dict[str, tuple[tuple[int, ...], str]] = field(repr=False)
    """name -> (shape, outermost dimension first, as NumPy's; GGML type name)."""
    class_token: bool = False
    """CLIP's class embedding (``v.class_embd``) goes before each square's patches, at
    position 0, and its row is dropped before the projector."""
    pre_norm: bool = False
    """A LayerNorm (``v.pre_ln``) before the first layer."""
    post_norm: bool = True
    """A LayerNorm (``v.post_ln``) after the last layer (LLaVA's converter leaves CLIP's out)."""
    patch_bias: bool = True
    projector_dim: int = 0
    """``mlp``: rows of the first matrix (``mm.0``)."""
    ffn_swapped: bool = False
    """The file names each layer's ``ffn_up`` ``ffn_down`` and the reverse (LLaVA's legacy
    converter, CLIP's fc1 and fc2); told from the shapes, as llama.cpp tells it."""

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.patches_per_side ** 2

    @property
    def rows_per_square(self) -> int:
        """Rows the encoder's layers see per square: its patches, and the class token's."""
        return self.num_patches + self.class_token

    @property
    def tokens_per_image(self) -> int:
        """Embeddings one ``image_size`` square becomes."""
        return (self.patches_per_side // self.merge) ** 2


def expected_tensors(spec: VisionSpec) -> dict[str, tuple[int, ...]]:
    """Every tensor ``spec``'s kind has, with its shape (outermost first); llama.cpp's names."""
    d, f, p = spec.dim, spec.ffn_dim, spec.patch_size
    out: dict[str, tuple[int, ...]] = {"v.patch_embd.weight": (d, 3, p, p)}
    if spec.patch_bias:
        out["v.patch_embd.bias"] = (d,)
    if spec.class_token:
        out["v.class_embd"] = (d,)
    out["v.position_embd.weight"] = (spec.rows_per_square, d)
    norms = [name for name, has in (("v.pre_ln", spec.pre_norm), ("v.post_ln", spec.post_norm)) if has]
    for name in norms:  # (in this order, synth_vision's random draws stay those of earlier versions)
        out[f"{name}.weight"], out[f"{name}.bias"] = (d,), (d,)
    up, down = ("ffn_down", "ffn_up") if spec.ffn_swapped else ("ffn_up", "ffn_down")
    for i in range(spec.num_layers):
        b = f"v.blk.{i}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out[f"{b}.{name}.weight"], out[f"{b}.{name}.bias"] = (d, d), (d,)
        for name in ("ln1", "ln2"):
            out[f"{b}.{name}.weight"], out[f"{b}.{name}.bias"] = (d,), (d,)
        out[f"{b}.{up}.weight"], out[f"{b}.{up}.bias"] = (f, d), (f,)
        out[f"{b}.{down}.weight"], out[f"{b}.{down}.bias"] = (d, f), (d,)
    if spec.projector == "idefics3":
        out["mm.model.fc.weight"] = (spec.text_dim, d * spec.merge ** 2)
    elif spec.projector == "gemma3":  # its matrix is stored (in, out)
        out["mm.soft_emb_norm.weight"] = (d,)
        out["mm.input_projection.weight"] = (d, spec.text_dim)
    else:  # mlp
        h = spec.projector_dim
        out.update({"mm.0.weight": (h, d), "mm.0.bias": (h,), "mm.2.weight": (spec.text_dim, h),
                    "mm.2.bias": (spec.text_dim,)})
    return out


def read_mmproj(path: str | os.PathLike) -> VisionSpec:
    """The checked ``VisionSpec`` of the projector file ``path``; a ``ModelLoadError`` naming
    the file and the key, tensor or value otherwise."""
    from .gguf import open_reader

    path = os.fspath(path)
    try:
        reader = open_reader(path)  # (the loader's reader: it refuses lengths that run past the file)
        fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    except ModelLoadError as e:
        raise ModelLoadError(path, f"not a readable GGUF projector file ({e.problem})") from e
    except (ValueError, MemoryError) as e:  # a value's bytes that do not decode (UTF-8)
        raise ModelLoadError(path, f"not a readable GGUF projector file ({type(e).__name__}: {e})") from e
    arch = fields.get("general.architecture")
    if arch != "clip":
        raise ModelLoadError(path, f"not a projector file: general.architecture is {arch!r}, a projector "
                             "file's is 'clip' (llama.cpp's convert_hf_to_gguf.py --mmproj writes them)")
    if not fields.get("clip.has_vision_encoder"):
        raise ModelLoadError(path, "no vision encoder (clip.has_vision_encoder): only image projector files "
                             "are supported")
    kind = fields.get("clip.vision.projector_type", fields.get("clip.projector_type"))
    if kind not in PROJECTORS:
        raise ModelLoadError(path, f"projector type {kind!r} is not supported; supported: "
                             f"{', '.join(sorted(PROJECTORS))}")

    def num(key: str, lo: float, hi: float, default=None, kind=int):
        value = fields.get(key, default)
        if value is None:
            raise ModelLoadError(path, f"{key} is missing")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)) \
                or not lo <= value <= hi:
            raise ModelLoadError(path, f"{key}={value!r} must be a{'n integer' if kind is int else ' number'} "
                                 f"from {lo:g} to {hi:g}")
        return kind(value)

    def triple(key: str, positive: bool) -> tuple[float, float, float]:
        value = fields.get(key)
        if not isinstance(value, list) or len(value) < 3 or not all(
                isinstance(v, (int, float)) and -1e3 < v < 1e3 and (v > 0 or not positive) for v in value[:3]):
            raise ModelLoadError(path, f"{key} must be 3 numbers{' above 0' if positive else ''}, got {value!r}")
        return float(value[0]), float(value[1]), float(value[2])

    image_size = num("clip.vision.image_size", 1, 8192)
    patch_size = num("clip.vision.patch_size", 1, image_size)
    if image_size % patch_size:
        raise ModelLoadError(path, f"clip.vision.image_size={image_size} is not a multiple of "
                             f"clip.vision.patch_size={patch_size}")
    dim = num("clip.vision.embedding_length", 1, 1 << 16)
    heads = num("clip.vision.attention.head_count", 1, dim)
    if dim % heads:
        raise ModelLoadError(path, f"clip.vision.embedding_length={dim} is not a multiple of "
                             f"clip.vision.attention.head_count={heads}")
    tensors = {t.name: (tuple(int(n) for n in reversed(t.shape.tolist())), t.tensor_type.name)
               for t in reader.tensors}
    if kind == "mlp":
        return _read_mlp(path, fields, tensors, num, triple, image_size, patch_size, dim, heads)
    merge = num("clip.vision.projector.scale_factor", 1, image_size // patch_size, DEFAULT_MERGE[kind])
    if (image_size // patch_size) % merge:
        raise ModelLoadError(path, f"{image_size // patch_size} patches a side do not merge by "
                             f"clip.vision.projector.scale_factor={merge}")
    gelu, silu = bool(fields.get("clip.use_gelu")), bool(fields.get("clip.use_silu"))
    if gelu and silu:
        raise ModelLoadError(path, "clip.use_gelu and clip.use_silu are both set")
    spec = VisionSpec(
        path=path, projector=kind, image_size=image_size, patch_size=patch_size, dim=dim,
        ffn_dim=num("clip.vision.feed_forward_length", 1, 1 << 18),
        num_layers=num("clip.vision.block_count", 1, 512), num_heads=heads,
        eps=num("clip.vision.attention.layer_norm_epsilon", 1e-30, 1.0, 1e-6, float),
        image_mean=triple("clip.vision.image_mean", False), image_std=triple("clip.vision.image_std", True),
        merge=merge, text_dim=num("clip.vision.projection_dim", 1, 1 << 17),
        activation="gelu" if gelu else "silu" if silu else "gelu_quick",
        longest_edge=num("clip.vision.preproc_image_size", image_size, 1 << 15)
        if "clip.vision.preproc_image_size" in fields else 0,
        tensors=tensors, ffn_swapped=_ffn_swapped(tensors, dim))
    _check_tensors(spec)
    return spec


def _ffn_swapped(tensors: dict, dim: int) -> bool:
    """Whether the layers' ``ffn_down`` is the matrix that widens (llama.cpp's test: its
    input is the encoder's width), as LLaVA's legacy converter names CLIP's fc1."""
    down = tensors.get("v.blk.0.ffn_down.weight")
    return down is not None and len(down[0]) == 2 and down[0][1] == dim and down[0][0] != dim


def _read_mlp(path: str, fields: dict, tensors: dict, num, triple, image_size: int, patch_size: int, dim: int,
              heads: int) -> VisionSpec:
    """``read_mmproj`` of a LLaVA-style file (``clip.projector_type`` ``mlp``), as llama.cpp's
    legacy converter (``convert_image_encoder_to_gguf.py``) writes it: CLIP's layers up to the
    one LLaVA reads (-2 in most: the converter drops the last), without CLIP's final norm, and
    the projector's width read from its matrices, not from ``clip.vision.projection_dim``
    (CLIP's own projection there)."""
    if "clip.vision.image_grid_pinpoints" in fields:
        raise ModelLoadError(path, "LLaVA 1.6's tiling of an image by clip.vision.image_grid_pinpoints "
                                   "(anyres) is not supported; LLaVA 1.5-style projectors (one square) are")
    layers = num("clip.vision.block_count", 1, 512)
    feature = fields.get("clip.vision.feature_layer")
    if feature is not None and (not isinstance(feature, list) or [int(v) for v in feature] != [layers]):
        raise ModelLoadError(path, f"clip.vision.feature_layer={feature!r}: only the output of the last stored "
                                   f"layer ({layers}) is supported, not a stack of several layers' outputs")

    def rows(name: str) -> int:
        shape = tensors.get(name, ((0,), ""))[0]
        return int(shape[0]) if len(shape) == 2 else 0

    spec = VisionSpec(
        path=path, projector="mlp", image_size=image_size, patch_size=patch_size, dim=dim,
        ffn_dim=num("clip.vision.feed_forward_length", 1, 1 << 18), num_layers=layers, num_heads=heads,
        eps=num("clip.vision.attention.layer_norm_epsilon", 1e-30, 1.0, 1e-5, float),
        image_mean=triple("clip.vision.image_mean", False), image_std=triple("clip.vision.image_std", True),
        merge=1, text_dim=rows("mm.2.weight"), activation="gelu" if fields.get("clip.use_gelu") else "gelu_quick",
        longest_edge=0, tensors=tensors, class_token="v.class_embd" in tensors, pre_norm="v.pre_ln.weight" in tensors,
        post_norm="v.post_ln.weight" in tensors, patch_bias="v.patch_embd.bias" in tensors,
        projector_dim=rows("mm.0.weight"), ffn_swapped=_ffn_swapped(tensors, dim))
    _check_tensors(spec)
    return spec


def _check_tensors(spec: VisionSpec) -> None:
    want = expected_tensors(spec)
    extra = sorted(set(spec.tensors) - set(want))
    if extra:
        shown = ", ".join(extra[:4]) + (f" and {len(extra) - 4} more" if len(extra) > 4 else "")
        raise ModelLoadError(spec.path, f"tensors a {spec.projector} projector does not use here: {shown}")
    for tensor, shape in want.items():
        if tensor not in spec.tensors:
            raise ModelLoadError(spec.path, f"tensor {tensor} is missing")
        got, ggml_type = spec.tensors[tensor]
        if got != shape:
            raise ModelLoadError(spec.path, f"tensor {tensor} has shape {got}, expected {shape} from the file's keys")
        if ggml_type not in WEIGHT_TYPES:
            raise ModelLoadError(spec.path, f"tensor {tensor} is {ggml_type}; projector weights may be "
                                 f"{', '.join(WEIGHT_TYPES)}")


def check_text_model(spec: VisionSpec, text_dim: int, text_name: str) -> None:
    """A ``ModelLoadError`` unless the projector's embeddings have the text model's width."""
    if spec.text_dim != text_dim:
        raise ModelLoadError(spec.path, f"the projector makes embeddings of {spec.text_dim} values, but {text_name} "
                                        f"takes {text_dim}: the projector file belongs to another text model")


VISION_FIELDS = ("projector", "image_size", "patch_size", "dim", "ffn_dim", "num_layers", "num_heads", "eps",
                 "image_mean", "image_std", "merge", "text_dim", "activation", "longest_edge", "class_token",
                 "pre_norm", "post_norm", "patch_bias", "projector_dim")
"""The ``VisionSpec`` fields a converted projector keeps in its metadata (``vision``)."""

_LAYER_NAMES = {"ln1": "attn_norm", "ln2": "ffn_norm", "attn_q": "attn_q", "attn_k": "attn_k", "attn_v": "attn_v",
                "attn_out": "attn_output", "ffn_up": "ffn_up", "ffn_down": "ffn_down"}
"""A block's tensors in the projector file -> the names an encoder's layer has here."""

_NAMES = {"v.position_embd": "position_embd", "v.post_ln": "output_norm", "v.pre_ln": "input_norm",
          "mm.model.fc": "mm.fc", "mm.soft_emb_norm": "mm.norm", "mm.input_projection": "mm.proj",
          "mm.0": "mm.0", "mm.2": "mm.2"}
_SWAPPED = {"ffn_up": "ffn_down", "ffn_down": "ffn_up"}


def weight_key(tensor: str, ffn_swapped: bool = False) -> str:
    """The ``ModelSpec`` key of the projector file's ``tensor``: ``v.blk.3.ln1.bias`` ->
    ``blk.3.attn_norm.bias``, so that the encoder's matrices are named as a text model's
    layers (whose Q8_0 ones our kernels multiply in place). ``ffn_swapped``: the file's
    ``ffn_up`` is the layer's ``ffn_down`` and the reverse (``VisionSpec.ffn_swapped``)."""
    if tensor == "v.class_embd":
        return "class_embd"
    stem, suffix = tensor.rsplit(".", 1)
    bias = ".bias" if suffix == "bias" else ""
    parts = stem.split(".")
    if parts[:2] == ["v", "blk"] and len(parts) == 4:
        name = _SWAPPED.get(parts[3], parts[3]) if ffn_swapped else parts[3]
        return f"blk.{parts[2]}.{_LAYER_NAMES[name]}{bias}"
    if stem == "v.patch_embd":
        return "patch_embd" + bias
    return _NAMES[stem] + bias


def vision_config(spec: VisionSpec) -> ModelConfig:
    """The encoder's hyper-parameters as a ``ModelConfig`` (``arch`` ``clip``): pre-norm
    LayerNorm blocks over learned positions, every patch of a square seeing every other."""
    act = {"gelu": "gelu_tanh", "silu": "silu", "gelu_quick": "gelu_quick"}[spec.activation]
    return ModelConfig(arch="clip", dim=spec.dim, hidden_dim=spec.ffn_dim, num_layers=spec.num_layers,
                       num_heads=spec.num_heads, num_kv_heads=spec.num_heads, head_dim=spec.dim // spec.num_heads,
                       vocab_size=1, context_length=spec.rows_per_square, rms_eps=spec.eps, causal=False,
                       norm_type="layer", learned_positions=True, ffn_gated=False, ffn_act=act)


def vision_spec(model: ModelSpec) -> VisionSpec:
    """The ``VisionSpec`` of a converted projector (``load_projector``), from its metadata."""
    v = dict(model.metadata["vision"])
    for name in ("image_mean", "image_std"):
        v[name] = tuple(v[name])
    return VisionSpec(path=model.path, tensors={}, **v)


def load_projector(path: str | os.PathLike, sink=None) -> ModelSpec:
    """The projector file ``path`` (checked by ``read_mmproj``) as a ``ModelSpec``: its weights
    under ``weight_key``'s names in the layouts the graphs read, the ``VisionSpec`` in its
    metadata. The patch embedding becomes a (dim, 3 * patch * patch) f32 matrix and Gemma 3's
    projection, stored (in, out), an (out, in) one. The projectors' matrices run after the
    encoder's layers, where our kernels' products do not: a Q8_0 one is f32 too (ONNX
    Runtime's 8-bit MatMulNBits needs 1.22; the matrices are small). ``sink``: as
    ``load_model``'s."""
    import gguf
    import numpy as np

    from ..tokenizer.spec import TokenizerSpec
    from .gguf import convert_tensor, open_reader

    spec = read_mmproj(path)
    path = spec.path
    reader = open_reader(path)
    weights: dict[str, Weight] = {}
    for t in reader.tensors:
        key = weight_key(t.name, spec.ffn_swapped)
        if key in ("patch_embd", "mm.proj") or (key in ("mm.fc", "mm.0", "mm.2") and t.tensor_type.name == "Q8_0"):
            shape = spec.tensors[t.name][0]
            data: np.ndarray = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(shape)
            if key == "patch_embd":
                data = data.reshape(spec.dim, -1)
            elif key == "mm.proj":  # stored (in, out)
                data = np.ascontiguousarray(data.T)
            w = Weight(key, "f32", data.shape, data, source_type=t.tensor_type.name)
        else:
            w = convert_tensor(path, t.name, t, key)
        if sink is not None:
            w = sink(w, int(t.n_bytes))
        weights[key] = w
    metadata = {"name": str(reader.fields["general.name"].contents()) if "general.name" in reader.fields else "",
                "file_type": "", "tensor_types": sorted({t.tensor_type.name for t in reader.tensors}),
                "vision": {name: getattr(spec, name) for name in VISION_FIELDS}}
    header_bytes = int(reader.data_offset)
    del reader
    return ModelSpec(path=path, format="gguf", config=vision_config(spec),
                     tokenizer=TokenizerSpec(model="none", tokens=(), add_bos=False, add_space_prefix=False),
                     weights=weights, metadata=metadata, header_bytes=header_bytes)
