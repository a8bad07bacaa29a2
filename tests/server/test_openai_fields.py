"""The OpenAI request fields the server honours (log-probabilities, penalties,
logit_bias, aliases), through the real ``openai`` client, and the ones it refuses
with a 400 naming them."""

from __future__ import annotations

import math

import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from test_server import KEY, LiveServer  # noqa: E402

import dualpath  # noqa: E402
from dualpath.sampling.sampler import Sampler, SamplingParams  # noqa: E402

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def live(chat_gguf):
    cfg = dualpath.load_config(None, {"runtime.max_context_tokens": 256, "runtime.max_num_seqs": 4,
                                      "server.api_key": KEY, "server.model_name": "tiny-stories",
                                      "server.embeddings": "on"})
    srv = LiveServer(dualpath.LLM(chat_gguf, cfg))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def reference(chat_gguf):
    """A second LLM on the same file: the model's own logits, computed beside the server."""
    return dualpath.LLM(chat_gguf, dualpath.load_config(None, {"runtime.max_context_tokens": 256}))


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - (x.max() + np.log(np.exp(x - x.max()).sum()))


def test_completion_logprobs_are_the_models_distribution(live, reference):
    c = live.client().completions.create(model="tiny-stories", prompt=PROMPT, max_tokens=6, temperature=0,
                                         logprobs=3)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == c.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and len(top) == 3
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-6
        assert max(top.values()) == pytest.approx(chosen)  # greedy: the chosen token is the most likely
    # The first token's whole distribution, from the model's logits in another runner.
    ids = reference.tokenize(PROMPT)
    r = reference.runner
    r.begin([])
    expected = log_softmax(r.forward(ids)[-1])
    best = np.argsort(-expected)[:3]
    got = lp.top_logprobs[0]
    for i in best:
        assert got[reference.tokenizer.token_bytes(int(i)).decode("utf-8", "replace")] == pytest.approx(
            float(expected[i]), abs=1e-4)


def test_streamed_logprobs_add_up_to_the_whole(live):
    client = live.client()
    whole = client.completions.create(model="x", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2)
    tokens, lps = [], []
    for ev in client.completions.create(model="x", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2,
                                        stream=True):
        if ev.choices and ev.choices[0].logprobs:
            tokens += ev.choices[0].logprobs.tokens
            lps += ev.choices[0].logprobs.token_logprobs
    assert tokens == whole.choices[0].logprobs.tokens
    assert lps == pytest.approx(whole.choices[0].logprobs.token_logprobs)


def test_chat_logprobs_with_top_logprobs_streamed_and_not(live):
    client = live.client()
    messages = [{"role": "user", "content": PROMPT}]
    c = client.chat.completions.create(model="x", messages=messages, max_tokens=5, temperature=0, logprobs=True,
                                       top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert len(content) == 5 and "".join(e.token for e in content) == c.choices[0].message.content
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 2 and bytes(e.bytes).decode("utf-8", "replace") == e.token
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
    streamed = []
    for ev in client.chat.completions.create(model="x", messages=messages, max_tokens=5, temperature=0,
                                             logprobs=True, top_logprobs=2, stream=True):
        if ev.choices and ev.choices[0].logprobs:
            streamed += ev.choices[0].logprobs.content
    assert [e.token for e in streamed] == [e.token for e in content]
    plain = client.chat.completions.create(model="x", messages=messages, max_tokens=3, temperature=0)
    assert plain.choices[0].logprobs is None


def test_logit_bias_bans_and_forces_tokens(live, reference):
    client = live.client()
    base = client.completions.create(model="x", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=0)
    first = reference.tokenize(PROMPT)  # the token the greedy run starts with, by id:
    r = reference.runner
    r.begin([])
    top = int(np.argmax(r.forward(first)[-1]))
    banned = client.completions.create(model="x", prompt=PROMPT, max_tokens=8, temperature=0,
                                       logit_bias={str(top): -100})
    assert banned.choices[0].text != base.choices[0].text
    forced = client.completions.create(model="x", prompt=PROMPT, max_tokens=4, temperature=0.9, seed=3,
                                       logit_bias={"300": 100})
    piece = reference.tokenizer.token_bytes(300).decode("utf-8", "replace")
    assert forced.choices[0].text == piece * 4


def test_frequency_and_presence_penalties_follow_openais_formula():
    """logit[t] - presence * (count[t] > 0) - frequency * count[t], over the generated tokens."""
    logits = np.array([3.0, 2.9, 0.5, 0.1, -1.0], np.float32)
    s = Sampler(SamplingParams(temperature=0, presence_penalty=0.5, frequency_penalty=0.3, logprobs=5), 5)
    counts = np.zeros(5)
    for _ in range(6):
        token = s.sample(logits)
        processed = logits - 0.5 * (counts > 0) - 0.3 * counts
        assert token == int(np.argmax(processed))
        assert s.last_logprobs[0] == pytest.approx(float(log_softmax(processed)[token]), abs=1e-5)
        counts[token] += 1
    assert counts[0] > 0 and counts[1] > 0  # the penalties moved greedy off the top token


def test_penalties_change_the_served_text(live):
    client = live.client()
    plain = client.completions.create(model="x", prompt=PROMPT, max_tokens=48, temperature=0)
    penalised = client.completions.create(model="x", prompt=PROMPT, max_tokens=48, temperature=0,
                                          frequency_penalty=1.5, presence_penalty=1.0)
    words = plain.choices[0].text.split()
    pwords = penalised.choices[0].text.split()
    assert penalised.choices[0].text != plain.choices[0].text
    assert max(map(pwords.count, set(pwords))) <= max(map(words.count, set(words)))


@pytest.mark.parametrize("field, value", [
    ("suffix", "the end"), ("best_of", 3), ("foo_bar", 1)])
def test_a_completion_field_not_honoured_is_400_naming_it(live, field, value):
    with pytest.raises(openai.BadRequestError) as info:
        live.client().completions.create(model="x", prompt=PROMPT, max_tokens=2, extra_body={field: value})
    assert info.value.status_code == 400 and f"'{field}'" in info.value.message
    assert info.value.body["param"] == field


@pytest.mark.parametrize("field, value", [
    ("audio", {"voice": "alloy", "format": "wav"}), ("modalities", ["text", "audio"]),
    ("prediction", {"type": "content", "content": "x"}), ("reasoning_effort", "minimal"), ("store", True),
    ("functions", [{"name": "f", "parameters": {}}]), ("made_up_field", True)])
def test_a_chat_field_not_honoured_is_400_naming_it(live, field, value):
    with pytest.raises(openai.BadRequestError) as info:
        live.client().chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=2, extra_body={field: value})
    assert f"'{field}'" in info.value.message and info.value.body["param"] == field


@pytest.mark.parametrize("part, message", [
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
     "messages[0].content[1] is an image: this model takes text only"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
     "messages[0].content[1]: only text parts are supported"),
    ("just a string", "messages[0].content[1]: only text parts are supported")])
def test_a_content_part_that_is_not_text_is_400_naming_it(live, part, message):
    with pytest.raises(openai.BadRequestError) as info:
        live.client().chat.completions.create(
            model="x", max_tokens=2, messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}, part]}])
    assert message in info.value.message and info.value.body["param"] == "messages"


def test_echo_with_logprobs_scores_the_prompt_streamed_and_not(live, reference):
    client = live.client()
    c = client.completions.create(model="x", prompt=PROMPT, max_tokens=3, echo=True, logprobs=2, temperature=0)
    lp = c.choices[0].logprobs
    ids = reference.tokenize(PROMPT)
    assert c.choices[0].text.startswith(PROMPT)
    assert len(lp.tokens) == len(ids) + 3 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    # the prompt's second token, scored by the model's distribution after the first
    r = reference.runner
    r.begin([])
    expected = log_softmax(r.forward(ids[:1])[-1])
    assert lp.token_logprobs[1] == pytest.approx(float(expected[ids[1]]), abs=1e-4)
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    streamed = []
    for ev in client.completions.create(model="x", prompt=PROMPT, max_tokens=3, echo=True, logprobs=2,
                                        temperature=0, stream=True):
        if ev.choices and ev.choices[0].logprobs:
            streamed += ev.choices[0].logprobs.token_logprobs
    assert streamed[0] is None and streamed[1:] == pytest.approx(lp.token_logprobs[1:])
    plain = client.completions.create(model="x", prompt=PROMPT, max_tokens=2, echo=True, temperature=0)
    assert plain.choices[0].text.startswith(PROMPT)


def test_the_alias_is_listed_and_any_name_served_unless_strict(live, chat_gguf):
    client = live.client()
    assert [m.id for m in client.models.list().data] == ["tiny-stories"]
    assert client.completions.create(model="gpt-4o", prompt="Hi", max_tokens=2).model == "tiny-stories"
    strict = LiveServer(dualpath.LLM(chat_gguf, dualpath.load_config(None, {
        "runtime.max_context_tokens": 128, "server.model_name": "tiny-stories", "server.strict_model_name": True})))
    try:
        c = strict.client(key="unused")
        assert c.completions.create(model="tiny-stories", prompt="Hi", max_tokens=2).model == "tiny-stories"
        assert c.completions.create(model="stories260K-chat.gguf", prompt="Hi", max_tokens=2).choices
        with pytest.raises(openai.NotFoundError) as info:
            c.completions.create(model="gpt-4o", prompt="Hi", max_tokens=2)
        assert "'tiny-stories'" in info.value.message
    finally:
        strict.stop()


def test_a_model_without_a_chat_template_is_a_400_without_server_paths(gguf_path):
    srv = LiveServer(dualpath.LLM(gguf_path, dualpath.load_config(None, {"runtime.max_context_tokens": 128})))
    try:
        with pytest.raises(openai.BadRequestError) as info:
            srv.client(key="unused").chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}])
        assert "no chat template" in info.value.message
        assert str(gguf_path.parent) not in info.value.message and "generate()" not in info.value.message
        assert "/v1/completions" in info.value.message
    finally:
        srv.stop()


def test_n_samples_share_the_prompts_pages_and_equal_separate_seeded_runs(live):
    client = live.client()
    cache = live.llm.runner.cache
    before = cache.stats()
    c = client.completions.create(model="x", prompt=PROMPT, max_tokens=12, temperature=1.5, seed=7, n=3)
    after = cache.stats()
    assert [ch.index for ch in c.choices] == [0, 1, 2]
    assert after.forks - before.forks == 2  # the prompt was computed once, then forked twice
    prompt_pages = -(-c.usage.prompt_tokens // cache.page_tokens)
    assert after.forked_pages - before.forked_pages == 2 * prompt_pages
    assert c.usage.completion_tokens == 36 and c.usage.total_tokens == c.usage.prompt_tokens + 36
    # each choice is the sample a lone request with seed 7 + index gives (forked KV = recomputed KV)
    for ch in c.choices:
        alone = client.completions.create(model="x", prompt=PROMPT, max_tokens=12, temperature=1.5,
                                          seed=7 + ch.index)
        assert ch.text == alone.choices[0].text
    assert len({ch.text for ch in c.choices}) > 1


def test_n_samples_stream_per_choice_in_chat(live):
    client = live.client()
    messages = [{"role": "user", "content": PROMPT}]
    whole = client.chat.completions.create(model="x", messages=messages, max_tokens=10, temperature=1.0, seed=2,
                                           n=2, logprobs=True)
    texts = {0: "", 1: ""}
    for ev in client.chat.completions.create(model="x", messages=messages, max_tokens=10, temperature=1.0,
                                             seed=2, n=2, stream=True):
        for ch in ev.choices:
            texts[ch.index] += ch.delta.content or ""
    assert [texts[0], texts[1]] == [ch.message.content for ch in whole.choices]
    assert all(len(ch.logprobs.content) == 10 for ch in whole.choices)


def test_more_samples_than_sequences_is_400_naming_n(live):
    with pytest.raises(openai.BadRequestError) as info:
        live.client().completions.create(model="x", prompt=PROMPT, max_tokens=2, n=9)
    assert info.value.body["param"] == "n" and "max_num_seqs" in info.value.message


def test_embeddings_match_llama_cpps_mean_pooling_and_batch_like_single_inputs(live, gguf_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    client = live.client()
    texts = ["Once upon a time there was a dog", "Once upon a time there was a cat", "The sun is hot today."]
    r = client.embeddings.create(model="x", input=texts)
    vecs = np.array([d.embedding for d in r.data])
    assert [d.index for d in r.data] == [0, 1, 2] and vecs.shape == (3, 64)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert r.usage.prompt_tokens == sum(len(live.llm.tokenize(t)) for t in texts)
    single = client.embeddings.create(model="x", input=texts[1]).data[0].embedding
    assert np.allclose(single, vecs[1], atol=1e-6)  # batched with others or alone: the same vector
    sims = vecs @ vecs.T
    assert sims[0, 1] > sims[0, 2] and sims[0, 1] > sims[1, 2]  # the two stories are closer
    ref = llama_cpp.Llama(str(gguf_path), embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
                          n_ctx=256, verbose=False)
    expected = np.array(ref.embed(texts[0], normalize=True))
    assert float(expected @ vecs[0]) > 0.9999


def test_embeddings_base64_token_ids_and_bad_inputs(live):
    import base64

    client = live.client()
    ids = live.llm.tokenize(PROMPT)
    as_float = client.embeddings.create(model="x", input=[ids]).data[0].embedding
    b64 = client.embeddings.with_raw_response.create(model="x", input=[ids], encoding_format="base64")
    raw = b64.http_response.json()["data"][0]["embedding"]
    assert np.allclose(np.frombuffer(base64.b64decode(raw), "<f4"), as_float)
    for bad, param in ((dict(input=""), "input"), (dict(input=[[]]), "input"),
                       (dict(input="hi", dimensions=8), "dimensions"), (dict(input="hi" * 400), "input")):
        with pytest.raises(openai.BadRequestError) as info:
            client.embeddings.create(model="x", **bad)
        assert info.value.body["param"] == param


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "mood", "friends"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "mood": {"enum": ["happy", "sad"]},
                         "friends": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2}}}


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_json_schema_response_parses_and_validates_streamed_and_not(live, temperature):
    import json

    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("llguidance")
    client = live.client()
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    messages = [{"role": "user", "content": "Once upon a time"}]
    c = client.chat.completions.create(model="x", messages=messages, max_tokens=200, temperature=temperature,
                                       seed=4, n=2, response_format=fmt)
    for ch in c.choices:
        assert ch.finish_reason == "stop"
        jsonschema.validate(json.loads(ch.message.content), SCHEMA)
    text = "".join(ev.choices[0].delta.content or "" for ev in client.chat.completions.create(
        model="x", messages=messages, max_tokens=200, temperature=temperature, seed=4, response_format=fmt,
        stream=True) if ev.choices)
    assert text == c.choices[0].message.content
    jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_mode_and_tools_a_template_ignores(live):
    import json

    pytest.importorskip("llguidance")
    client = live.client()
    messages = [{"role": "user", "content": "Once upon a time"}]
    c = client.chat.completions.create(model="x", messages=messages, max_tokens=240, temperature=0.7, seed=1,
                                       response_format={"type": "json_object"})
    text = c.choices[0].message.content
    assert text.lstrip().startswith("{")  # an object: the story model writes long strings and may run out
    if c.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"],
        "additionalProperties": False}}}
    # This template ignores tools: the model would never learn of them, so asking is refused
    # (tests/server/test_tool_calls.py calls tools through templates that write them).
    for choice in ("required", "auto"):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="x", messages=messages, max_tokens=5, tools=[weather],
                                           tool_choice=choice)
        assert info.value.body["param"] == "tools" and "does not render 'tools'" in info.value.body["message"]
    # "none" does not give the template the tools: the text is free
    free = client.chat.completions.create(model="x", messages=messages, max_tokens=5, temperature=0,
                                          tools=[weather], tool_choice="none")
    assert free.choices[0].message.tool_calls is None and free.choices[0].finish_reason == "length"


def test_an_unsupported_schema_is_400_naming_the_field(live):
    pytest.importorskip("llguidance")
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(openai.BadRequestError) as info:
        live.client().chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=4, response_format=bad)
    assert info.value.body["param"].startswith("response_format") and "uniqueItems" in info.value.message
