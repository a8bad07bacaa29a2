"""``dualpath bench classifier``: both products of one shape agree, the figures are
consistent, and a malformed shape is refused with its reason."""

import pytest

from dualpath.bench.classifier import _shapes, measure


@pytest.mark.parametrize("block", [16, 32])
def test_ours_and_onnx_runtimes_products_agree(block):
    r = measure(4096, 256, block, threads=2, repeats=2)
    # Both quantize the activations to int8 per block; they may round a tie differently.
    assert r["max_abs_diff_rel"] < 2e-2
    assert r["ours_ms"] > 0 and r["ort_ms"] > 0 and r["bandwidth_gb_per_s"] > 0
    assert r["ours_mib"] == pytest.approx(4096 * 256 * (1 + 4 / block) / (1 << 20))
    assert r["ours_gb_per_s"] == pytest.approx(r["ours_mib"] * (1 << 20) / r["ours_ms"] / 1e6)


@pytest.mark.parametrize("text, reason", [("100x64", "rows x columns / block"), ("100x64/8", "16 or 32"),
                                          ("100x48/16", "whole 32s"), ("ax64/32", "rows x columns / block")])
def test_a_malformed_shape_is_refused(text, reason):
    with pytest.raises(ValueError, match=reason):
        _shapes(text)
    assert _shapes("262144x640/32,10x32/16") == [(262144, 640, 32), (10, 32, 16)]
