"""A prompt with an image, through the text model: the image's rows enter the step as
embeddings in place of their tokens' (``SeqStep.embeds``), and the text model then predicts
what llama.cpp's does after the same prompt (``mtmd``: its text chunks, our squares' embeddings
where its image chunks are), teacher-forced along llama.cpp's greedy tokens."""

import numpy as np
import pytest

import vision_reference
from dualpath import LLM, load_config
from dualpath.executor.vision import VisionEncoder
from dualpath.models.store import ModelStore
from dualpath.models.synth_vision import synth_mmproj, synth_text

pytest.importorskip("PIL", reason="the [vision] extra (Pillow) resizes images")

STEPS = 32
PROMPT = "Describe this picture: <image> What is in it?"


@pytest.mark.parametrize("weight_type", ["F32", "F16"])
def test_the_next_tokens_after_an_image_are_llama_cpps(tmp_path, weight_type):
    from dualpath.vision.preprocess import squares

    preset = "smolvlm-tiny"
    mmproj = synth_mmproj(tmp_path / "mmproj.gguf", preset, weight_type)
    text = synth_text(tmp_path / "text.gguf", preset, weight_type)
    image = np.random.default_rng(3).integers(0, 256, (70, 150, 3), dtype=np.uint8)
    layout, theirs, their_tokens = vision_reference.mtmd_greedy(text, mmproj, image, PROMPT, STEPS)

    encoder = VisionEncoder(ModelStore(tmp_path / "store").load(mmproj, projector=True), 2)
    cut = encoder.encode(squares(image, encoder.spec).images)
    assert [len(x) for kind, x in layout if kind == "image"] == [len(e) for e in cut]  # 2 tiles and the overview
    ids: list[int] = []
    embeds = []
    for kind, x in layout:
        if kind == "image":
            embeds.append((len(ids), cut[len(embeds)]))
            ids += [0] * len(x)
        else:
            ids += x
    llm = LLM(text, load_config(None, {"runtime.num_threads": 2, "runtime.quantized_matmul_accuracy": 0}))
    ours = llm.runner.forward(ids + their_tokens[:-1], all_logits=True, embeds=tuple(embeds))[len(ids) - 1:].copy()
    assert ours.shape == theirs.shape
    top2 = np.sort(theirs, axis=1)[:, -2:]
    tie = (top2[:, 1] - top2[:, 0]) < 2 * np.abs(ours - theirs).max(axis=1)
    agree = ours.argmax(axis=1) == np.array(their_tokens)
    assert agree.sum() >= 30 and (agree | tie).all(), (agree, tie)
    scale = float(np.abs(theirs).max())
    assert float(np.abs(ours - theirs).max()) <= 1e-2 * scale

    # the same prompt with the image's rows left as their placeholder tokens' is another text
    llm.runner.reset()
    plain = llm.runner.forward(ids)[0].copy()
    llm.runner.reset()
    again = llm.runner.forward(ids, embeds=tuple(embeds))[0]
    assert np.abs(again - theirs[0]).max() <= 1e-2 * scale < np.abs(plain - theirs[0]).max()
