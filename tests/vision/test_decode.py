"""Image bytes and ``data:`` URLs to pixels (``vision.decode``): PNG and JPEG as llama.cpp's
``mtmd`` helper loads them (RGB; alpha dropped, grey repeated), and everything else (other
formats, broken or truncated files, a header claiming a huge image, remote URLs, bad base64)
refused with an ``ImageError`` that names the problem. Mutated files never raise anything else."""

import base64
import io
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dualpath.errors import ImageError
from dualpath.vision.decode import decode_image, image_url_bytes

Image = pytest.importorskip("PIL.Image", reason="the [vision] extra (Pillow) decodes images")

RGB = np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)


def _encode(array: np.ndarray, fmt: str, mode: str | None = None) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array, mode).save(out, fmt)
    return out.getvalue()


PNG, JPEG = _encode(RGB, "PNG"), _encode(RGB, "JPEG")


def test_png_decodes_to_its_exact_pixels():
    got = decode_image(PNG)
    assert got.dtype == np.uint8 and np.array_equal(got, RGB)


def test_jpeg_decodes_to_nearly_its_pixels():
    y, x = np.mgrid[0:30, 0:40]
    smooth = np.stack([x * 6, y * 8, x * 3 + y * 4], axis=2).astype(np.uint8)  # JPEG keeps a smooth picture
    got = decode_image(_encode(smooth, "JPEG"))
    assert got.shape == smooth.shape and np.abs(got.astype(int) - smooth).mean() < 4


def test_alpha_is_dropped_and_grey_is_repeated():
    rgba = np.concatenate([RGB, np.full((30, 40, 1), 7, np.uint8)], axis=2)
    assert np.array_equal(decode_image(_encode(rgba, "PNG")), RGB)
    grey = RGB[..., 0]
    assert np.array_equal(decode_image(_encode(grey, "PNG")), np.repeat(grey[..., None], 3, axis=2))


@pytest.mark.parametrize("data, message", [
    (b"", "the image is empty"),
    (b"not an image at all", "is not PNG or JPEG"),
    (_encode(RGB, "GIF"), "is not PNG or JPEG"),
    (_encode(RGB, "BMP"), "is not PNG or JPEG"),
    (PNG[: len(PNG) // 2], "cannot be decoded"),
])
def test_what_is_not_a_whole_png_or_jpeg_is_refused(data, message):
    with pytest.raises(ImageError, match=message):
        decode_image(data)


def _png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` (CRC fixed) over a tiny image's data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return PNG[:8] + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk)) + PNG[33:]


def test_a_header_claiming_a_huge_image_is_refused_before_decoding():
    with pytest.raises(ImageError, match="8000 x 6000 pixels; at most 40000000 are taken"):
        decode_image(_png_claiming(8000, 6000))
    with pytest.raises(ImageError, match="too many pixels"):  # Pillow's own guard, further up
        decode_image(_png_claiming(100_000, 100_000))
    with pytest.raises(ImageError, match="40 x 30 pixels; at most 1000"):
        decode_image(PNG, max_pixels=1000)


def test_too_many_bytes_are_refused():
    with pytest.raises(ImageError, match="at most 100 are taken"):
        decode_image(PNG, max_bytes=100)


def test_a_data_url_gives_its_bytes():
    b64 = base64.b64encode(PNG).decode()
    assert image_url_bytes(f"data:image/png;base64,{b64}") == PNG
    assert image_url_bytes(f"data:;base64,{b64}") == PNG  # no media type: the bytes decide
    assert np.array_equal(decode_image(image_url_bytes(f"data:image/jpeg;base64,{b64}")), RGB)


@pytest.mark.parametrize("url, message", [
    ("https://example.com/cat.png", "https: image URLs are not fetched"),
    ("http://127.0.0.1/x.png", "http: image URLs are not fetched"),
    ("file:///etc/passwd", "file: image URLs are not fetched"),
    ("data:text/plain;base64,aGk=", "a data: URL of text/plain is not an image"),
    ("data:image/png;base64,@@@@", "base64 is malformed"),
    ("cat.png", "must be a data: URL"),
    ("", "must be a non-empty string"),
])
def test_other_urls_are_refused_by_name(url, message):
    with pytest.raises(ImageError, match=message):
        image_url_bytes(url)


def test_an_oversized_data_url_is_refused_before_decoding_it():
    with pytest.raises(ImageError, match="over 100 bytes"):
        image_url_bytes("data:image/png;base64," + "A" * 400, max_bytes=100)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([PNG, JPEG]), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=8),
       st.integers(0, 10_000))
def test_mutated_files_decode_or_are_refused_never_worse(src, flips, cut):
    data = bytearray(src[: max(1, len(src) - cut)] if cut % 3 == 0 else src)
    for pos, value in flips:
        if data:
            data[pos % len(data)] = value
    try:
        got = decode_image(bytes(data))
    except ImageError:
        return
    assert got.ndim == 3 and got.shape[2] == 3 and got.dtype == np.uint8
