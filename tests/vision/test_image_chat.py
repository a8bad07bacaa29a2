"""A conversation with images (``Chat.send(message, images)``): a turn with an image replies as
``LLM.chat`` does with the same messages; later turns keep the image and read its embeddings
and pages from the caches; ``save`` and ``load`` keep it as a ``data:`` URL; the timings say
how long the images took."""

import io
import json

import numpy as np
import pytest

import dualpath
from dualpath import LLM, SamplingParams, load_config
from dualpath.errors import ImageError
from dualpath.models.synth_vision import synth_mmproj, synth_text

pytest.importorskip("PIL", reason="the [vision] extra (Pillow) decodes images")

PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def _png(seed: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (50, 70, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("image-chat")
    return synth_text(d / "text.gguf", "smolvlm-tiny", "F16"), synth_mmproj(d / "mmproj.gguf", "smolvlm-tiny", "F16")


def _llm(files) -> LLM:
    text, mmproj = files
    return LLM(text, load_config(None, {"runtime.num_threads": 2, "runtime.chat_template": "chatml"}), mmproj=mmproj)


def test_a_turn_with_an_image_replies_as_llm_chat_and_the_next_reuses_it(files):
    llm = _llm(files)
    image = _png(1)
    chat = dualpath.Chat(llm, "You describe pictures.", PARAMS)
    reply = "".join(chat.send("What is this?", [image]))
    assert llm.images.stats["encoded"] == 1 and chat.last.image_ms > 0
    assert [p["type"] for p in chat.messages[0]["content"]] == ["image", "text"]  # no marker: the image first
    want = llm.chat([{"role": "system", "content": "You describe pictures."},
                     {"role": "user", "content": [{"type": "image", "image": image},
                                                  {"type": "text", "text": "What is this?"}]}], PARAMS)
    assert reply == want.text and want.timings.image_ms > 0
    assert llm.images.stats["encoded"] == 1  # LLM.chat found the embeddings in the cache
    first = chat.last
    "".join(chat.send("And its colours?"))  # text only: the image stays in the conversation
    assert llm.images.stats == {**llm.images.stats, "images": 3, "encoded": 1}
    assert chat.last.image_ms > 0 and chat.turns == 2
    # the first turn's prompt and reply come from the prefix cache, all but a partial last page
    assert chat.last.cached_tokens >= first.prompt_tokens + first.completion_tokens - llm.cache.page_tokens
    plain = llm.generate("What is this?", PARAMS)
    assert plain.timings.image_ms == 0.0


def test_images_go_at_the_markers_and_save_and_load_keep_them(files, tmp_path):
    llm = _llm(files)
    a, b = _png(2), _png(3)
    chat = dualpath.Chat(llm, None, PARAMS)
    "".join(chat.send("Left <__media__> and right <__media__>: which is darker?", [a, b]))
    parts = chat.messages[0]["content"]
    assert [p["type"] for p in parts] == ["text", "image", "text", "image", "text"]
    assert parts[1]["image"] is a and parts[3]["image"] is b
    chat.save(tmp_path / "conv.json")
    saved = json.loads((tmp_path / "conv.json").read_text())
    urls = [p["image_url"]["url"] for p in saved[0]["content"] if p["type"] == "image_url"]
    assert len(urls) == 2 and all(u.startswith("data:image/png;base64,") for u in urls)
    other = dualpath.Chat(llm, None, PARAMS)
    other.load(tmp_path / "conv.json")
    user = {"role": "user", "content": "Why?"}
    ids, _, embeds = other._prompt(other.messages + [user])
    want_ids, _, want_embeds = chat._prompt(chat.messages + [user])
    assert ids == want_ids and len(embeds) == len(want_embeds) > 0
    for (p, rows, mutual), (q, want_rows, want_mutual) in zip(embeds, want_embeds):
        assert p == q and mutual == want_mutual and np.array_equal(rows, want_rows)
    (tmp_path / "bad.json").write_text(json.dumps([{"role": "user", "content": [{"type": "image"}]}]))
    with pytest.raises(dualpath.DualPathError, match="image_url"):
        other.load(tmp_path / "bad.json")


def test_images_for_a_model_without_a_projector_are_refused(files):
    text, _ = files
    chat = dualpath.Chat(LLM(text, load_config(None, {"runtime.num_threads": 2, "runtime.chat_template": "chatml"})))
    with pytest.raises(ImageError, match="mmproj"):
        chat.send("What is this?", [_png(4)])
    assert chat.messages == []
