"""Image bytes to pixels: PNG and JPEG, decoded by Pillow (the ``[vision]`` extra), and the
``data:`` URLs OpenAI's ``image_url`` content parts carry them in.

Whatever a client sends is checked before it costs anything: the bytes' size, the format
(read from the bytes, not from a name or a media type), and the pixel count from the
header, before a single pixel is decoded (a small file can claim a huge image). A broken
or truncated file, any other format and a remote URL are an ``ImageError`` that names the
problem; an edge box never fetches a URL for a client.

Pixels are (height, width, 3) uint8 RGB, as llama.cpp's ``mtmd`` helper loads them (stb_image
with three channels): grey is repeated, a palette is looked up, alpha is dropped, and of an
animation the first frame is taken.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import struct
import warnings

import numpy as np

from ..errors import ImageError

FORMATS = ("PNG", "JPEG")
"""What Pillow must find in the bytes."""
MAX_IMAGE_BYTES = 20 << 20
"""Largest encoded image taken, by default."""
MAX_IMAGE_PIXELS = 40_000_000
"""Largest image (width x height) decoded, by default: three bytes a pixel once decoded."""

_DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)(?P<b64>;base64)?,",
                       re.ASCII)


def decode_image(data: bytes, max_bytes: int = MAX_IMAGE_BYTES, max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
    """The pixels (height, width, 3) uint8 of PNG or JPEG ``data``."""
    if not data:
        raise ImageError("the image is empty")
    if len(data) > max_bytes:
        raise ImageError(f"the image is {len(data)} bytes; at most {max_bytes} are taken")
    try:
        from PIL import Image
    except ImportError as e:
        raise ImageError("images need Pillow: pip install 'dualpath[vision]'") from e
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limit is below
            with Image.open(io.BytesIO(data), formats=list(FORMATS)) as im:
                width, height = im.size
                if width < 1 or height < 1 or width * height > max_pixels:
                    raise ImageError(f"the image is {width} x {height} pixels; at most {max_pixels} are taken")
                return np.asarray(im.convert("RGB"), dtype=np.uint8).copy()
    except ImageError:
        raise
    except Image.UnidentifiedImageError as e:
        raise ImageError(f"the image is not {' or '.join(FORMATS)} (or is damaged past reading its header)") from e
    except Image.DecompressionBombError as e:
        raise ImageError(f"the image claims too many pixels ({e})") from e
    except (OSError, ValueError, SyntaxError, EOFError, MemoryError, struct.error) as e:
        raise ImageError(f"the image cannot be decoded: {e}") from e


def image_url_bytes(url: str, max_bytes: int = MAX_IMAGE_BYTES) -> bytes:
    """The bytes of an ``image_url``: a ``data:`` URL (base64 or percent-encoded); any other
    scheme is refused, remote ones by name."""
    if not isinstance(url, str) or not url:
        raise ImageError("image_url.url must be a non-empty string")
    m = _DATA_URL.match(url)
    if m is None:
        scheme = url.split(":", 1)[0].lower() if ":" in url[:16] else ""
        if scheme in ("http", "https", "ftp", "file"):
            raise ImageError(f"{scheme}: image URLs are not fetched: send the image itself as a data: URL "
                             "(data:image/png;base64,...)")
        raise ImageError("image_url.url must be a data: URL (data:image/png;base64,...)")
    media = (m["type"] or "").lower()
    if media and not media.startswith("image/"):
        raise ImageError(f"a data: URL of {media} is not an image")
    body = url[m.end():]
    if m["b64"]:
        if len(body) > (max_bytes + 2) // 3 * 4 + 4:
            raise ImageError(f"the image is over {max_bytes} bytes")
        try:
            return base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ImageError(f"the data: URL's base64 is malformed ({e})") from e
    from urllib.parse import unquote_to_bytes

    return unquote_to_bytes(body)
