"""GGUF models from the Hugging Face Hub: ``REPO[:QUANT]`` -> a local file.

``bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M`` names a repository and a quantization
tag, as llama.cpp's ``-hf``. Everything about fetching is huggingface_hub's: its cache
(``HF_HOME`` / ``HF_HUB_CACHE``), resuming a partial download, its progress bar, its
token for gated repos, and offline mode (``HF_HUB_OFFLINE=1``). This module only
chooses the file:

1. List the repository's files: from the Hub, or, offline (or when the Hub cannot be
   reached, with a warning), from the snapshot in the local cache.
2. Choose one ``.gguf`` (``select_gguf``): an explicit file name; else the files whose
   name holds the quant tag (case-insensitive, delimited: ``Q4_K_M`` matches
   ``Llama-3.2-1B-Instruct-Q4_K_M.gguf`` and ``model.q4_k_m.gguf``, never
   ``...-Q4_K_M_L.gguf`` or ``...-IQ4_K_M.gguf``); with no tag, the first of
   ``DEFAULT_QUANTS`` present, else the repository's only model file. Several matches
   are an error that lists them. ``mmproj`` and ``imatrix`` files are never models.
3. ``hf_hub_download`` the choice (a cache hit costs one HEAD request; none offline).

Split GGUFs (``-00001-of-00003.gguf``) are refused with the list of single files: the
loader reads one file, and merging is ``llama-gguf-split --merge``'s job.

huggingface_hub is imported inside the functions: the rest of the package works
without it (``pip install 'dualpath[hub]'``).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

from ..errors import ModelLoadError

log = logging.getLogger(__name__)

DEFAULT_QUANTS = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q4_0", "Q5_K_S", "Q6_K", "Q8_0", "IQ4_NL", "Q4_1",
                  "Q5_0", "Q5_1", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K", "F16", "BF16", "F32")
"""The quant tried when none is given, best first: Q4_K_M (llama.cpp's and Ollama's
default), then its neighbours in size and quality, then the other types the loader
reads (``gguf.SUPPORTED_TYPES``), then unquantized. A type the loader cannot read
(IQ2_XS, ...) is never chosen by default; asked for explicitly, the loader names it."""

SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
"""A part of a split GGUF: ``<prefix>-00001-of-00003.gguf``."""

NOT_MODELS = ("mmproj", "imatrix")
"""``.gguf`` files that are not language models (vision projectors, importance matrices)."""

_LIST_TIMEOUT_S = 10.0
"""How long the file listing waits for the Hub before falling back to the cache."""


class HubModelError(ModelLoadError):
    """A ``REPO[:QUANT]`` could not be turned into a local GGUF file. Names the repository
    and the quant (``path`` is ``REPO:QUANT``), and says what was tried."""

    def __init__(self, repo_id: str, quant: str | None, problem: str):
        self.repo_id = repo_id
        self.quant = quant
        super().__init__(f"{repo_id}:{quant}" if quant else repo_id, problem)


@dataclass(frozen=True)
class HubFile:
    """The file a ``REPO[:QUANT]`` resolved to."""

    repo_id: str
    filename: str
    """The path inside the repository, e.g. ``Llama-3.2-1B-Instruct-Q4_K_M.gguf``."""
    path: str
    """The local file (in huggingface_hub's cache: a symlink into its blobs)."""
    quant: str | None
    """The quant tag that chose it (given, or the default that matched), or None when a
    file name was given or the repository's only model was taken."""
    listed_from: str
    """Where the file list came from: ``"hub"`` or ``"cache"`` (offline or unreachable)."""

    def describe(self) -> str:
        how = f"quant {self.quant}" if self.quant else "the file named"
        where = "the Hub" if self.listed_from == "hub" else "the local HF cache"
        return f"{self.repo_id}: {self.filename} ({how}, listed from {where}) at {self.path}"


def parse_hf_repo(spec: str) -> tuple[str, str | None, str | None]:
    """``REPO[:QUANT]`` or ``REPO:FILE.gguf`` -> (repo_id, quant, filename); the absent
    ones are None. The repo id must be ``OWNER/NAME``."""
    repo_id, _, tail = spec.strip().partition(":")
    tail = tail.strip()
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        raise HubModelError(repo_id or spec, tail or None,
                            "expected a Hugging Face repository as OWNER/NAME[:QUANT] or OWNER/NAME:FILE.gguf, "
                            "e.g. bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M")
    if not tail:
        return repo_id, None, None
    if tail.lower().endswith(".gguf"):
        return repo_id, None, tail
    return repo_id, tail, None


def resolve_hf_model(repo: str, quant: str | None = None, filename: str | None = None, *,
                     revision: str | None = None, cache_dir: str | os.PathLike | None = None,
                     offline: bool | None = None) -> HubFile:
    """Download (or find in the cache) the GGUF that ``repo`` names; see the module docstring.

    ``repo`` is ``OWNER/NAME``, ``OWNER/NAME:QUANT`` or ``OWNER/NAME:FILE.gguf``; ``quant``
    and ``filename`` say the same as keywords (not both). ``cache_dir`` defaults to
    huggingface_hub's (``HF_HUB_CACHE``). ``offline`` defaults to ``HF_HUB_OFFLINE``, read
    from the environment now as well as by huggingface_hub at its import.
    Raises ``HubModelError`` (a ``ModelLoadError``) for every failure."""
    repo_id, spec_quant, spec_file = parse_hf_repo(repo)
    for given, in_spec, what in ((quant, spec_quant, "quant"), (filename, spec_file, "filename")):
        if given and in_spec and given.lower() != in_spec.lower():
            raise HubModelError(repo_id, quant or spec_quant,
                                f"{what} given twice and differently: {in_spec!r} in the name, {given!r} as argument")
    quant = quant or spec_quant or None
    filename = filename or spec_file or None
    if quant and filename:
        raise HubModelError(repo_id, quant, f"give a quant or a file name ({filename}), not both")
    files, commit, listed_from, cache_dir, offline = _listing(repo_id, quant, revision, cache_dir, offline)
    chosen, chosen_by = select_gguf(repo_id, files, quant=quant, filename=filename, listed_from=listed_from)
    # Offline or unreachable: pin the cached snapshot the listing came from.
    path = _download(repo_id, chosen_by or quant, chosen, commit if listed_from == "cache" else revision,
                     cache_dir, local_only=offline or listed_from == "cache", offline=offline)
    found = HubFile(repo_id=repo_id, filename=chosen, path=path, quant=chosen_by, listed_from=listed_from)
    log.info("resolved %s", found.describe())
    return found


MMPROJ_PREFERENCE = ("f16", "q8_0", "f32")
"""A projector file's weight type, in the order one beside a model is chosen (the types
projector files may have: models/mmproj.py)."""


def select_mmproj(files: list[str]) -> str | None:
    """The projector file (a ``.gguf`` whose name has ``mmproj``: ``mmproj-model-f16.gguf``, and
    LLaVA repositories' ``llava-v1.5-7b-mmproj-model-f16.gguf``) among a repository's ``files``,
    as llama.cpp's ``-hf`` finds one beside the model: F16 before Q8_0 before F32; None when
    there is none."""
    found = sorted(f for f in files if "mmproj" in os.path.basename(f).lower() and f.lower().endswith(".gguf"))
    for kind in MMPROJ_PREFERENCE:
        for f in found:
            if re.search(rf"(^|[-_.]){kind}[-_.]", os.path.basename(f).lower()):
                return f
    return found[0] if found else None


def resolve_hf_mmproj(repo: str, *, revision: str | None = None, cache_dir: str | os.PathLike | None = None,
                      offline: bool | None = None) -> HubFile | None:
    """The projector file beside the model ``repo`` names (``select_mmproj``), downloaded or
    found in the cache; None when the repository has none. Errors as ``resolve_hf_model``'s."""
    repo_id, quant, _ = parse_hf_repo(repo)
    files, commit, listed_from, cache_dir, offline = _listing(repo_id, quant, revision, cache_dir, offline)
    chosen = select_mmproj(files)
    if chosen is None:
        return None
    path = _download(repo_id, quant, chosen, commit if listed_from == "cache" else revision, cache_dir,
                     local_only=offline or listed_from == "cache", offline=offline)
    return HubFile(repo_id=repo_id, filename=chosen, path=path, quant=None, listed_from=listed_from)


def select_gguf(repo_id: str, files: list[str], quant: str | None = None, filename: str | None = None,
                listed_from: str = "hub") -> tuple[str, str | None]:
    """The model file to load among ``files`` (paths inside the repository), and the quant
    tag that chose it (None for a file name or the only model). Pure: no I/O."""
    where = "on the Hub" if listed_from == "hub" else "in the local HF cache"
    cached_only = " (the cache holds only files downloaded before)" if listed_from == "cache" else ""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf"))
    models = [f for f in ggufs if not any(word in os.path.basename(f).lower() for word in NOT_MODELS)]
    available = _describe_files(models) if models else "none"
    if filename:
        exact = [f for f in ggufs if f == filename] or [f for f in ggufs if f.lower() == filename.lower()] \
            or [f for f in ggufs if os.path.basename(f).lower() == filename.lower()]
        if len(exact) != 1:
            problem = "no such .gguf file" if not exact else f"{len(exact)} files of that name ({', '.join(exact)})"
            raise HubModelError(repo_id, filename, f"{problem} {where}; model files there: {available}{cached_only}")
        _refuse_split(repo_id, filename, exact[0], models)
        return exact[0], None
    if not models:
        raise HubModelError(repo_id, quant, f"no .gguf model file {where} "
                                            f"({len(files)} files; is it a GGUF repository?)")
    for tag in ((quant,) if quant else DEFAULT_QUANTS):
        matches = _matching(models, tag)
        if matches:
            break
    else:
        if quant:
            raise HubModelError(repo_id, quant, f"no .gguf file {where} has the quant tag {quant} in its name "
                                                f"(case-insensitive); model files there: {available}{cached_only}")
        if len(_group_splits(models)) > 1:
            raise HubModelError(repo_id, None, f"no quant given and none of the default quants "
                                               f"({', '.join(DEFAULT_QUANTS)}) is {where}; choose one of: "
                                               f"{available} (as REPO:QUANT or REPO:FILE.gguf)")
        tag, matches = None, models
    groups = _group_splits(matches)
    if len(groups) > 1:
        raise HubModelError(repo_id, tag, f"{len(groups)} files {where} match quant {tag}: "
                                          f"{_describe_files(matches)}; name one as REPO:FILE.gguf")
    parts = next(iter(groups.values()))
    _refuse_split(repo_id, tag, parts[0], models)
    return parts[0], tag


def _matching(models: list[str], tag: str) -> list[str]:
    # Delimited on both sides: Q4_K does not match ...-Q4_K_M.gguf, nor Q4_XS ...-IQ4_XS.gguf.
    pattern = re.compile(r"(?<![A-Za-z0-9])" + re.escape(tag) + r"(?=[-./])", re.IGNORECASE)
    return [f for f in models if pattern.search(f)]


def _group_splits(files: list[str]) -> dict[str, list[str]]:
    """Files grouped by model: the parts of a split GGUF form one group, in order."""
    groups: dict[str, list[str]] = {}
    for f in sorted(files):
        m = SPLIT_RE.search(f)
        groups.setdefault(f[:m.start()] if m else f, []).append(f)
    return groups


def _describe_files(files: list[str]) -> str:
    out = []
    for prefix, parts in _group_splits(files).items():
        m = SPLIT_RE.search(parts[0])
        out.append(f"{prefix}-*-of-{m.group(2)}.gguf (split)" if m else parts[0])
    return ", ".join(out)


def _refuse_split(repo_id: str, quant: str | None, chosen: str, models: list[str]) -> None:
    m = SPLIT_RE.search(chosen)
    if not m:
        return
    singles = [f for f in models if not SPLIT_RE.search(f)]
    raise HubModelError(repo_id, quant, f"{chosen[:m.start()]} is a split GGUF in {int(m.group(2))} parts; "
                                        "DualPath loads single-file GGUFs (merge the parts with "
                                        "`llama-gguf-split --merge` and pass the file with --model). "
                                        f"Single files here: {', '.join(singles) or 'none'}")


def _offline() -> bool:
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return env in ("1", "ON", "YES", "TRUE") or bool(constants.HF_HUB_OFFLINE)


def _is_network_error(e: Exception) -> bool:
    """True for "the Hub could not be reached": huggingface_hub's offline guard, a
    connection error or a timeout from its transport (requests in 0.x, httpx after)."""
    from huggingface_hub.utils import HfHubHTTPError, OfflineModeIsEnabled

    if isinstance(e, OfflineModeIsEnabled):
        return True
    if isinstance(e, HfHubHTTPError):  # the Hub answered
        status = getattr(getattr(e, "response", None), "status_code", None)
        return status is not None and status >= 500
    module = type(e).__module__.split(".")[0]
    return isinstance(e, (ConnectionError, TimeoutError)) or module in (
        "requests", "urllib3", "httpx", "httpcore", "httpx2", "httpcore2")


def _one_line(e: Exception) -> str:
    """``Type: message`` on one line (huggingface_hub's messages span several)."""
    return f"{type(e).__name__}: {' '.join(str(e).split())}"


def _hub_error(repo_id: str, quant: str | None, e: Exception, doing: str) -> HubModelError:
    """huggingface_hub's exception -> one that says what to do about it."""
    from huggingface_hub.utils import GatedRepoError, HFValidationError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(e, GatedRepoError):
        problem = ("is gated: accept its terms on huggingface.co and log in (`hf auth login` or HF_TOKEN)")
    elif isinstance(e, RepositoryNotFoundError):
        problem = "no such repository on the Hub (or it is private: log in with `hf auth login` or set HF_TOKEN)"
    elif isinstance(e, RevisionNotFoundError):
        problem = "no such revision on the Hub"
    elif isinstance(e, HFValidationError):
        problem = f"not a valid repository id ({e})"
    else:
        problem = _one_line(e)
    return HubModelError(repo_id, quant, f"{problem} (while {doing})")


def _listing(repo_id: str, quant: str | None, revision: str | None, cache_dir: str | os.PathLike | None,
             offline: bool | None) -> tuple[list[str], str | None, str, str, bool]:
    """``_list_files`` with huggingface_hub's defaults filled in: (files, cached commit or None,
    "hub" | "cache", the cache folder, offline); a HubModelError without huggingface_hub."""
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise HubModelError(repo_id, quant, "loading from the Hugging Face Hub needs huggingface_hub: "
                                            "pip install 'dualpath[hub]'") from None
    from huggingface_hub import constants

    offline = _offline() if offline is None else offline
    folder = os.fspath(cache_dir) if cache_dir is not None else constants.HF_HUB_CACHE
    return (*_list_files(repo_id, quant, revision, folder, offline), folder, offline)


def _list_files(repo_id: str, quant: str | None, revision: str | None, cache_dir: str,
                offline: bool) -> tuple[list[str], str | None, str]:
    """(files in the repository, the cached commit they came from or None, "hub" | "cache")."""
    unreachable = ""
    if not offline:
        from huggingface_hub import model_info

        # model_info, not list_repo_files: one request (its siblings are every file), where
        # list_repo_files pages through the tree with retries, whose backoff keeps a user
        # waiting when the network is down before the cache is even looked at.
        try:
            info = model_info(repo_id, revision=revision, timeout=_LIST_TIMEOUT_S)
            return [s.rfilename for s in info.siblings or ()], None, "hub"
        except Exception as e:  # noqa: BLE001 - translated below; the transport's classes vary by version
            if not _is_network_error(e):
                raise _hub_error(repo_id, quant, e, "listing the repository's files on the Hub") from e
            unreachable = _one_line(e)
        log.warning("%s: could not reach the Hugging Face Hub (%s); looking in the local cache %s",
                    repo_id, unreachable, cache_dir)
    cached = _cached_files(repo_id, revision, cache_dir)
    if isinstance(cached, tuple):
        return cached[0], cached[1], "cache"
    why = "offline mode is on (HF_HUB_OFFLINE=1)" if offline else f"the Hub could not be reached ({unreachable})"
    fix = "unset HF_HUB_OFFLINE and run once with network" if offline else "run once with network"
    raise HubModelError(repo_id, quant, f"{why}, and the local HF cache {cache_dir} {cached}: {fix} to download it")


def _cached_files(repo_id: str, revision: str | None, cache_dir: str) -> tuple[list[str], str] | str:
    """(files, commit) of the cached snapshot of ``repo_id`` at ``revision`` (default
    ``main``), or why there is none. Lists complete files only: huggingface_hub keeps a
    partial download as ``blobs/*.incomplete`` and links it into the snapshot when done."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.utils import CacheNotFound

    try:
        info = scan_cache_dir(cache_dir)
    except CacheNotFound:
        return "does not exist"
    except (OSError, ValueError) as e:
        return f"cannot be read ({e})"
    repos = [r for r in info.repos if r.repo_type == "model" and r.repo_id == repo_id]
    if not repos:
        folder = "models--" + repo_id.replace("/", "--")
        damaged = [str(w) for w in info.warnings if folder in str(w)]
        return (f"holds a damaged copy of it ({'; '.join(damaged)})" if damaged else "holds no copy of it")
    wanted = revision or "main"
    revisions = [r for r in repos[0].revisions if wanted in r.refs or r.commit_hash == wanted]
    if not revisions:
        cached = ", ".join(f"{r.commit_hash[:12]} (refs: {', '.join(sorted(r.refs)) or 'none'})"
                           for r in repos[0].revisions) or "none"
        return f"holds it, but not at revision {wanted} (cached revisions: {cached})"
    rev = revisions[0]
    return sorted(f.file_path.relative_to(rev.snapshot_path).as_posix() for f in rev.files), rev.commit_hash


def _download(repo_id: str, quant: str | None, filename: str, revision: str | None, cache_dir: str,
              local_only: bool, offline: bool) -> str:
    from importlib.metadata import PackageNotFoundError, version

    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import LocalEntryNotFoundError

    try:  # (the package's __version__ sits above this layer)
        lib_version = version("dualpath")
    except PackageNotFoundError:
        lib_version = "unknown"
    try:
        return hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache_dir,
                               local_files_only=local_only, library_name="dualpath", library_version=lib_version)
    except LocalEntryNotFoundError as e:
        why = "offline mode is on (HF_HUB_OFFLINE=1)" if offline else "the Hub could not be reached"
        raise HubModelError(repo_id, quant, f"{filename} is not in the local HF cache {cache_dir} and {why}") from e
    except Exception as e:  # noqa: BLE001 - translated: never a raw transport traceback
        if _is_network_error(e):
            raise HubModelError(repo_id, quant, f"could not download {filename}: the Hub could not be reached "
                                                f"({_one_line(e)})") from e
        raise _hub_error(repo_id, quant, e, f"downloading {filename}") from e


__all__ = ["DEFAULT_QUANTS", "HubFile", "HubModelError", "parse_hf_repo", "resolve_hf_mmproj", "resolve_hf_model",
           "select_gguf", "select_mmproj"]
