"""Synthetic models (random weights, real shapes, `--model synth:PRESET`): one cache file per
recorded context length, the preset's own being the plain default file."""

from __future__ import annotations

import os

from dualpath.models.synth import PRESETS, ensure_synth_model, synth_model_path


def test_synth_model_path_is_one_file_per_context_length(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    plain = synth_model_path()
    assert plain == os.path.join(str(tmp_path), "dualpath", "synth-stories15M-F32-seed0.gguf")
    assert synth_model_path(PRESETS["stories15M"].context_length) == plain
    assert synth_model_path(16384) == os.path.join(str(tmp_path), "dualpath",
                                                     "synth-stories15M-F32-seed0-ctx16384.gguf")


def test_ensure_synth_model_reuses_an_existing_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = synth_model_path(4096)
    os.makedirs(os.path.dirname(path))
    open(path, "wb").close()  # present: never synthesized again
    assert ensure_synth_model(4096) == (path, False)
