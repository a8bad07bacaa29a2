"""DualPath configuration: YAML files that map onto nested, frozen dataclasses.

A file has one top-level key per section (``kv_cache:``, ``runtime:``);
``configs/default.yaml`` lists every key with its default. Each setting carries its
type and allowed range as field metadata, and ``check_settings`` (run from every
dataclass's ``__post_init__``) is the one place they are enforced, so a config
built in code is checked exactly like one loaded from a file.

To add a section: write a frozen ``_Section`` dataclass with a ``_section`` name and
``setting(...)`` fields, then add it to ``Config`` with ``section(TheClass)``.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import numbers
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import yaml

from dualpath.errors import ConfigError
from dualpath.kernels import KERNEL_ISAS, KV_DTYPES

log = logging.getLogger(__name__)

OVERRIDES_SOURCE = "<overrides>"
"""What errors name as the file when a bad value came from ``overrides``."""

RENAMED_KEYS: dict[str, str] = {"runtime.attention_kernel": "runtime.kernel_isa"}
"""Old dotted keys and their new names: a config, ``--set`` or override written for an
earlier release keeps working, read as the new key with a deprecation warning. The KV
cache section's entries (``dualpath_config`` -> ``kv_cache``, ``block_size`` ->
``block_bytes``) are added below ``KVCacheConfig``."""


# ---------------------------------------------------------------------------
# Settings: a field with a type, an allowed range and its description.
# ---------------------------------------------------------------------------

def setting(default: Any, kind: type, ok: Callable[[Any], bool] | None, allowed: str,
            *, optional: bool = False) -> Any:
    """A dataclass field checked by ``check_settings``.

    ``kind`` is int, float, str, bool or tuple; bool never passes as int or float,
    ints pass as floats (and are stored as float), floats must be finite.
    ``ok`` tests the range; ``allowed`` says it in words for error messages;
    ``optional`` lets None through.
    """
    meta = {"kind": kind, "ok": ok, "allowed": allowed, "optional": optional}
    return field(default=default, metadata=meta)


def _type_ok(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return kind is bool
    if kind is int:
        return isinstance(value, numbers.Integral)
    if kind is float:
        return isinstance(value, numbers.Real)
    return isinstance(value, kind)


def check_settings(obj: Any, prefix: str, error: type[Exception]) -> None:
    """Check (and normalise int->float, numpy scalars->Python) every ``setting`` of ``obj``.

    Raises ``error("<prefix><name>=<value> must be <allowed>")``.
    """
    for f in fields(obj):
        meta = f.metadata
        if "kind" not in meta:
            continue
        value = getattr(obj, f.name)
        if value is None and meta["optional"]:
            continue
        kind, where = meta["kind"], f"{prefix}{f.name}={value!r} must be {meta['allowed']}"
        if not _type_ok(value, kind):
            hint = ""
            if kind is float and isinstance(value, str) and _parses_as_float(value):
                hint = "; write the number unquoted, with a dot before any exponent: 1.0e-3, not 1e-3"
            if kind is str and isinstance(value, bool):
                hint = "; YAML reads an unquoted off, on, yes or no as false or true: write it quoted, \"off\""
            raise error(f"{where} (got {type(value).__name__}{hint})")
        if kind in (int, float):
            value = kind(value)
            object.__setattr__(obj, f.name, value)
        if (kind is float and not math.isfinite(value)) or (meta["ok"] and not meta["ok"](value)):
            raise error(where)


def _parses_as_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _int(default: int, lo: int, hi: int | None = None, *, pow2: bool = False,
         allowed: str | None = None) -> Any:
    def ok(v: int) -> bool:
        return lo <= v and (hi is None or v <= hi) and (not pow2 or v & (v - 1) == 0)

    if allowed is None:
        span = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        allowed = f"{'a power of two' if pow2 else 'an integer'} {span}"
    return setting(default, int, ok, allowed)


def _float(default: float, lo: float, hi: float) -> Any:
    return setting(default, float, lambda v: lo <= v <= hi, f"a number between {lo:g} and {hi:g}")


def _choice(default: Any, kind: type, choices: tuple) -> Any:
    return setting(default, kind, lambda v: v in choices, f"one of {', '.join(map(repr, choices))}")


# ---------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------

def section(cls: type) -> Any:
    """A ``Config`` field holding a nested section (defaults to ``cls()``)."""
    return field(default_factory=cls, metadata={"section": cls})


class _Section:
    """Base of every config dataclass: validates its settings on construction."""

    _section: ClassVar[str] = ""
    """Dotted path of this section in the YAML file ("" for the top level)."""

    def __post_init__(self) -> None:
        prefix = f"{self._section}." if self._section else ""
        check_settings(self, prefix, ConfigError)
        for f in fields(self):  # type: ignore[arg-type]  # every _Section subclass is a dataclass
            cls = f.metadata.get("section")
            if cls is not None and not isinstance(getattr(self, f.name), cls):
                raise ConfigError(f"{prefix}{f.name} must be a {cls.__name__}, "
                                  f"got {type(getattr(self, f.name)).__name__}")


@dataclass(frozen=True)
class KVCacheConfig(_Section):
    """The dual-path KV cache: block geometry and how requests pick a path (the section
    was called ``dualpath_config`` before; ``RENAMED_KEYS`` still reads it)."""

    _section: ClassVar[str] = "kv_cache"

    block_bytes: int = _int(131072, 4096, 16 << 20, pow2=True,
                            allowed="a power of two between 4096 (4 KiB) and 16777216 (16 MiB)")
    """Bytes per KV arena block, per layer (``block_size`` before: a quantized weight's
    ``block_size`` counts values, this one bytes)."""
    seq_path_threshold: int = _int(8192, 1)
    """Context length in tokens from which a request takes the sequential path."""
    locality_window: int = _int(512, 1)
    """Contiguous run length (tokens) that counts as local: the locality score is the
    share of a sequence's KV reads in runs at least this long."""
    prefetch_degree: int = _int(4, 0, 64)
    """Spans (pages) prefetched ahead by the attention kernel on the random path (0 = off)."""
    page_tokens: int = _int(16, 1, 1024, pow2=True)
    """Tokens per KV page."""
    locality_threshold: float = _float(0.5, 0.0, 1.0)
    """Locality score at or above which the sequential path is chosen."""
    path_mode: str = _choice("dual", str, ("dual", "sequential", "random"))
    """``dual`` routes per request; ``sequential`` or ``random`` force one path."""
    kv_dtype: str = _choice("f16", str, KV_DTYPES)
    """Element type of cached keys and values: ``f16``; ``f32``; or ``q8``, int8 with one
    f32 scale per token and KV head (about half the bytes of f16, in memory and in
    every decode step's reads; quality figures in docs/performance.md). q8 needs an even
    head_dim (cache/geometry.py reads the rule from the C table)."""
    numa_node: int = _int(-1, -1, 63)
    """NUMA node the arena is bound to (mbind before first touch); -1 = no binding."""
    swa_cache: str = _choice("window", str, ("window", "full"))
    """Sliding-window layers (Gemma 2 and 3): ``window`` gives back the memory of positions
    behind a sequence's window, keeping what prefix reuse needs (cache/windows.py); ``full``
    keeps every position (llama.cpp's ``--swa-full``)."""
    swa_checkpoint_tokens: int = _int(4096, 0, 1 << 20)
    """With ``swa_cache: window``, a window is also kept before every multiple of this many
    positions, so that a prompt sharing a long prefix reuses it up to the last such point
    before it parts; 0 = none (the least memory)."""

    @property
    def block_size(self) -> int:
        """Deprecated: ``block_bytes``. Kept while code written against the old name is
        merged (issue-42 branches); remove once nothing reads it."""
        return self.block_bytes


DualPathConfig = KVCacheConfig
"""The old name of ``KVCacheConfig``, still importable from ``dualpath``."""

RENAMED_KEYS.update({"dualpath_config": "kv_cache", "dualpath_config.block_size": "kv_cache.block_bytes",
                     "kv_cache.block_size": "kv_cache.block_bytes"})
RENAMED_KEYS.update({f"dualpath_config.{f.name}": f"kv_cache.{f.name}"
                     for f in fields(KVCacheConfig) if f.name != "block_bytes"})


ORT_THREAD_POOLS = ("shared", "per_part")
"""``runtime.ort_thread_pools`` choices: see RuntimeConfig."""
SPECULATIVE_MODES = ("off", "ngram", "draft")
"""``runtime.speculative`` choices: see RuntimeConfig."""
CHAT_TEMPLATES = ("chatml", "llama3", "gemma", "vicuna", "phi3")
"""The built-in chat templates' names (``runtime.chat_template``, ``--chat-template``), in
the order messages list them. Their Jinja sources are tokenizer/chat_templates.py's
``BUILTIN``, keyed by these names; the list lives here because the config, the lowest
layer, validates the setting."""


@dataclass(frozen=True)
class RuntimeConfig(_Section):
    """ONNX Runtime sessions: threads, context and prefill sizes."""

    _section: ClassVar[str] = "runtime"

    num_threads: int = _int(0, 0, 1024, allowed="an integer: 0 (all usable cores) or between 1 and 1024")
    """Intra-op threads; 0 = every core this process may run on (``os.sched_getaffinity``)."""
    max_context_tokens: int = _int(0, 0, allowed="an integer: 0 (the model's trained context length) or >= 1")
    """Context window in tokens; 0 = the model's trained context length, at most
    ``memory_plan.DEFAULT_MAX_CONTEXT`` and lowered to what MemAvailable allows (a log line
    names the file's own). A context given here whose memory plan is over MemAvailable is
    refused with the figures before anything grows with it."""
    prefill_chunk_tokens: int = _int(512, 1, 65536)
    """Prompt tokens per prefill step."""
    quantized_matmul_accuracy: int = _choice(4, int, (0, 1, 2, 3, 4))
    """MatMulNBits ``accuracy_level``: 4 = int8 activations (as llama.cpp), 0 = unset."""
    intra_op_spinning: bool = setting(True, bool, None, "true or false")
    """Let idle ORT threads spin (lower latency, more power)."""
    ort_thread_pools: str = _choice("shared", str, ORT_THREAD_POOLS)
    """With spinning: ``shared``, one ONNX Runtime pool for every graph part, whose workers
    stay hot from part to part and spin on for tens of milliseconds after a Run; while
    our pool's jobs run they yield their cores (under SCHED_IDLE, back after the job)
    where the process may take a thread out of SCHED_IDLE again (CAP_SYS_NICE or
    RLIMIT_NICE), else a decode's attention runs on the calling thread. ``per_part``, a
    pool per part whose workers stop spinning when its Run returns, so our attention
    gets every core, but each part's Run starts with its worker asleep (TinyLlama-shape
    decode slower; docs/performance.md)."""
    kernel_isa: str = _choice("auto", str, ("auto",) + tuple(KERNEL_ISAS))
    """Kernel ISA of attention, the KV writes, a layer's products and the classifier (one
    row of csrc/cpu_features.c's dp_isas): ``auto`` picks the best this CPU supports (minus
    DUALPATH_DISABLE_CPU_FEATURES); naming one that is not available is an error. Was
    ``runtime.attention_kernel`` (still read: ``RENAMED_KEYS``)."""
    max_num_seqs: int = _int(8, 1, 1024)
    """Requests the engine runs at once (decoding or in prefill); the rest wait in the queue."""
    max_batch_tokens: int = _int(0, 0, 1 << 20, allowed="an integer: 0 (prefill_chunk_tokens + max_num_seqs) "
                                                        "or between 1 and 1048576")
    """Tokens per engine step, all requests together (decode tokens first, then
    prefill chunks); 0 = one prefill chunk plus a decode token per running request."""
    kv_cache_tokens: int = _int(0, 0, allowed="an integer: 0 (twice the context) or >= 1")
    """Tokens the KV cache holds, all requests together (at least one full context);
    0 = twice the context window. When it is full the engine preempts (recompute)."""
    memory_budget_mb: int = _int(0, -1, 1 << 30, allowed="an integer: 0 (none), -1 (auto) or a size in MiB")
    """Resident memory the model may take (executor/memory_plan.py plans it from the file's
    header before any weight is read): the load takes the largest context (up to
    ``max_context_tokens``, 0: the model's) and KV type that fit, or is refused with the
    figures. -1 = auto: MemAvailable less headroom for the OS; 0 = no budget."""
    chat_template: str = setting("", str, lambda v: v == "" or v in CHAT_TEMPLATES,
                                 f"'' (the model's own) or one of {', '.join(CHAT_TEMPLATES)}")
    """A built-in chat template used instead of the model file's (tokenizer/chat_templates.py)."""
    chat_template_timeout_s: float = _float(2.0, 0.01, 3600.0)
    """Longest a chat template may take to render; past it the request is refused
    (tokenizer/render.py renders in a worker process, killed at the deadline)."""
    chat_template_max_chars: int = _int(4 << 20, 1024, 1 << 30)
    """Largest text a chat template may render, and largest value it may build on the way
    (a repeated or joined string, a range); past it the request is refused."""
    speculative: str = _choice("off", str, SPECULATIVE_MODES)
    """Speculative decoding: ``ngram`` proposes a request's next tokens from its own text
    (prompt lookup, no second model; engine/speculative.py), ``draft`` from
    ``draft_model``; either is checked in one step, and the output is the same as with ``off``."""
    speculative_tokens: int = _int(16, 1, 64)
    """Most tokens proposed per step (the draft length adapts below it)."""
    draft_model: str = setting("", str, None, "a GGUF path ('' = none)")
    """With ``speculative: draft``: a smaller model with the same vocabulary, run in this
    process with a KV cache of its own."""
    encoder_share: float = _float(0.3, 0.05, 4.0)
    """Beside chats, the most time an embedding model's work may add to an engine step, as a
    share of that step's own (0.3: chats decode about 1/1.3 as fast while embeddings run;
    what the encoder evicts from the caches costs the chats a little more)."""
    image_encoder_share: float = _float(1.0, 0.05, 4.0)
    """The same for encoding images (a model given ``mmproj``), a piece of an encode at a
    time, where the encode runs between the engine's steps (``image_encoder_threads``): 1.0,
    chats get about half of the time while an image is encoded, and the image twice its own."""
    image_encoder_threads: int = _int(0, 0, 1024)
    """Beside chats, an image's encode runs on a thread of its own with this many of the
    ``num_threads`` threads, and the chats' kernels on the others while it lasts (each side
    takes them all when the other has nothing to do). 0: half of them, at least one. With one
    thread, a value that leaves the chats none, or a projector whose products are ONNX
    Runtime's (its threads cannot be lent), the encode runs between the engine's steps."""

    def effective_max_batch_tokens(self) -> int:
        return self.max_batch_tokens or self.prefill_chunk_tokens + self.max_num_seqs

    def effective_num_threads(self) -> int:
        """``num_threads``, or the number of usable cores when it is 0."""
        if self.num_threads:
            return self.num_threads
        if hasattr(os, "sched_getaffinity"):
            return len(os.sched_getaffinity(0))
        return os.cpu_count() or 1


_CPU_CLASSES_RE = r"\s*|\d+(-\d+)?:(prime|big|mid|little)(,\d+(-\d+)?:(prime|big|mid|little))*"


@dataclass(frozen=True)
class PowerConfig(_Section):
    """The power-aware CPU scheduler: which cores prefill and decode run on, and when
    ``auto`` switches between the performance, balanced and low_power profiles."""

    _section: ClassVar[str] = "power"

    profile: str = _choice("auto", str, ("auto", "performance", "balanced", "low_power"))
    """``performance``, ``balanced``, ``low_power``, or ``auto`` (chosen from battery and temperature)."""
    cpu_classes: str = setting("", str, lambda v: re.fullmatch(_CPU_CLASSES_RE, v) is not None,
                               "\"\" (detect from sysfs) or CPUS:CLASS items joined by commas, CPUS a number "
                               "or a range, CLASS prime, big, mid or little: \"0-3:little,4-7:big\"")
    """Declared core classes instead of the detected ones, e.g. ``0:big,1:little``; CPUs
    not named are left unused. The environment variable DUALPATH_CPU_CLASSES wins over it."""
    pin_threads: bool = setting(True, bool, None, "true or false")
    """Pin the calling thread, ONNX Runtime's workers and our pool to the phase's cores;
    false leaves placement to the OS."""
    use_smt: bool = setting(False, bool, None, "true or false")
    """One thread per logical CPU (SMT siblings too) instead of one per physical core."""
    prefill_max_threads: int = _int(0, 0, 1024, allowed="an integer: 0 (no cap) or between 1 and 1024")
    """Cap on prefill threads; 0 = one per core of the prefill class."""
    decode_max_threads: int = _int(0, 0, 1024, allowed="an integer: 0 (no cap) or between 1 and 1024")
    """Cap on decode threads; 0 = one per core of the decode class."""
    low_power_max_threads: int = _int(2, 0, 1024, allowed="an integer: 0 (no cap) or between 1 and 1024")
    """Cap on the threads of each phase in low_power (which uses half the little cores, at least one)."""
    low_power_prefill_chunk_tokens: int = _int(128, 1, 65536)
    """Prompt tokens per prefill step in low_power (the smaller of this and runtime.prefill_chunk_tokens)."""
    low_power_seq_path_threshold: int = _int(32768, 1)
    """In low_power, the path policy's seq_path_threshold when larger than
    kv_cache.seq_path_threshold: contexts below it stay on pages (hybrid
    prefill, random or sequential decode by locality) and migrate later."""
    low_battery_pct: float = _float(20.0, 0.0, 100.0)
    """auto: battery below this percentage while discharging -> low_power."""
    resume_battery_pct: float = _float(30.0, 0.0, 100.0)
    """auto: leave battery low_power only once above this percentage (or charging)."""
    thermal_margin_c: float = _float(5.0, 0.0, 100.0)
    """auto: a thermal zone within this many degrees C of its trip point -> low_power."""
    thermal_hot_c: float = _float(85.0, 0.0, 150.0)
    """auto: the hottest thermal zone at or above this (degrees C) -> low_power."""
    battery_hot_c: float = _float(42.0, 0.0, 150.0)
    """auto: a battery at or above this (degrees C) -> low_power."""
    no_battery_profile: str = _choice("balanced", str, ("performance", "balanced", "low_power"))
    """auto: the profile when no battery is readable (desktops, VMs, edge boxes, and phones
    whose sysfs is denied without termux-api) and nothing is hot."""
    thermal_hysteresis_c: float = _float(5.0, 0.0, 100.0)
    """auto: leave thermal low_power only once every limit above is this many degrees C away."""
    min_switch_interval_s: float = _float(10.0, 0.0, 3600.0)
    """auto: at least this many seconds between two profile switches."""
    poll_interval_s: float = _float(5.0, 0.0, 3600.0)
    """auto: read battery and temperature at most this often (seconds)."""
    termux_timeout_s: float = _float(2.0, 0.1, 60.0)
    """Seconds to wait for ``termux-battery-status`` (it can hang)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.resume_battery_pct < self.low_battery_pct:
            raise ConfigError(f"power.resume_battery_pct={self.resume_battery_pct!r} must be >= "
                              f"power.low_battery_pct ({self.low_battery_pct!r}), or auto would flap")


PROFILE_OVERRIDES: dict[str, dict[str, tuple[str, str | bool]]] = {
    "low_power": {
        "runtime.prefill_chunk_tokens": ("min", "power.low_power_prefill_chunk_tokens"),
        "runtime.intra_op_spinning": ("set", False),
        "kv_cache.seq_path_threshold": ("max", "power.low_power_seq_path_threshold"),
    },
}
"""What each power profile overrides, the one table: setting -> (how, with what): ``min`` or
``max`` of the setting and a ``power.*`` value, or ``set`` to a value. The governor's plans
(platform/profiles.py) and the path policy (cache/policy.py) read it through
``profile_value``; which cores and how many threads a profile uses is
``platform.profiles.resolve_plan``'s."""


def profile_value(profile: str, key: str, value: Any, power: PowerConfig | None) -> Any:
    """``value`` of setting ``key`` (``section.name``) under power ``profile``: as
    ``PROFILE_OVERRIDES`` says, or unchanged (no override, or no ``power`` section to read)."""
    rule = PROFILE_OVERRIDES.get(profile, {}).get(key)
    if rule is None or power is None:
        return value
    how, source = rule
    other = getattr(power, source.removeprefix("power.")) if isinstance(source, str) else source
    return min(value, other) if how == "min" else max(value, other) if how == "max" else other


@dataclass(frozen=True)
class ServerConfig(_Section):
    """The OpenAI-compatible HTTP server (``dualpath serve``)."""

    _section: ClassVar[str] = "server"

    host: str = setting("127.0.0.1", str, lambda v: bool(v.strip()), "a host name or address")
    """Address to bind: loopback unless told otherwise."""
    port: int = _int(8080, 0, 65535)
    """TCP port; 0 = any free port."""
    api_key: str = setting("", str, None, "a string ('' = no authentication)")
    """When set, every /v1 request needs ``Authorization: Bearer <api_key>``. A key given
    on a command line shows in ``ps``: prefer ``api_key_file`` or $DUALPATH_API_KEY."""
    api_key_file: str = setting("", str, None, "a file path ('' = none)")
    """A file whose content (stripped) is the API key, when ``api_key`` is ''."""
    allowed_hosts: str = setting("", str, lambda v: "/" not in v and " " not in v.strip(),
                                 "host names joined by commas, e.g. \"mybox.lan,mybox\", or \"*\"")
    """Host names a request's ``Host`` header may carry besides the loopback ones (localhost,
    127.0.0.1, [::1]). On a loopback bind nothing else is answered (403), so a web page that
    rebinds its own name to 127.0.0.1 cannot read the server; on another bind the check applies
    only when this is set. ``*``: no check."""
    max_connections: int = _int(1000, 8, 1 << 20)
    """Open connections at most (held below the process's file limit); past it the oldest
    connection with no request in progress is closed to make room."""
    header_timeout_s: float = _float(10.0, 0.1, 3600.0)
    """A request's headers must arrive within this many seconds of its first byte (or of the
    connection's opening); a slower client is disconnected."""
    body_timeout_s: float = _float(60.0, 0.1, 3600.0)
    """A request's body must arrive within this many seconds of its headers; a slower client
    is disconnected (a body trickled a byte at a time would otherwise hold its connection)."""
    max_body_bytes: int = setting(0, int, lambda v: v == 0 or 1024 <= v <= 1 << 30,
                                  "0 (automatic) or an integer between 1024 and 1073741824")
    """Largest request body accepted (413 above it); 0: ``1 << 20``, or server/app.py's
    ``IMAGE_BODY_BYTES`` where the model takes images (a photo's ``data:`` URL is its bytes
    and a third more)."""
    max_queued_requests: int = _int(64, 0, 1 << 20)
    """Requests waiting for a slot beyond the running ones; more get 429 with Retry-After."""
    model_name: str = setting("", str, None, "a string ('' = the model file's name)")
    """The model id that /v1/models lists and responses carry (``dualpath serve --alias``)."""
    webui: bool = setting(True, bool, None, "true or false")
    """Serve the chat page at ``/`` (static files shipped in the package; ``--no-webui``)."""
    strict_model_name: bool = setting(False, bool, None, "true or false")
    """true: a request naming another model than model_name or the file name gets 404; false: a
    single-model server answers whatever model a client names (as llama.cpp's server does)."""
    embedding_model: str = setting("", str, None, "a GGUF path ('' = none)")
    """An embedding model (an encoder: BERT, nomic-bert) served beside the chat model: it answers
    /v1/embeddings (``dualpath serve --embedding-model``)."""
    embeddings: str = _choice("auto", str, ("auto", "on", "off"))
    """Without ``embedding_model``, whether the chat model answers /v1/embeddings from its hidden
    states: ``on`` (``--embeddings``, as llama-server's), ``auto`` only when its file declares a
    pooling type (a decoder trained as an embedder), ``off`` never."""
    embedding_dimensions: str = setting("", str, lambda v: all(p.strip().isdigit() and int(p) > 0
                                                               for p in v.split(",")) if v.strip() else True,
                                        "sizes joined by commas, e.g. \"512,256,128\" ('' = none)")
    """Shorter sizes a request's ``dimensions`` may ask of the embedding model, for one trained
    with Matryoshka representation learning (its model card says so; GGUF has no key for it):
    the vector is cut to its first ``dimensions`` values and L2-normalised again."""


@dataclass(frozen=True)
class ModelCacheConfig(_Section):
    """The converted-model cache (models/store.py): what loading a model file produces,
    kept on disk so that later loads of the same file convert nothing."""

    _section: ClassVar[str] = "model_cache"

    enabled: bool = setting(True, bool, None, "true or false")
    """false: convert on every load, into a temporary folder removed once loaded."""
    dir: str = setting("", str, None, "a folder path ('' = the platform's cache folder)")
    """Where entries live; '' = $DUALPATH_CACHE_DIR, an Android app's private storage
    ($ANDROID_PRIVATE), or the user cache folder ($XDG_CACHE_HOME or ~/.cache)/dualpath/models."""
    max_size_gb: float = _float(32.0, 0.0, 1 << 20)
    """Least recently used entries are removed when a new entry takes the cache past this."""


REASONING_FORMATS = ("none", "deepseek", "auto")
"""``reasoning.format`` (and a request's ``reasoning_format``) choices, llama-server's names:
``none`` leaves the thinking in the text, ``deepseek`` returns it apart; ``auto`` is ``deepseek``."""
REASONING_EFFORTS = ("low", "medium", "high")
"""A request's ``reasoning_effort`` choices: each is a budget of ``reasoning.<effort>_tokens``."""


def _budget(default: int) -> Any:
    return _int(default, -1, 1 << 24, allowed="an integer: -1 (no limit), 0 (no thinking) or a number of tokens")


@dataclass(frozen=True)
class ReasoningConfig(_Section):
    """Models that think before they answer (``<think>...</think>``): whether the thinking
    comes back apart, and how long it may be (tokenizer/reasoning.py, sampling/reasoning_budget.py)."""

    _section: ClassVar[str] = "reasoning"

    format: str = _choice("deepseek", str, REASONING_FORMATS)
    """``deepseek`` (or ``auto``): the thinking comes back as ``reasoning_content`` (the
    server, ``LLM.chat``) and the answer as the content; ``none``: both stay in the content."""
    budget_tokens: int = _budget(-1)
    """Most tokens of thinking per reply, unless a request sets its own; past it the
    closing marker is written for the model and the answer follows. -1 = no limit,
    0 = no thinking (``enable_thinking`` false where the template reads it)."""
    low_tokens: int = _budget(256)
    """The budget of ``reasoning_effort: low``."""
    medium_tokens: int = _budget(1024)
    """The budget of ``reasoning_effort: medium``."""
    high_tokens: int = _budget(4096)
    """The budget of ``reasoning_effort: high``."""

    def effort_tokens(self, effort: str) -> int:
        """The budget of a ``reasoning_effort`` (one of ``REASONING_EFFORTS``)."""
        return {"low": self.low_tokens, "medium": self.medium_tokens, "high": self.high_tokens}[effort]


PREFIX_CACHE_USES = ("serve", "always", "never")


@dataclass(frozen=True)
class PrefixCacheConfig(_Section):
    """The prefix cache on disk (cache/disk.py): full prompt pages kept across restarts,
    so a prompt prefix seen before a restart is read back instead of computed."""

    _section: ClassVar[str] = "prefix_cache"

    use: str = _choice("serve", str, PREFIX_CACHE_USES)
    """serve: on in ``dualpath serve``, off in the API unless ``LLM(..., prefix_cache=True)``;
    always; never."""
    dir: str = setting("", str, None, "a folder path ('' = beside the converted-model cache)")
    """Where the pages live; '' = ``prefix`` beside the converted-model cache's default
    folder (~/.cache/dualpath/prefix)."""
    max_size_gb: float = _float(2.0, 0.0, 1 << 20)
    """Least recently used pages are removed when the store grows past this."""


@dataclass(frozen=True)
class Config(_Section):
    """Everything configurable, one field per YAML section."""

    kv_cache: KVCacheConfig = section(KVCacheConfig)
    """The dual-path KV cache."""
    runtime: RuntimeConfig = section(RuntimeConfig)
    """ONNX Runtime sessions."""
    power: PowerConfig = section(PowerConfig)
    """Core placement and power profiles."""
    server: ServerConfig = section(ServerConfig)
    """The HTTP server."""
    model_cache: ModelCacheConfig = section(ModelCacheConfig)
    """The converted-model cache."""
    prefix_cache: PrefixCacheConfig = section(PrefixCacheConfig)
    """The prefix cache on disk."""
    reasoning: ReasoningConfig = section(ReasoningConfig)
    """Thinking models: the thinking apart, and its budget."""

    @property
    def dualpath_config(self) -> KVCacheConfig:
        """Deprecated: ``kv_cache``. Kept while code written against the old name is merged
        (issue-42 branches); remove once nothing reads it."""
        return self.kv_cache


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------

class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key repeated in one mapping (SafeLoader keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_config(path: str | os.PathLike | None = None, overrides: Mapping | None = None) -> Config:
    """Read a YAML config (None = defaults), then apply ``overrides``.

    ``overrides`` is nested (``{"runtime": {"num_threads": 2}}``) or dotted
    (``{"runtime.num_threads": 2}``). An empty file or empty section means defaults.
    Raises ConfigError naming the file (or ``<overrides>``), the dotted key and the
    allowed values.
    """
    config = Config()
    if path is not None:
        source = os.fspath(path)
        try:
            with open(source, encoding="utf-8") as f:
                data = yaml.load(f, Loader=_StrictLoader)
        except OSError as e:
            raise ConfigError(f"{source}: cannot read config file: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{source}: invalid YAML: {e}") from None
        if data is not None:
            if not isinstance(data, Mapping):
                raise ConfigError(f"{source}: must be a mapping with keys "
                                  f"{_names(Config)}, got {type(data).__name__}")
            config = _apply(config, _renamed(_flatten(data, source), source), source)
        log.debug("loaded config from %s", source)
    if overrides:
        config = with_overrides(config, overrides)
    return config


def with_overrides(config: Config, overrides: Mapping, source: str = OVERRIDES_SOURCE) -> Config:
    """A copy of ``config`` with nested or dotted ``overrides`` applied and validated."""
    return _apply(config, _renamed(_flatten(overrides, source), source), source)


def parse_overrides(items: Iterable[str] | None) -> dict[str, Any]:
    """``KEY=VALUE`` strings (the command line's ``--set``) as dotted overrides for
    ``load_config``; each value is parsed as YAML (``2``, ``f16``, ``[0, 1]``).

    Raises ConfigError naming the item when it has no ``=``, no key, or a value
    that is not YAML. The keys themselves are checked by ``load_config``.
    """
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE (e.g. runtime.num_threads=2)")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"--set {item!r}: the value is not valid YAML ({problem})") from None
    return out


def _names(cls: type) -> str:
    return ", ".join(f.name for f in fields(cls))


def _flatten(data: Mapping, source: str, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "a.c": 2}`` -> ``{"a.b": 1, "a.c": 2}``; a key given twice raises."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise ConfigError(f"{source}: key {prefix}{key!r} must be a string")
        items = _flatten(value, source, f"{prefix}{key}.").items() if isinstance(value, Mapping) \
            else [(prefix + key, value)]
        for k, v in items:
            if k in flat:
                raise ConfigError(f"{source}: {k} is given twice")
            flat[k] = v
    return flat


def _renamed(flat: dict[str, Any], source: str) -> dict[str, Any]:
    """``flat`` with the keys of ``RENAMED_KEYS`` under their new names (each warned once
    per use); an old key beside its new one raises."""
    for old, new in RENAMED_KEYS.items():
        if old in flat:
            if new in flat:
                raise ConfigError(f"{source}: {old} and {new} are one setting ({old} was renamed); give {new} only")
            log.warning("%s: %s is now %s (the old name is deprecated); read as that", source, old, new)
            flat[new] = flat.pop(old)
    return flat


def _apply(obj: Any, flat: Mapping[str, Any], source: str, prefix: str = "") -> Any:
    """``dataclasses.replace`` on ``obj`` with dotted keys relative to ``prefix``."""
    by_name = {f.name: f for f in fields(obj)}
    changes: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        head, _, rest = key.partition(".")
        f = by_name.get(head)
        is_section = f is not None and "section" in f.metadata
        if f is None:
            close = difflib.get_close_matches(head, by_name, n=1)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
            raise ConfigError(f"{source}: unknown key {prefix}{key}{hint}; "
                              f"{prefix.rstrip('.') or 'the top level'} has {_names(type(obj))}")
        if rest and not is_section:
            raise ConfigError(f"{source}: unknown key {prefix}{key}; {prefix}{head} is a setting, not a section")
        if not is_section:
            changes[head] = value
        elif rest:
            nested.setdefault(head, {})[rest] = value
        elif value is not None:  # `runtime:` with nothing under it is an empty section
            raise ConfigError(f"{source}: {prefix}{head} must be a mapping of "
                              f"{_names(f.metadata['section'])}, got {type(value).__name__} {value!r}")
    for name, sub in nested.items():
        changes[name] = _apply(getattr(obj, name), sub, source, f"{prefix}{name}.")
    try:
        return dataclasses.replace(obj, **changes)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
