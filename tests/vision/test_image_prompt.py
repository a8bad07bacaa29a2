"""A prompt with an image, through the text model: the image's rows enter the step as
embeddings in place of their tokens' (``SeqStep.embeds``), and the text model then predicts
what llama.cpp's does after the same prompt (``mtmd``: its text chunks, our squares' embeddings
where its image chunks are), teacher-forced along llama.cpp's greedy tokens."""

import numpy as np
import pytest

import vision_reference
from dualpath import LLM, load_config
from dualpath.executor.vision import VisionEncoder
from dualpath.models.mmproj import read_mmproj
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


def _their_ids(layout) -> tuple[list, list]:
    """mtmd's text ids per text chunk, and its image chunks' lengths."""
    return [x for k, x in layout if k == "text"], [len(x) for k, x in layout if k == "image"]


@pytest.mark.parametrize("preset", ["smolvlm-tiny", "gemma3-vision-tiny", "llava-tiny"])
def test_an_image_prompt_is_laid_out_as_mtmd_lays_it_out(tmp_path, preset):
    """``LLM(text, mmproj=...)``: the prompt's text pieces and markers become mtmd's token
    ids, chunk by chunk, and each square's rows stand where mtmd's image chunks are (LLaVA's
    rows are the reference's: llama.cpp computes them otherwise, tests/vision/test_encoder.py)."""
    from dualpath.vision.prompt import MARKER

    mmproj = synth_mmproj(tmp_path / "mmproj.gguf", preset, "F32")
    text = synth_text(tmp_path / "text.gguf", preset, "F32")
    image = np.random.default_rng(5).integers(0, 256, (90, 150, 3), dtype=np.uint8)
    layout, _, _ = vision_reference.mtmd_greedy(text, mmproj, image, PROMPT, 1)
    llm = LLM(text, load_config(None, {"runtime.num_threads": 2}), mmproj=mmproj)
    ids, embeds = llm.images.prompt(PROMPT.replace("<image>", MARKER), [image])
    texts, lengths = _their_ids(layout)
    assert [len(rows) for _, rows, _ in embeds] == lengths
    assert all(mutual == (preset == "gemma3-vision-tiny") for _, _, mutual in embeds)
    cuts = [0] + [c for pos, rows, _ in embeds for c in (pos, pos + len(rows))] + [len(ids)]
    assert [ids[a:b] for a, b in zip(cuts[::2], cuts[1::2])] == texts
    for (_, rows, _), (_, theirs) in zip(embeds, [c for c in layout if c[0] == "image"]):
        if preset == "llava-tiny":
            from dualpath.vision.preprocess import squares

            spec = read_mmproj(mmproj)
            theirs = vision_reference.encode(spec, vision_reference.load_weights(spec), squares(image, spec).images[0])
        assert np.abs(rows - theirs).max() <= 1e-3 * np.abs(theirs).max()


@pytest.mark.parametrize("preset", ["smolvlm-tiny", "gemma3-vision-tiny"])
def test_generate_with_an_image_gives_llama_cpps_tokens(tmp_path, preset):
    """Greedy text after an image: llama.cpp's tokens. SmolVLM's image rows attend causally;
    Gemma 3's attend to each other (``Request.mutual``), as llama.cpp decodes them."""
    from dualpath import SamplingParams

    mmproj = synth_mmproj(tmp_path / "mmproj.gguf", preset, "F32")
    text = synth_text(tmp_path / "text.gguf", preset, "F32")
    image = np.random.default_rng(6).integers(0, 256, (120, 100, 3), dtype=np.uint8)
    # The image first: Gemma 3's tiny text model has a sliding window of 10 tokens, and an image
    # row's window reaches as far back as llama.cpp's only within it (Request.mutual).
    first = "<image> Describe this picture. What is in it?"
    _, theirs, their_tokens = vision_reference.mtmd_greedy(text, mmproj, image, first, 8)
    config = load_config(None, {"runtime.num_threads": 2, "runtime.quantized_matmul_accuracy": 0})
    llm = LLM(text, config, mmproj=mmproj)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=1)
    prompt = first.replace("<image>", "<__media__>")
    out = llm.generate(prompt, params, images=[image])
    top2 = np.sort(theirs, axis=1)[:, -2:]
    first_tie = next((i for i, (a, b) in enumerate(top2) if b - a < 1e-3 * abs(b)), len(their_tokens))
    assert list(out.token_ids[:first_tie]) == their_tokens[:first_tie]
    want = theirs[0] - np.log(np.exp(theirs[0] - theirs[0].max()).sum()) - theirs[0].max()  # log-softmax
    assert abs(out.logprobs[0][1] - want[their_tokens[0]]) < 1e-3
    if preset == "gemma3-vision-tiny":  # its image rows attending causally: another text
        from dualpath.llm import Generation

        fresh = LLM(text, config, mmproj=mmproj)  # (not the first's pages from the prefix cache)
        ids, embeds = fresh.images.prompt(prompt, [image])
        causal = Generation(fresh.engine, ids, params, tuple((p, r) for p, r, _ in embeds))
        for _ in causal:
            pass
        assert abs(causal.completion.logprobs[0][1] - want[their_tokens[0]]) > 1e-2
    assert llm.images.stats == {"images": 1, "encoded": 1, "encode_s": llm.images.stats["encode_s"], "from_disk": 0}
    again = llm.generate(prompt, params, images=[image])
    assert again.token_ids == out.token_ids and llm.images.stats["encoded"] == 1  # the cache's embeddings
    assert again.usage.cached_prompt_tokens > 0  # and the prefix cache's pages, image rows included


def test_llava_generates_after_the_reference_rows(tmp_path):
    """LLaVA end to end: greedy text after an image is the text model's after the reference's
    rows of it (Hugging Face's CLIP; not llama.cpp's, which computes them otherwise), and a
    second question reads the rows from the cache."""
    from dualpath import SamplingParams
    from dualpath.vision.preprocess import squares

    mmproj = synth_mmproj(tmp_path / "mmproj.gguf", "llava-tiny", "F32")
    text = synth_text(tmp_path / "text.gguf", "llava-tiny", "F32")
    image = np.random.default_rng(8).integers(0, 256, (90, 60, 3), dtype=np.uint8)
    config = load_config(None, {"runtime.num_threads": 2, "runtime.quantized_matmul_accuracy": 0})
    llm = LLM(text, config, mmproj=mmproj)
    prompt = "USER: <__media__>\nWhat is in it? ASSISTANT:"
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=1)
    out = llm.generate(prompt, params, images=[image])
    ids, embeds = llm.images.prompt(prompt, [image])
    ((pos, rows, mutual),) = embeds
    spec = read_mmproj(mmproj)
    want = vision_reference.encode(spec, vision_reference.load_weights(spec), squares(image, spec).images[0])
    assert not mutual and rows.shape == want.shape == (16, 256)
    assert np.abs(rows - want).max() <= 1e-3 * np.abs(want).max()
    ref = LLM(text, config)  # the text model alone, the reference's rows in the same place
    logits = ref.runner.forward(ids + list(out.token_ids[:-1]), all_logits=True,
                                embeds=((pos, want.astype(np.float32)),))[len(ids) - 1:]
    assert list(logits.argmax(axis=1)) == list(out.token_ids)
    again = llm.generate(prompt, params, images=[image])
    assert again.token_ids == out.token_ids and llm.images.stats["encoded"] == 1


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("pair")
    mmproj = synth_mmproj(d / "mmproj.gguf", "smolvlm-tiny", "F16")
    text = synth_text(d / "text.gguf", "smolvlm-tiny", "F16")
    return text, mmproj, LLM(text, load_config(None, {"runtime.num_threads": 2}), mmproj=mmproj)


def test_another_image_is_another_prefix(pair):
    """The image rows' ids come from the image's digest: the prefix cache reuses the text
    before another image, never the first image's rows."""
    from dualpath import SamplingParams

    _, _, llm = pair
    params = SamplingParams(max_tokens=1, temperature=0.0)
    rng = np.random.default_rng(9)
    a, b = (rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for _ in range(2))
    prompt = "A long enough caption to fill a page of the cache before the image: " * 2 + "<__media__> and?"
    ids_a, embeds_a = llm.images.prompt(prompt, [a])
    ids_b, embeds_b = llm.images.prompt(prompt, [b])
    first = embeds_a[0][0]
    assert ids_a[:first] == ids_b[:first] and ids_a[first:] != ids_b[first:]
    from dualpath.tokenizer.spec import TOKEN_NORMAL

    types = llm.tokenizer.spec.token_types
    assert all(types[ids_a[p + i]] == TOKEN_NORMAL for p, rows, _ in embeds_a for i in range(len(rows)))
    llm.generate(prompt, params, images=[a])
    out = llm.generate(prompt, params, images=[b])
    assert 0 < out.usage.cached_prompt_tokens <= first


def test_images_are_refused_where_they_cannot_go(pair, tmp_path):
    from dualpath.errors import ImageError, ModelLoadError

    text, mmproj, llm = pair
    image = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(ImageError, match="2 image markers .* for 1 images"):
        llm.generate("<__media__><__media__>", images=[image])
    with pytest.raises(ImageError, match="not PNG or JPEG"):
        llm.generate("what is it?", images=[b"GIF89a......"])
    with pytest.raises(ImageError, match=r"\(height, width, 3\) uint8"):
        llm.generate("what is it?", images=[np.zeros((8, 8), np.uint8)])
    plain = LLM(text, load_config(None, {"runtime.num_threads": 2}))
    with pytest.raises(ImageError, match="takes text only.*mmproj"):
        plain.generate("what is it?", images=[image])
    from dualpath.models.synth import synth_gguf

    narrow = synth_gguf(tmp_path / "narrow.gguf", "stories15M")  # 288 wide: the projector makes rows of 256
    with pytest.raises(ModelLoadError, match="belongs to another text model"):
        LLM(narrow, load_config(None, {"runtime.num_threads": 2}), mmproj=mmproj)
    bare = synth_gguf(tmp_path / "bare.gguf", "llama3-tiny")  # no Idefics3 markers in its vocabulary
    with pytest.raises(ModelLoadError, match="idefics3 images need the token"):
        LLM(bare, load_config(None, {"runtime.num_threads": 2}), mmproj=mmproj)


def test_an_image_is_encoded_once_across_a_restart(pair, tmp_path, caplog):
    """With the prefix cache on disk, a restarted process reads an image's embeddings and its
    prompt's pages back, and answers as before without the encoder; a damaged file is
    encoded again; ``dualpath cache`` lists the embeddings beside the pages."""
    from dualpath import SamplingParams
    from dualpath.cache.disk import list_stores

    text, mmproj, _ = pair
    cfg = load_config(None, {"runtime.num_threads": 2})
    params = SamplingParams(max_tokens=4, temperature=0.0)
    image = np.random.default_rng(11).integers(0, 256, (64, 100, 3), dtype=np.uint8)
    prompt = "Look at this: <__media__> What do you see?"
    llm = LLM(text, cfg, mmproj=mmproj, prefix_cache=tmp_path / "prefix")
    first = llm.generate(prompt, params, images=[image])
    llm.prefix_store.flush()
    first_row = llm.images.prompt(prompt, [image])[1][0][0]
    del llm
    again = LLM(text, cfg, mmproj=mmproj, prefix_cache=tmp_path / "prefix")
    second = again.generate(prompt, params, images=[image])
    assert second.token_ids == first.token_ids
    assert (again.images.stats["encoded"], again.images.stats["from_disk"]) == (0, 1)
    assert second.usage.cached_prompt_tokens > first_row
    (store,) = [s for s in list_stores(str(tmp_path / "prefix")) if s.namespace.get("kind") == "image-embeddings"]
    assert store.pages == 1
    path = store.files[0][2]
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xff\xff\xff")
    third = LLM(text, cfg, mmproj=mmproj, prefix_cache=tmp_path / "prefix")
    assert third.generate(prompt, params, images=[image]).token_ids == first.token_ids
    assert third.images.stats["encoded"] == 1 and "damaged" in caplog.text


def test_an_image_is_encoded_a_piece_at_a_time(pair):
    """An encode in pieces (products, attention, graphs: several a square) gives the encoder's
    embeddings; on a queue it runs a slice of pieces per engine step until done."""
    from dualpath.engine.encoder_queue import EncoderQueue, ImageJob
    from dualpath.vision.preprocess import squares

    _, _, llm = pair
    encoder = llm.images.encoder
    cut = squares(np.random.default_rng(12).integers(0, 256, (64, 130, 3), dtype=np.uint8), encoder.spec).images
    whole = encoder.encode(cut)
    pieces, count = encoder.pieces(cut), 0
    while True:
        try:
            next(pieces)
            count += 1
        except StopIteration as done:
            assert np.array_equal(done.value, whole)
            break
    assert count > 4 * len(cut)
    queue = EncoderQueue(encoder, metric_prefix="dualpath_image_encoder", what=("images", "Images"))
    got = []
    queue.submit(ImageJob(cut, lambda results, error: got.append((results, error))))
    while not got:
        queue.step()
    (results, error), = got
    assert error is None and np.array_equal(results[0], whole)
    assert not queue.has_work() and "dualpath_image_encoder_images_total 1" in queue.metrics_lines()


@pytest.mark.parametrize("weight_type", ["F16", "Q8_0"])
def test_a_chat_decodes_while_an_image_is_encoded(pair, tmp_path, weight_type):
    """A request with four images waits for them on the encoder's queue, which runs beside a
    request already decoding: that one's tokens keep coming, and both texts are what each
    gives alone. F16: ONNX Runtime's products, between the engine's steps; Q8_0: our kernels',
    on a thread of its own with one of the two threads while the chat decodes on the other."""
    import threading
    import time

    from dualpath import SamplingParams

    text, mmproj, _ = pair
    if weight_type == "Q8_0":
        mmproj = synth_mmproj(tmp_path / "mmproj-q8.gguf", "smolvlm-tiny", "Q8_0")
    llm = LLM(text, load_config(None, {"runtime.num_threads": 2}), mmproj=mmproj)
    split = llm.images.queue.cores
    assert (split is not None) == (weight_type == "Q8_0")
    chat_pool = llm.runner.pools()[0]
    params = SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True)
    alone = llm.generate("Once upon a time", params).token_ids
    rng = np.random.default_rng(13)
    images = [rng.integers(0, 256, (64, 130, 3), dtype=np.uint8) for _ in range(4)]
    gen = llm.stream("Once upon a time", params)
    counts: list[int] = []
    tokens: list[str] = []

    def decode() -> None:
        for delta in gen:
            tokens.append(delta)

    thread = threading.Thread(target=decode)
    thread.start()
    while not tokens and thread.is_alive():
        time.sleep(0.001)
    counts.append(len(tokens))
    if split is not None:  # a job's end, on the encoder's thread: each side had one of the two threads
        from dualpath.engine.encoder_queue import ImageJob
        from dualpath.vision.preprocess import squares

        seen: list = []
        done = threading.Event()

        def on_done(results, error) -> None:
            seen.append((chat_pool.active, split.pool.active, error))
            done.set()

        llm.images.queue.submit(ImageJob(squares(images[0], llm.images.spec).images, on_done))
        assert done.wait(60) and seen == [(1, 1, None)]
    out = llm.generate("What are these? " + "<__media__>" * 4, SamplingParams(max_tokens=4, temperature=0.0),
                       images=images)
    counts.append(len(tokens))
    thread.join()
    assert gen.completion.token_ids == alone
    assert counts[1] > counts[0]  # it decoded while the four images were encoded
    assert chat_pool.active == 2  # the encoder is done: the chat has every thread again
    assert llm.images.stats["encoded"] == 4 and out.usage.prompt_tokens > 4 * 3 * 4
    metrics = llm.engine.metrics_text()
    jobs = 4 + (split is not None)  # (the job above too)
    assert f"dualpath_image_encoder_images_total {jobs}" in metrics
    assert "dualpath_image_encoder_seconds_total" in metrics
