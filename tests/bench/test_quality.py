"""``dualpath bench quality``: its arithmetic on logits with known answers, and a run on
the real stories260K quantized by llama.cpp, against the model's exact F32 copy."""

import importlib.util
import json
import math

import numpy as np
import pytest

from dualpath.bench.quality import compare, default_text, dequantized_copy
from dualpath.cli import main


def test_compare_gives_zero_for_the_same_distribution_and_the_closed_form_otherwise():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(5, 7)).astype(np.float32)
    targets = np.array([0, 1, 2, 3, 4])
    same = compare(ref, ref + 3.0, targets)  # a constant shift leaves the softmax as it is
    assert same["mean_kl"] == pytest.approx(0, abs=1e-9) and same["top1"] == 1.0
    # Two tokens: p = (0.5, 0.5) against q = (1 / (1 + e), e / (1 + e)).
    two = compare(np.zeros((1, 2), np.float32), np.array([[0.0, 1.0]], np.float32), np.array([0]))
    q = np.array([1, math.e]) / (1 + math.e)
    assert two["mean_kl"] == pytest.approx(float(np.sum(0.5 * np.log(0.5 / q))), rel=1e-6)
    assert two["top1"] == 0.0  # argmax of a tie is the first token; q's is the second
    assert two["ppl"] == pytest.approx(1 / q[0], rel=1e-6)
    uniform = compare(np.zeros((3, 10), np.float32), np.zeros((3, 10), np.float32), np.array([1, 2, 3]))
    assert uniform["ppl"] == pytest.approx(10.0)  # one in ten, at every position


def test_compare_refuses_logits_that_do_not_line_up():
    with pytest.raises(ValueError, match="logits of shapes"):
        compare(np.zeros((3, 4), np.float32), np.zeros((2, 4), np.float32), np.arange(3))


def test_the_built_in_text_is_long_enough_for_the_issue_s_150_tokens():
    assert len(default_text().split()) >= 150  # words; every tokenizer takes at least one token a word


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python quantizes the file and is the peer compared")
def test_quality_on_a_file_quantized_by_llama_cpp(gguf_path, tmp_path, capsys):
    from dualpath.models.synth import quantize_gguf

    f32 = dequantized_copy(str(gguf_path), str(tmp_path / "f32.gguf"))  # its 172-wide ffn_down is F16
    path = quantize_gguf(f32, str(tmp_path / "stories260K-Q8_0.gguf"), "Q8_0")
    out = tmp_path / "quality.json"
    assert main(["bench", "quality", "-m", path, "-t", "1", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["text_tokens"] == res["tokens"] >= 150 and res["scored"] == res["tokens"] - 1
    assert res["engines"] == ["dualpath", "llama.cpp FA off", "llama.cpp FA on"]  # two arithmetics, both reported
    assert res["references"] == ["exact (dualpath)", "exact (llama.cpp)"] and res["exact_setting"] == "FA off"
    agree = res["references_agree"]  # one exact model, run by two engines
    assert agree["mean_kl"] < 1e-4 and agree["top1"] > 0.99
    for engine in res["engines"]:
        for ref in res["references"]:
            row = res["rows"][engine][ref]
            # Q8_0 and int8 activations: near the exact model, but not on it.
            assert 0 < row["mean_kl"] < 0.05 and row["top1"] > 0.9 and row["max_kl"] >= row["p99_kl"]
            assert 1 < row["ppl"] < 512
    text = capsys.readouterr().out
    assert "the two exact runs against each other" in text and "the model's context" not in text
    assert "llama.cpp is closer to the exact model with FA o" in text and res["build"] in text


def test_quality_refuses_an_empty_text_and_cuts_a_long_one_to_the_context(gguf_path, tmp_path, capsys):
    text = tmp_path / "one.txt"
    text.write_text("")
    with pytest.raises(ValueError, match="at least 2 are needed"):
        main(["bench", "quality", "-m", str(gguf_path), "--no-peer", "--text", str(text)])
    text.write_text(default_text() * 3)  # about 2,450 tokens for stories260K's 512 pieces; 2,048 positions
    out = tmp_path / "q.json"
    assert main(["bench", "quality", "-m", str(gguf_path), "--no-peer", "--text", str(text), "-t", "1",
                 "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["engines"] == ["dualpath"] and "references_agree" not in res
    assert res["text_tokens"] > res["tokens"] == 2048 - 8
    assert f"the first 2040 of {res['text_tokens']}: the model's context" in capsys.readouterr().out
    row = res["rows"]["dualpath"]["exact (dualpath)"]
    # An F32 file: the engine's default (f16 KV cache) against its own f32-KV run.
    assert row["mean_kl"] < 1e-3 and row["top1"] >= 0.95
