"""Models from the Hugging Face Hub (``models/hub.py``), with no network.

This machine reaches no Hub, and the tests do not pretend it does: each builds a real
huggingface_hub cache in ``tmp_path`` (the layout huggingface_hub 2.x writes, checked
against its own ``scan_cache_dir`` and ``try_to_load_from_cache``), holding the
package's stories260K.gguf under quant-tagged names, and runs with ``HF_HUB_OFFLINE=1``.
The only "online" runs point ``HF_ENDPOINT`` at a closed loopback port (a real
connection error) or at a loopback server that answers as the Hub does for a missing
repository (404, ``X-Error-Code: RepoNotFound``).

huggingface_hub reads ``HF_HUB_OFFLINE`` and ``HF_HUB_CACHE`` into constants when it is
imported. In-process tests set the environment *and* those constants; command-line tests
run ``python -m dualpath.cli`` as a subprocess with the environment alone.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("huggingface_hub")

import dualpath  # noqa: E402
from dualpath.errors import ModelLoadError  # noqa: E402
from dualpath.models import embedded_model_path  # noqa: E402
from dualpath.models.hub import DEFAULT_QUANTS, HubModelError, parse_hf_repo, resolve_hf_model, select_gguf  # noqa: E402

REPO = "owner/stories-GGUF"
COMMIT = "4c1e1a1d1f0e9b8a7c6d5e4f3a2b1c0d9e8f7a6b"
"""A fake commit hash (40 hex digits): the snapshot folder and the value of refs/main."""

PROMPT = "Once upon a time"
MAX_TOKENS = 24


def write_hf_snapshot(hub_cache: Path, repo_id: str, files: dict[str, bytes], commit: str = COMMIT,
                      ref: str = "main") -> Path:
    """Lay ``files`` (path in the repository -> content) out as huggingface_hub writes a
    download into its cache, and return the snapshot folder::

        models--OWNER--NAME/blobs/<sha256 of the content>      the bytes, once per content
        models--OWNER--NAME/snapshots/<commit>/<path>          -> ../../blobs/<sha256> (relative symlink)
        models--OWNER--NAME/refs/<ref>                         the commit hash, no newline
    """
    repo_dir = hub_cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    for name, data in files.items():
        blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / ref).write_text(commit)
    return snapshot


def fake_gguf(name: str) -> bytes:
    """Distinct bytes per name (selection never reads a file; distinct blobs as on the Hub)."""
    return b"GGUF" + name.encode()


@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    return Path(embedded_model_path()).read_bytes()


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty huggingface_hub cache under ``tmp_path``, offline. ``.hub`` is the hub cache
    folder, ``.env`` the environment for a subprocess."""
    import huggingface_hub.constants

    home = tmp_path / "hf-home"
    hub = home / "hub"
    hub.mkdir(parents=True)
    env = {"HF_HOME": str(home), "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1",
           "XDG_CACHE_HOME": str(tmp_path / "xdg-cache")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    return SimpleNamespace(hub=hub, env=dict(os.environ, PYTHONIOENCODING="utf-8"))


@pytest.fixture
def stories_repo(hf_cache, model_bytes):
    """REPO cached at COMMIT with the real stories260K.gguf as its Q8_0 and F32 files, a
    fake Q4_K_M, an mmproj, a README and a split Q2_K."""
    write_hf_snapshot(hf_cache.hub, REPO, {
        "README.md": b"# stories\n",
        "stories260K-Q8_0.gguf": model_bytes,
        "stories260K-f32.gguf": model_bytes,
        "stories260K-Q4_K_M.gguf": fake_gguf("Q4_K_M"),
        "mmproj-stories260K-F16.gguf": fake_gguf("mmproj"),
        "Q2_K/stories260K-Q2_K-00001-of-00002.gguf": fake_gguf("Q2_K-1"),
        "Q2_K/stories260K-Q2_K-00002-of-00002.gguf": fake_gguf("Q2_K-2"),
    })
    return hf_cache


def run_cli(args, env, timeout=180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dualpath.cli", *map(str, args)], capture_output=True,
                          env=env, timeout=timeout)


def greedy(llm: dualpath.LLM):
    return llm.generate(PROMPT, dualpath.SamplingParams(temperature=0, max_tokens=MAX_TOKENS))


ONE_THREAD = {"runtime.num_threads": 1}


# --- the cache layout is huggingface_hub's ---------------------------------------------

def test_written_snapshot_is_what_huggingface_hub_reads_from_its_cache(stories_repo):
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    info = scan_cache_dir(stories_repo.hub)
    assert info.warnings == []
    (repo,) = info.repos
    assert (repo.repo_id, repo.repo_type) == (REPO, "model")
    (rev,) = repo.revisions
    assert (rev.commit_hash, rev.refs) == (COMMIT, frozenset({"main"}))
    found = try_to_load_from_cache(REPO, "stories260K-Q8_0.gguf", cache_dir=stories_repo.hub)
    assert found == str(stories_repo.hub / f"models--owner--stories-GGUF/snapshots/{COMMIT}/stories260K-Q8_0.gguf")


# --- REPO[:QUANT] parsing -------------------------------------------------------------

def test_parse_splits_repo_from_quant_or_file_name():
    assert parse_hf_repo("bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M") == (
        "bartowski/Llama-3.2-1B-Instruct-GGUF", "Q4_K_M", None)
    assert parse_hf_repo("owner/name") == ("owner/name", None, None)
    assert parse_hf_repo("owner/name:") == ("owner/name", None, None)
    assert parse_hf_repo("owner/name:Model-Q8_0.GGUF") == ("owner/name", None, "Model-Q8_0.GGUF")


@pytest.mark.parametrize("spec", ["just-a-name", "a/b/c:Q4_K_M", "/name", "owner/:Q8_0"])
def test_parse_refuses_a_repo_id_that_is_not_owner_slash_name(spec):
    with pytest.raises(HubModelError, match="OWNER/NAME"):
        parse_hf_repo(spec)


# --- quant selection (pure: a list of file names) ------------------------------------

BARTOWSKI = ["README.md", "Llama-3.2-1B-Instruct-IQ4_XS.gguf", "Llama-3.2-1B-Instruct-Q4_K_L.gguf",
             "Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Llama-3.2-1B-Instruct-Q4_K_S.gguf",
             "Llama-3.2-1B-Instruct-Q8_0.gguf", "Llama-3.2-1B-Instruct-f16.gguf",
             "Llama-3.2-1B-Instruct.imatrix.gguf"]


@pytest.mark.parametrize("quant, expected", [
    ("Q4_K_M", "Llama-3.2-1B-Instruct-Q4_K_M.gguf"),
    ("q4_k_m", "Llama-3.2-1B-Instruct-Q4_K_M.gguf"),
    ("Q8_0", "Llama-3.2-1B-Instruct-Q8_0.gguf"),
    ("F16", "Llama-3.2-1B-Instruct-f16.gguf"),
    ("iq4_xs", "Llama-3.2-1B-Instruct-IQ4_XS.gguf"),
])
def test_quant_tag_matches_case_insensitively_and_returns_the_tag(quant, expected):
    assert select_gguf("o/n", BARTOWSKI, quant=quant) == (expected, quant)


def test_quant_tag_must_be_delimited_so_a_prefix_of_another_tag_does_not_match():
    # Q4_K is a prefix of Q4_K_M/Q4_K_S/Q4_K_L; Q4_XS is a suffix of IQ4_XS.
    for quant in ("Q4_K", "Q4_XS", "Q4"):
        with pytest.raises(HubModelError, match=f"no .gguf file on the Hub has the quant tag {quant}"):
            select_gguf("o/n", BARTOWSKI, quant=quant)


def test_thebloke_style_dotted_tag_matches():
    files = ["llama-2-7b.Q4_K_M.gguf", "llama-2-7b.Q5_K_M.gguf"]
    assert select_gguf("o/n", files, quant="Q5_K_M") == ("llama-2-7b.Q5_K_M.gguf", "Q5_K_M")


def test_default_quant_is_q4_k_m_when_present():
    assert select_gguf("o/n", BARTOWSKI) == ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Q4_K_M")


def test_default_quant_falls_back_to_the_first_of_the_preference_list_present():
    files = ["m-Q8_0.gguf", "m-Q5_K_M.gguf", "m-Q2_K.gguf", "m-f16.gguf"]
    assert DEFAULT_QUANTS.index("Q5_K_M") < DEFAULT_QUANTS.index("Q8_0")
    assert select_gguf("o/n", files) == ("m-Q5_K_M.gguf", "Q5_K_M")


def test_default_takes_the_only_gguf_whatever_its_name():
    assert select_gguf("o/n", ["README.md", "ggml-model.gguf", "mmproj-model-f16.gguf"]) == ("ggml-model.gguf", None)


def test_no_default_quant_among_several_files_lists_them():
    with pytest.raises(HubModelError) as e:
        select_gguf("o/n", ["m-IQ2_XS.gguf", "m-IQ3_M.gguf"])
    assert "no quant given" in str(e.value) and "m-IQ2_XS.gguf, m-IQ3_M.gguf" in str(e.value)


def test_several_files_matching_the_quant_are_an_error_listing_them():
    files = ["Llama-Q4_K_M.gguf", "Llama-Instruct-Q4_K_M.gguf", "Llama-Q8_0.gguf"]
    with pytest.raises(HubModelError) as e:
        select_gguf("o/n", files, quant="Q4_K_M")
    msg = str(e.value)
    assert msg.startswith("o/n:Q4_K_M: 2 files on the Hub match quant Q4_K_M: ")
    assert "Llama-Instruct-Q4_K_M.gguf, Llama-Q4_K_M.gguf" in msg and "REPO:FILE.gguf" in msg
    # the default quant is ambiguous in the same way
    with pytest.raises(HubModelError, match="2 files on the Hub match quant Q4_K_M"):
        select_gguf("o/n", files)


def test_missing_quant_names_repo_and_quant_and_lists_the_model_files():
    with pytest.raises(HubModelError) as e:
        select_gguf("o/n", BARTOWSKI, quant="Q6_K")
    msg = str(e.value)
    assert isinstance(e.value, ModelLoadError) and (e.value.repo_id, e.value.quant) == ("o/n", "Q6_K")
    assert msg.startswith("o/n:Q6_K: no .gguf file on the Hub has the quant tag Q6_K")
    assert "Llama-3.2-1B-Instruct-Q8_0.gguf" in msg and "imatrix" not in msg


def test_repo_without_gguf_files_says_so():
    with pytest.raises(HubModelError, match="no .gguf model file on the Hub"):
        select_gguf("meta-llama/Llama-3.2-1B", ["config.json", "model.safetensors"])


SPLIT = ["big-Q8_0-00001-of-00003.gguf", "big-Q8_0-00002-of-00003.gguf", "big-Q8_0-00003-of-00003.gguf",
         "big-Q4_K_M.gguf"]


def test_split_gguf_is_refused_naming_its_parts_count_and_the_single_files():
    with pytest.raises(HubModelError) as e:
        select_gguf("o/n", SPLIT, quant="Q8_0")
    msg = str(e.value)
    assert "big-Q8_0 is a split GGUF in 3 parts" in msg and "llama-gguf-split --merge" in msg
    assert "Single files here: big-Q4_K_M.gguf" in msg
    # the parts are one model, not three matches; naming a part is refused the same way
    with pytest.raises(HubModelError, match="split GGUF in 3 parts"):
        select_gguf("o/n", SPLIT, filename="big-Q8_0-00001-of-00003.gguf")


def test_split_files_are_listed_once_in_errors():
    with pytest.raises(HubModelError) as e:
        select_gguf("o/n", SPLIT, quant="Q6_K")
    assert "big-Q8_0-*-of-00003.gguf (split)" in str(e.value) and "00002" not in str(e.value)


def test_explicit_file_name_matches_exactly_then_case_insensitively_then_by_base_name():
    files = ["sub/Model-Q8_0.gguf", "Model-Q4_K_M.gguf"]
    assert select_gguf("o/n", files, filename="Model-Q4_K_M.gguf") == ("Model-Q4_K_M.gguf", None)
    assert select_gguf("o/n", files, filename="model-q4_k_m.GGUF") == ("Model-Q4_K_M.gguf", None)
    assert select_gguf("o/n", files, filename="Model-Q8_0.gguf") == ("sub/Model-Q8_0.gguf", None)
    with pytest.raises(HubModelError, match="o/n:Model-Q6_K.gguf: no such .gguf file on the Hub"):
        select_gguf("o/n", files, filename="Model-Q6_K.gguf")


# --- resolving through the offline cache ----------------------------------------------

def test_offline_quant_resolves_to_the_cached_snapshot_file(stories_repo):
    found = resolve_hf_model(f"{REPO}:q8_0")
    snapshot = stories_repo.hub / f"models--owner--stories-GGUF/snapshots/{COMMIT}"
    assert found.path == str(snapshot / "stories260K-Q8_0.gguf")
    assert (found.repo_id, found.filename, found.quant, found.listed_from) == (
        REPO, "stories260K-Q8_0.gguf", "q8_0", "cache")


def test_offline_default_quant_and_explicit_file_name(stories_repo):
    assert resolve_hf_model(REPO).filename == "stories260K-Q4_K_M.gguf"
    assert resolve_hf_model(REPO, quant="F32").filename == "stories260K-f32.gguf"
    assert resolve_hf_model(f"{REPO}:stories260K-f32.gguf").filename == "stories260K-f32.gguf"
    assert resolve_hf_model(REPO, filename="stories260K-Q8_0.gguf").filename == "stories260K-Q8_0.gguf"


def test_offline_errors_say_the_list_came_from_the_cache(stories_repo):
    with pytest.raises(HubModelError, match=f"{REPO}:Q6_K: no .gguf file in the local HF cache has the quant"):
        resolve_hf_model(REPO, quant="Q6_K")
    with pytest.raises(HubModelError, match=f"{REPO}:Q2_K: .*split GGUF in 2 parts"):
        resolve_hf_model(REPO, quant="Q2_K")


def test_quant_given_twice_differently_is_an_error(stories_repo):
    with pytest.raises(HubModelError, match="quant given twice"):
        resolve_hf_model(f"{REPO}:Q8_0", quant="F32")


def test_offline_with_the_repo_not_cached_names_repo_quant_cache_and_the_fix(hf_cache):
    with pytest.raises(ModelLoadError) as e:
        resolve_hf_model("owner/missing:Q4_K_M")
    msg = str(e.value)
    assert msg.startswith("owner/missing:Q4_K_M: offline mode is on (HF_HUB_OFFLINE=1)")
    assert f"the local HF cache {hf_cache.hub} holds no copy of it" in msg and "unset HF_HUB_OFFLINE" in msg


def test_offline_with_no_cache_folder_at_all(hf_cache):
    hf_cache.hub.rmdir()
    with pytest.raises(HubModelError, match=r"owner/missing: offline mode is on .* does not exist"):
        resolve_hf_model("owner/missing")


def test_offline_reads_the_environment_even_when_huggingface_hub_was_imported_online(stories_repo, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # as if imported before the env was set
    assert resolve_hf_model(f"{REPO}:Q8_0").listed_from == "cache"


def test_partial_download_is_not_listed(stories_repo):
    # huggingface_hub resumes into blobs/<etag>.incomplete and links it into the snapshot when done
    blobs = stories_repo.hub / "models--owner--stories-GGUF" / "blobs"
    (blobs / ("0" * 64 + ".incomplete")).write_bytes(b"GGUF partial")
    with pytest.raises(HubModelError, match="no .gguf file in the local HF cache has the quant tag Q6_K"):
        resolve_hf_model(REPO, quant="Q6_K")


def test_offline_revision_not_cached_lists_the_cached_ones(stories_repo):
    with pytest.raises(HubModelError, match=r"not at revision v2 \(cached revisions: 4c1e1a1d1f0e \(refs: main\)\)"):
        resolve_hf_model(f"{REPO}:Q8_0", revision="v2")
    assert resolve_hf_model(f"{REPO}:Q8_0", revision=COMMIT).filename == "stories260K-Q8_0.gguf"


# --- loading and generating ----------------------------------------------------------

def test_from_pretrained_generates_the_same_greedy_tokens_as_the_file(stories_repo):
    direct = greedy(dualpath.LLM(embedded_model_path(), dualpath.load_config(None, ONE_THREAD)))
    llm = dualpath.LLM.from_pretrained(REPO, "Q8_0", config=dualpath.load_config(None, ONE_THREAD))
    assert llm.spec.path.endswith(f"snapshots/{COMMIT}/stories260K-Q8_0.gguf")
    hub = greedy(llm)
    assert len(direct.token_ids) == MAX_TOKENS
    assert hub.token_ids == direct.token_ids and hub.text == direct.text


def test_from_pretrained_errors_are_model_load_errors(stories_repo):
    with pytest.raises(ModelLoadError, match=f"{REPO}:Q6_K: no .gguf file"):
        dualpath.LLM.from_pretrained(REPO, "Q6_K")


# --- the command line, as a subprocess with the environment ---------------------------

def test_cli_run_hf_generates_what_the_file_generates(stories_repo):
    expected = greedy(dualpath.LLM(embedded_model_path(), dualpath.load_config(None, ONE_THREAD))).text
    proc = run_cli(["run", "-hf", f"{REPO}:Q8_0", "--temperature", "0", "-n", MAX_TOKENS, "-t", "1",
                    "--no-echo", PROMPT], stories_repo.env)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert proc.stdout.decode() == expected + "\n"
    assert f"dualpath: {REPO}: stories260K-Q8_0.gguf (quant Q8_0, listed from the local HF cache)" in err


def test_select_mmproj_prefers_f16_then_q8_0_then_f32():
    from dualpath.models.hub import select_mmproj

    files = ["m-Q4_K_M.gguf", "mmproj-model-f32.gguf", "mmproj-model-Q8_0.gguf", "mmproj-model-f16.gguf"]
    assert select_mmproj(files) == "mmproj-model-f16.gguf"
    assert select_mmproj(files[:3]) == "mmproj-model-Q8_0.gguf"
    assert select_mmproj(["x/mmproj-SmolVLM-256M-F32.gguf", "a.gguf"]) == "x/mmproj-SmolVLM-256M-F32.gguf"
    assert select_mmproj(["a.gguf", "README.md"]) is None
    llava = ["llava-v1.5-7b-Q4_K_M.gguf", "llava-v1.5-7b-mmproj-model-f16.gguf"]  # second-state's names
    assert select_mmproj(llava) == "llava-v1.5-7b-mmproj-model-f16.gguf"


def test_cli_hf_finds_the_projector_beside_a_vision_model(hf_cache, tmp_path):
    """``run -hf REPO --image FILE``: the repository's projector file is loaded with the model,
    as llama.cpp's ``-hf`` does; ``--no-mmproj`` leaves it out (the image is then refused)."""
    pytest.importorskip("PIL", reason="the [vision] extra (Pillow) decodes images")
    import numpy as np
    from PIL import Image

    from dualpath.models.synth_vision import synth_mmproj, synth_text

    text = synth_text(tmp_path / "text.gguf", "smolvlm-tiny", "F16")
    mmproj = synth_mmproj(tmp_path / "mmproj.gguf", "smolvlm-tiny", "F16")
    write_hf_snapshot(hf_cache.hub, "owner/tiny-vlm", {"tiny-vlm-F16.gguf": Path(text).read_bytes(),
                                                       "mmproj-tiny-vlm-f16.gguf": Path(mmproj).read_bytes()})
    picture = tmp_path / "pic.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 60, 3), dtype=np.uint8)).save(picture)
    args = ["run", "-hf", "owner/tiny-vlm:F16", "--image", picture, "-n", "4", "-t", "1", "What is it?"]
    proc = run_cli(args, hf_cache.env)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "its image projector: owner/tiny-vlm: mmproj-tiny-vlm-f16.gguf" in err
    proc = run_cli(args + ["--no-mmproj"], hf_cache.env)
    assert proc.returncode != 0 and "takes text only" in proc.stderr.decode()


def test_cli_info_hf_and_long_option(stories_repo):
    proc = run_cli(["info", "--hf-repo", f"{REPO}:F32"], stories_repo.env)
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr.decode()
    assert f"model: {stories_repo.hub}/models--owner--stories-GGUF/snapshots/{COMMIT}/stories260K-f32.gguf" in out


def test_cli_model_and_hf_are_mutually_exclusive(stories_repo):
    proc = run_cli(["run", "-m", embedded_model_path(), "-hf", REPO], stories_repo.env)
    assert proc.returncode == 2
    assert "argument -hf/--hf-repo: not allowed with argument -m/--model" in proc.stderr.decode()


def test_cli_offline_missing_repo_is_one_clean_error_line(hf_cache):
    proc = run_cli(["run", "-hf", "owner/missing:Q4_K_M", "hi"], hf_cache.env)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err and proc.stdout == b""
    assert err.startswith("dualpath: error: owner/missing:Q4_K_M: offline mode is on (HF_HUB_OFFLINE=1)")


# --- "online" without a Hub: real loopback connections --------------------------------

def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RESOLVE = ("import sys\nfrom dualpath.errors import ModelLoadError\nfrom dualpath.models.hub import resolve_hf_model\n"
           "try:\n    f = resolve_hf_model(sys.argv[1])\nexcept ModelLoadError as e:\n    print('ERROR', e)\n"
           "else:\n    print('OK', f.filename, f.listed_from)\n")


def resolve_in_subprocess(spec: str, env: dict) -> tuple[str, str]:
    proc = subprocess.run([sys.executable, "-c", RESOLVE, spec], capture_output=True, env=env, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr.decode(), proc.stderr.decode()
    return proc.stdout.decode().strip(), proc.stderr.decode()


def test_unreachable_hub_falls_back_to_the_cache_with_a_warning(stories_repo):
    env = dict(stories_repo.env, HF_HUB_OFFLINE="0", HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}")
    out, err = resolve_in_subprocess(f"{REPO}:Q8_0", env)
    assert out == "OK stories260K-Q8_0.gguf cache"
    assert f"{REPO}: could not reach the Hugging Face Hub (ConnectError" in err


def test_unreachable_hub_with_nothing_cached_is_a_clean_error(hf_cache):
    env = dict(hf_cache.env, HF_HUB_OFFLINE="0", HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}")
    out, _ = resolve_in_subprocess("owner/missing:Q4_K_M", env)
    assert out.startswith("ERROR owner/missing:Q4_K_M: the Hub could not be reached (ConnectError")
    assert "holds no copy of it: run once with network to download it" in out


class RepoNotFoundHandler(http.server.BaseHTTPRequestHandler):
    """Answers every request as the Hub answers for a repository that does not exist."""

    def do_GET(self):  # noqa: N802 - http.server's name
        body = b'{"error":"Repository not found"}'
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("X-Error-Message", "Repository not found")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


def test_repository_not_found_on_the_hub_is_a_clean_error_naming_it(hf_cache):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RepoNotFoundHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = dict(hf_cache.env, HF_HUB_OFFLINE="0", HF_ENDPOINT=f"http://127.0.0.1:{server.server_port}")
        out, _ = resolve_in_subprocess("owner/no-such-repo:Q4_K_M", env)
    finally:
        server.shutdown()
        server.server_close()
    assert out.startswith("ERROR owner/no-such-repo:Q4_K_M: no such repository on the Hub (or it is private")
    assert "while listing the repository's files on the Hub" in out


# --- huggingface_hub stays optional ----------------------------------------------------

def test_package_imports_without_huggingface_hub_and_says_how_to_install_it():
    code = ("import sys\nsys.modules['huggingface_hub'] = None\n"
            "import dualpath, dualpath.cli\nfrom dualpath.models.hub import resolve_hf_model\n"
            "dualpath.cli.build_parser()\n"
            "try:\n    resolve_hf_model('owner/name:Q8_0')\nexcept dualpath.ModelLoadError as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().strip() == ("owner/name:Q8_0: loading from the Hugging Face Hub needs "
                                            "huggingface_hub: pip install 'dualpath[hub]'")
