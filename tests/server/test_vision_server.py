"""Images through the server (``serve --mmproj``): OpenAI ``image_url`` content parts with
``data:`` URLs reach the model as ``LLM.chat`` gives them; the same image again is served
from the embeddings' cache and the prefix cache; a remote URL or a broken image is a 400
that names it, and the server goes on."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("PIL", reason="the [vision] extra (Pillow) decodes images")

from test_server import CHAT_TEMPLATE, KEY, LiveServer  # noqa: E402

import dualpath  # noqa: E402
from dualpath.models.synth_vision import synth_mmproj, synth_text  # noqa: E402
from tests_shared import write_gguf_with_chat_template  # noqa: E402

MODEL = "smolvlm-tiny"


def _png(seed: int, size=(60, 90)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, size + (3,), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _messages(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "What is in this picture? "},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    d = tmp_path_factory.mktemp("vision-server")
    text = write_gguf_with_chat_template(synth_text(d / "raw.gguf", MODEL, "F16"), d / "text.gguf", CHAT_TEMPLATE)
    mmproj = synth_mmproj(d / "mmproj.gguf", MODEL, "F16")
    cfg = dualpath.load_config(None, {"runtime.max_context_tokens": 512, "server.api_key": KEY,
                                      "server.model_name": MODEL})
    srv = LiveServer(dualpath.LLM(text, cfg, mmproj=mmproj))
    yield srv
    srv.stop()


def test_an_image_url_part_reaches_the_model(live):
    messages = _messages(_url(_png(1)))
    ids, embeds = live.llm.chat_prompt(messages)
    assert len(embeds) == 5  # 2 x 2 tiles and the overview
    r = live.client().chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0)
    assert r.usage.prompt_tokens == len(ids)
    want = live.llm.chat(messages, dualpath.SamplingParams(max_tokens=6, temperature=0.0))
    assert r.choices[0].message.content == want.text
    encoded = live.llm.images.stats["encoded"]
    again = live.client().chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0)
    assert again.choices[0].message.content == want.text
    assert live.llm.images.stats["encoded"] == encoded  # its embeddings were kept
    assert again.usage.prompt_tokens_details.cached_tokens > embeds[0][0]  # its pages too, past the image's first row


@pytest.mark.parametrize("url, message", [
    ("https://example.com/cat.png", "http"),
    ("file:///etc/passwd", "file"),
    ("data:image/png;base64,!!!!", "base64"),
    (_url(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40), "PNG or JPEG"),
])
def test_a_bad_image_is_a_400_that_names_it(live, url, message):
    r = httpx.post(live.base + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": MODEL, "max_tokens": 2, "messages": _messages(url)})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_image" and message in err["message"], err
    ok = live.client().chat.completions.create(model=MODEL, max_tokens=2,
                                               messages=[{"role": "user", "content": "Still there?"}])
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_the_model_says_it_takes_images_and_a_photo_sized_body_is_taken(live):
    """/v1/models lists the vision modality (the chat page shows its Image button by it), and the
    automatic body limit takes a photo's data: URL, over the 1 MiB of a text-only server."""
    listed = httpx.get(live.base + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"][0]
    assert listed["modalities"] == {"vision": True}
    photo = _png(7, (700, 800))  # noise does not compress: about 1.7 MB, 2.2 MB as base64
    assert len(_url(photo)) > 2 << 20
    r = live.client().chat.completions.create(model=MODEL, messages=_messages(_url(photo)), max_tokens=2)
    assert r.choices[0].finish_reason in ("length", "stop") and r.usage.prompt_tokens > 20
    r = httpx.post(live.base + "/v1/chat/completions", content=b'{"messages": "' + b"x" * (33 << 20) + b'"}',
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert r.status_code == 413 and str(32 << 20) in r.json()["error"]["message"]
