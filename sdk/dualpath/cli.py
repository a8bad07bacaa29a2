"""``dualpath``: the command line. Builds a config, calls the public API, prints."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time


def _overrides(args) -> dict:
    from .config import parse_overrides

    out = parse_overrides(args.set)
    if getattr(args, "threads", None) is not None:
        out["runtime.num_threads"] = args.threads
    if getattr(args, "ctx_size", None) is not None:
        out["runtime.max_context_tokens"] = args.ctx_size
    if getattr(args, "kv_dtype", None) is not None:
        out["kv_cache.kv_dtype"] = args.kv_dtype
    if getattr(args, "memory_budget", None) is not None:
        out["runtime.memory_budget_mb"] = -1 if args.memory_budget == "auto" else args.memory_budget
    if getattr(args, "chat_template", None) is not None:
        out["runtime.chat_template"] = args.chat_template
    if getattr(args, "draft_model", None):
        out["runtime.speculative"], out["runtime.draft_model"] = "draft", args.draft_model
    if getattr(args, "speculative", None) is not None:
        out["runtime.speculative"] = args.speculative
    if getattr(args, "prefix_cache", None) is not None:
        out["prefix_cache.use"], out["prefix_cache.dir"] = "always", args.prefix_cache
    if getattr(args, "no_prefix_cache", False):
        out["prefix_cache.use"] = "never"
    return out


def _budget(text: str):
    """``--memory-budget``: ``auto`` or a size in MiB."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a size in MiB nor auto") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} MiB: a budget must be at least 1 MiB (or auto)")
    return value


def _config(args):
    from .config import load_config

    return load_config(args.config, _overrides(args))


def _model_path(args) -> str:
    from .models import resolve_model

    path, note = resolve_model(args.model, getattr(args, "hf_repo", None))
    if note:
        print(f"dualpath: {note}", file=sys.stderr)
    return path


def _sampling(args, prompt_tokens: int):
    from .runtime.sampler import SamplingParams

    max_tokens = args.max_tokens
    if max_tokens is None:
        # run.c's -n: positions in total, prompt included (the last generated token is not fed back)
        max_tokens = max(args.steps - prompt_tokens + 1, 1)
    return SamplingParams(max_tokens=max_tokens, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, min_p=args.min_p, repetition_penalty=args.repeat_penalty,
                          seed=args.seed, stop=tuple(getattr(args, "stop", None) or ()),
                          ignore_eos=getattr(args, "ignore_eos", False))


class _ProgressBar:
    """The load's progress on stderr, on a terminal only (``LLM(progress=...)``): one
    line per stage, redrawn in place, as the Hugging Face tools do."""

    LABELS = {"convert": ("converting", 1 << 20, "MiB"), "sessions": ("loading graphs", 1, "parts")}

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.stage = None
        self.t0 = time.perf_counter()

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        label, unit, unit_name = self.LABELS.get(stage, (stage, 1, ""))
        if stage != self.stage:
            if self.stage is not None:
                self.stream.write("\n")
            self.stage, self.t0 = stage, time.perf_counter()
        frac = min(1.0, done / total)
        bar = "#" * int(frac * 30)
        self.stream.write(f"\r{label}: {frac:4.0%} |{bar:<30}| {done // unit}/{total // unit} {unit_name} "
                          f"[{time.perf_counter() - self.t0:.1f}s]")
        if done >= total:
            self.stream.write("\n")
            self.stage = None
        self.stream.flush()


def _load_report(stats: dict) -> str:
    """``dualpath run --verbose``: where the load's time went."""
    names = (("open_s", "opened cached entry"), ("convert_s", "converted"), ("tokenizer_s", "tokenizer"),
             ("graphs_s", "graphs"), ("sessions_s", "ONNX Runtime sessions"), ("total_s", "total"))
    parts = [f"{label} {stats[key]:.2f}s" for key, label in names if key in stats]
    if "kernel_weights_mib" in stats:  # Entry.page_in
        parts.append(f"our kernels' weights {stats['huge_mib']:.0f} of {stats['kernel_weights_mib']:.0f} MiB "
                     f"in huge pages{' (read again)' if stats['reread'] else ''} {stats['page_in_s']:.2f}s")
    return f"dualpath: load (converted-model cache {stats.get('cache', '?')}): " + ", ".join(parts)


def cmd_run(args) -> int:
    from .llm import LLM

    llm = LLM(_model_path(args), _config(args), tokenizer_path=args.tokenizer, progress=_ProgressBar())
    if args.load_report:
        print(_load_report(llm.load_stats), file=sys.stderr)
    prompt = args.prompt if args.prompt is not None else ""
    ids = llm.tokenize(prompt)
    params = _sampling(args, len(ids))
    gen = llm.stream(ids, params)  # checks the prompt fits before anything is printed
    out = sys.stdout
    if args.echo:
        out.write(llm.detokenize(ids))
        out.flush()
    for delta in gen:
        out.write(delta)
        out.flush()
    out.write("\n")
    out.flush()
    c = gen.completion
    assert c is not None  # the stream has ended
    t = c.timings
    print(f"dualpath: {c.usage.prompt_tokens} prompt tokens at {t.prefill_tokens_per_s:.1f} tok/s, "
          f"{c.usage.completion_tokens} generated at {t.decode_tokens_per_s:.1f} tok/s "
          f"(finish: {c.finish_reason}, threads: {llm.config.runtime.effective_num_threads()})", file=sys.stderr)
    return 0


CHAT_HELP = """commands: /clear (forget the conversation), /system TEXT (a new system prompt), /save FILE,
/load FILE (the conversation as JSON messages), /stats (tokens, speed, cache reuse), /help;
Ctrl-C stops a reply, Ctrl-D (or /exit) leaves"""


@contextlib.contextmanager
def _sigint(handler):
    """SIGINT handled by ``handler`` inside the block: set, not assumed, because a shell
    that starts us in the background leaves SIGINT ignored, and Python then raises no
    KeyboardInterrupt."""
    import signal

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def cmd_chat(args) -> int:
    import signal
    import threading

    from .chat import Chat
    from .errors import DualPathError
    from .llm import LLM

    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input(), where Python has it)
        except ImportError:  # Termux's Python may lack it: a plain prompt then
            pass
    llm = LLM(_model_path(args), _config(args), tokenizer_path=args.tokenizer, progress=_ProgressBar())
    params = _sampling(args, 0)
    chat = Chat(llm, args.system, params, reply_tokens=args.max_tokens)
    out, err = sys.stdout, sys.stderr
    if interactive:
        print(f"dualpath chat: {os.path.basename(str(llm.spec.path))}, context {llm.context_tokens} tokens. "
              f"{CHAT_HELP}", file=err)
    stop = threading.Event()
    failed = False  # piped: the exit status says whether every line got its reply

    def on_sigint(signum, frame):  # while a reply streams: stop it, never interrupt the engine mid-step
        stop.set()

    while True:
        try:
            line = input(">>> " if interactive else "")
        except EOFError:
            if interactive:
                print(file=err)
            return 1 if failed and not interactive else 0
        except KeyboardInterrupt:  # at the prompt: a fresh line, the session goes on
            print("\n(Ctrl-D leaves)", file=err)
            continue
        line = line.strip()
        if not line:
            continue
        if interactive and line.startswith("/"):
            if _chat_command(chat, line, out, err):
                return 0
            continue
        try:  # the template and the tokenizer: Ctrl-C interrupts them (the engine has nothing yet)
            with _sigint(signal.default_int_handler):
                reply = chat.send(line)
        except KeyboardInterrupt:
            print("\n(stopped)", file=err)
            continue
        except DualPathError as e:
            print(f"(error: {e})", file=err)
            failed = True
            continue
        previous = signal.signal(signal.SIGINT, on_sigint)
        stop.clear()
        try:
            for text in reply:
                out.write(text)
                out.flush()
                if stop.is_set():
                    reply.close()  # the reply so far stays in the conversation
                    break
        except DualPathError as e:  # this turn failed (too long, an engine error): the session goes on
            out.flush()
            print(f"\n(error: {e})", file=err)
            failed = True
            continue
        finally:
            signal.signal(signal.SIGINT, previous)
        out.write("\n")
        out.flush()
        st = chat.last
        if st.dropped_turns:
            print(f"(context full: dropped the {st.dropped_turns} oldest turn(s))", file=err)
        if stop.is_set() and interactive:
            print("(stopped)", file=err)


def _chat_command(chat, line: str, out, err) -> bool:
    """One REPL command; True when the session should end."""
    from .errors import DualPathError

    name, _, arg = line.partition(" ")
    arg = arg.strip()
    if name in ("/exit", "/quit", "/bye"):
        return True
    if name == "/clear":
        chat.clear()
        print("(conversation cleared)", file=err)
    elif name == "/system":
        chat.set_system(arg)
        print(f"(system prompt {'set' if arg else 'removed'}; the conversation goes on under it)", file=err)
    elif name in ("/save", "/load") and arg:
        try:
            (chat.save if name == "/save" else chat.load)(arg)
        except (OSError, DualPathError) as e:
            print(f"(cannot {name[1:]}: {e})", file=err)
        else:
            print(f"({'saved' if name == '/save' else 'loaded'} {len(chat.messages)} messages "
                  f"{'to' if name == '/save' else 'from'} {arg})", file=err)
    elif name == "/stats":
        st = chat.last
        print(f"turns {chat.turns}, context {chat.context_used}/{chat.llm.context_tokens} tokens; last turn: prompt "
              f"{st.prompt_tokens} tokens ({st.cached_tokens} from the cache), reply {st.completion_tokens} "
              f"tokens, first token after {st.ttft_ms:.0f} ms, {st.decode_tokens_per_s:.1f} tok/s", file=err)
    else:
        print(CHAT_HELP, file=err)
    return False


def cmd_cache(args) -> int:
    from .cache import disk
    from .config import load_config
    from .models.private_files import UnsafeFolderError
    from .models.store import ModelStore

    cfg = load_config()
    mc, pc = cfg.model_cache, cfg.prefix_cache
    store = ModelStore(args.dir or mc.dir or None, int(mc.max_size_gb * (1 << 30)))
    prefix_root = args.prefix_dir or pc.dir or disk.default_root()
    skipped: list[tuple[str, str]] = []  # folders that are links or another user's: never touched
    entries = store.entries(skipped)
    stores = disk.list_stores(prefix_root, skipped)
    for folder, why in skipped:
        print(f"dualpath: skipped {folder}: it {why}; not listed, pruned or removed", file=sys.stderr)
    if args.cache_command == "ls":
        for e in entries:
            print(f"{e.key}  {e.size_bytes / (1 << 20):9.1f} MiB  {_when(e.last_used)}  {e.source}  "
                  f"({', '.join(e.graphs) or 'no graphs yet'})")
        total = sum(e.size_bytes for e in entries)
        print(f"{len(entries)} entries, {total / (1 << 20):.1f} MiB in {store.root}")
        for s in stores:
            ns = s.namespace
            print(f"{s.key}  {s.size_bytes / (1 << 20):9.1f} MiB  {_when(s.last_used)}  prefix pages of "
                  f"{ns.get('source', '?')} (kv {ns.get('kv_dtype', '?')}, {ns.get('page_tokens', '?')}-token "
                  f"pages, {s.pages} pages)")
        print(f"{len(stores)} prefix stores, {sum(s.size_bytes for s in stores) / (1 << 20):.1f} MiB in {prefix_root}")
        return 0
    if args.cache_command == "rm":
        keys = [e.key for e in entries] + [s.key for s in stores] if args.all else args.keys
        if not keys and not args.all:
            print("dualpath: error: name the keys to remove (dualpath cache ls) or give --all", file=sys.stderr)
            return 2
        num_removed = 0
        for k in keys:
            try:
                if store.remove(k) or disk.remove_store(prefix_root, k):
                    num_removed += 1
                else:
                    print(f"dualpath: no cache entry or prefix store {k!r} in {store.root} or {prefix_root}",
                          file=sys.stderr)
            except UnsafeFolderError as e:
                print(f"dualpath: not removed: {e}", file=sys.stderr)
            except OSError as e:
                print(f"dualpath: cannot remove {k!r}: {e.strerror or e} ({e.filename})", file=sys.stderr)
        print(f"removed {num_removed} entries")
        return 1 if num_removed < len(keys) else 0
    limit = None if args.max_size_gb is None else int(args.max_size_gb * (1 << 30))
    pruned = store.enforce_limit(limit)
    for info in pruned:
        print(f"removed {info.key} ({info.size_bytes / (1 << 20):.1f} MiB, {info.source})")
    left_mib = sum(info.size_bytes for info in store.entries()) / (1 << 20)
    print(f"{len(pruned)} entries removed; {left_mib:.1f} MiB left")
    gb = pc.max_size_gb if args.prefix_max_size_gb is None else args.prefix_max_size_gb
    pages, left = disk.prune(prefix_root, int(gb * (1 << 30)))
    print(f"{len(pages)} prefix pages removed; {left / (1 << 20):.1f} MiB left in {prefix_root}")
    return 0


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"


def cmd_tokenize(args) -> int:
    from .models import load_model
    from .tokenizer import build_tokenizer

    spec = load_model(_model_path(args), args.tokenizer)
    tok = build_tokenizer(spec.tokenizer)
    ids = tok.encode(args.text, add_bos=not args.no_bos)
    if args.ids_only:
        print(json.dumps(ids))
    else:
        for i in ids:
            print(f"{i:>8} {spec.tokenizer.tokens[i]!r}")
    return 0


def cmd_info(args) -> int:
    import numpy as np
    import onnxruntime

    from . import __version__
    from .platform.cpu import cpu_features, cpu_model, usable_cpus

    cfg = _config(args)
    print(f"dualpath {__version__}  onnxruntime {onnxruntime.__version__}  numpy {np.__version__}  "
          f"python {sys.version.split()[0]}")
    print(f"cpu: {cpu_model()}  ({usable_cpus()} usable cores)")
    print(f"cpu features: {' '.join(cpu_features()) or '(none reported)'}")
    from .kernels import KERNEL_ISAS, available_kernels, default_kernel
    from .kernels import cpu_features as kernel_features

    disabled = os.environ.get("DUALPATH_DISABLE_CPU_FEATURES", "")
    asked = cfg.runtime.kernel_isa
    available = available_kernels()
    kernel = default_kernel() if asked == "auto" else asked
    note = "" if kernel in available else " NOT AVAILABLE on this CPU/build: loading a model fails"
    print(f"kernels: attention={kernel} kv_write={kernel} layer_products={kernel} classifier={kernel} embed=generic  "
          f"(runtime.kernel_isa={asked}{note}; available: {', '.join(available)}; usable ISA features: "
          f"{', '.join(kernel_features()) or 'none'}"
          f"{'; disabled by DUALPATH_DISABLE_CPU_FEATURES=' + disabled if disabled else ''})")
    print("kernel ISAs: " + " ".join(f"{isa}{'' if isa in available else '(-)'}" for isa in KERNEL_ISAS)
          + "  ((-): not on this CPU/build, or disabled)")
    d = cfg.kv_cache
    from .kernels import KV_DTYPE_DOCS
    kv_what = KV_DTYPE_DOCS[d.kv_dtype]
    print(f"kv cache: one arena of {d.block_bytes // 1024} KiB blocks (block_bytes={d.block_bytes}), pages of "
          f"{d.page_tokens} tokens, kv_dtype={d.kv_dtype} ({kv_what}), prefetch_degree={d.prefetch_degree}, "
          f"huge pages requested (madvise)")
    from .platform.cpu import numa_nodes

    nodes = numa_nodes()
    print(f"numa: {nodes} node{'s' if nodes != 1 else ''}; "
          + ("binding the KV arena is a no-op here" if nodes <= 1 else
             f"KV arena bound to node {d.numa_node}" if d.numa_node >= 0
             else "KV arena unbound (set kv_cache.numa_node to bind it)"))
    print(f"runtime: threads={cfg.runtime.effective_num_threads()} prefill_chunk={cfg.runtime.prefill_chunk_tokens} "
          f"max_context={cfg.runtime.max_context_tokens or 'model'}")
    from .cache.policy import PathPolicy
    from .platform import Governor, describe, load_topology, read_power_state

    topology = load_topology(cfg.power.cpu_classes)
    power = read_power_state(timeout_s=cfg.power.termux_timeout_s)
    plan = Governor(topology, lambda: power, cfg).choose()
    policy = PathPolicy.from_config(d, cfg.power, plan.profile)
    print(describe(topology, power, plan, policy.summary()))
    _print_placement(cfg, topology, power)
    if args.model or args.hf_repo:
        _print_model(args, d)
    return 0


def _print_placement(cfg, topology, power) -> None:
    """Where the threads run: pinned as the engine pins them, on the built-in model, and
    read back from the OS."""
    from .platform import Governor, describe_placement

    if topology.uniform or not cfg.power.pin_threads:
        print("scheduling: cores are alike (or power.pin_threads is off): one unpinned session set on "
              "ONNX Runtime's shared pool; nothing is pinned, so there is no placement to verify")
    else:  # pin as the engine does, on the built-in model, and print what the OS granted
        from .config import with_overrides
        from .errors import DualPathError
        from .llm import LLM
        from .models import resolve_model

        gov = Governor(topology, lambda: power, cfg)
        small = with_overrides(cfg, {"runtime.max_context_tokens": 64, "runtime.max_num_seqs": 1,
                                     "runtime.kv_cache_tokens": 0, "model_cache.enabled": False})
        try:
            LLM(resolve_model(None)[0], small, governor=gov)
        except DualPathError as e:
            print(f"placement: not verified (the built-in model did not load: {e})")
        else:
            print(describe_placement(gov.placement) if gov.placement is not None
                  else "placement: not verified (/proc could not be read)")


def _print_model(args, d) -> None:
    """``dualpath info -m FILE``: the model's hyper-parameters, and its KV cache under ``d``."""
    from .models import load_model

    spec = load_model(_model_path(args), args.tokenizer)
    m = spec.config
    print(f"model: {spec.path}  format={spec.format}  name={spec.metadata.get('name', '')!r}")
    print(f"  arch={m.arch} dim={m.dim} hidden_dim={m.hidden_dim} layers={m.num_layers} heads={m.num_heads} "
          f"kv_heads={m.num_kv_heads} head_dim={m.head_dim} vocab={m.vocab_size} context={m.context_length}")
    print(f"  rope_theta={m.rope_theta:g} rms_eps={m.rms_eps:g} tied_output={m.tied_output}")
    from .errors import ConfigError
    from .kernels import kv_tile_bytes

    try:
        d.check_head_dim(m.head_dim)
    except ConfigError as e:
        print(f"  kv cache: {e} (loading fails)")
    else:
        per_token = kv_tile_bytes(d.kv_dtype, m.num_kv_heads, m.head_dim, 1) * m.num_layers
        f16 = kv_tile_bytes("f16", m.num_kv_heads, m.head_dim, 1) * m.num_layers
        print(f"  kv cache: {per_token:,} bytes per token, all layers, in {d.kv_dtype} "
              f"({per_token / f16:.0%} of f16)")
    diffs = m.differences()
    shown = ' '.join(f'{k}={v:g}' if isinstance(v, float) else f'{k}={v}' for k, v in diffs.items())
    print(f"  family differences: {shown or 'none (plain Llama)'}")
    print(f"  file tensor types: {', '.join(spec.metadata.get('tensor_types', []))}")
    types = ", ".join(f"{k}: {v / 2**20:.1f} MiB" for k, v in spec.weight_types().items())
    print(f"  weights in memory: {spec.weight_bytes / 2**20:.1f} MiB ({types})")
    print(f"  tokenizer: {spec.tokenizer.model}, {spec.tokenizer.vocab_size} tokens, "
          f"chat template: {'yes' if spec.tokenizer.chat_template else 'no'}")
    _print_memory_plan(args, m)


def _print_memory_plan(args, m) -> None:
    """The memory plan (runtime/memory_plan.py) at the configured context, and what a
    budget allows."""
    from .errors import ConfigError
    from .models import read_layout
    from .runtime.memory_plan import MiB, budget_bytes, default_context, fit, plan_memory

    cfg = _config(args)
    path = _model_path(args)
    _, layout, merges = read_layout(path)
    ctx = cfg.runtime.max_context_tokens or default_context(m.context_length)
    if ctx < m.context_length and not cfg.runtime.max_context_tokens:
        print(f"  default context: {ctx:,} of the file's {m.context_length:,} tokens (--ctx-size for more)")
    print(f"  memory plan: {plan_memory(m, layout, merges, cfg, ctx).describe()}")
    if cfg.runtime.memory_budget_mb:
        budget = budget_bytes(cfg.runtime.memory_budget_mb)
        try:
            print(f"  memory budget {budget / MiB:,.0f} MiB: {fit(path, cfg, budget).describe()}")
        except ConfigError as e:
            print(f"  memory budget: {e}")


def cmd_synth(args) -> int:
    from .models.synth import preset_for, synth_gguf

    t0 = time.perf_counter()
    try:
        preset = preset_for(args.arch, args.preset)
    except ValueError as e:
        print(f"dualpath synth: {e}", file=sys.stderr)
        return 2
    path = synth_gguf(args.out, preset, args.type, seed=args.seed, context_length=args.ctx)
    print(f"wrote {path} ({os.path.getsize(path) / 2**20:.1f} MiB, {preset}, {args.type.upper()}, "
          f"seed {args.seed}) in {time.perf_counter() - t0:.1f}s — random weights: its text is noise")
    return 0


def cmd_serve(args) -> int:
    from .errors import DualPathError

    try:
        import uvicorn

        from .server import create_app
        from .server.connections import uvicorn_config
    except ImportError as e:
        raise DualPathError(f"the server needs the [server] extra: pip install 'dualpath[server]' ({e})") from None
    from .llm import LLM

    overrides = _overrides(args)
    for key, name in (("host", "host"), ("port", "port"), ("api_key", "api_key"), ("api_key_file", "api_key_file"),
                      ("alias", "model_name"), ("allowed_hosts", "allowed_hosts")):
        value = getattr(args, key)
        if value is not None:
            overrides[f"server.{name}"] = value
    if args.api_key_file:  # a file named on the command line wins over DUALPATH_API_KEY
        overrides.pop("server.api_key", None)
    if args.no_webui:
        overrides["server.webui"] = False
    from .config import load_config

    cfg = load_config(args.config, overrides)
    # The server is the long-lived process an app restarts: its prompt pages go to disk
    # unless the config or --no-prefix-cache says never.
    llm = LLM(_model_path(args), cfg, tokenizer_path=args.tokenizer,
              prefix_cache=cfg.prefix_cache.use != "never")

    def stopped():
        # The engine has stopped (the app's shutdown): whatever load it served, the cache must
        # account for every page. Load tests read this line from stderr.
        from .errors import InvariantError

        cache = llm.runner.cache
        try:
            cache.check_invariants()
        except InvariantError as e:
            print(f"dualpath: KV cache invariants broken at shutdown: {e}", file=sys.stderr, flush=True)
            return
        print(f"dualpath: stopped; KV cache invariants hold ({cache.num_sequences - 1} sequences held, "
              f"{cache.free_page_count()} of {cache.num_blocks * cache.pages_per_block} pages free or cached)",
              file=sys.stderr, flush=True)

    llm.runner.warm_up()  # the first request does not wait for the weights to be paged in
    app = create_app(llm, on_shutdown=stopped)
    sc = cfg.server
    if sc.webui:
        print(f"dualpath: chat page at http://{sc.host}:{sc.port}/", file=sys.stderr)
    print(f"dualpath: serving {app.state.server.model_name} on http://{sc.host}:{sc.port}/v1 "
          f"({cfg.runtime.max_num_seqs} requests at once, {llm.runner.kv_cache_tokens} KV tokens, "
          f"api key {'required' if app.state.server.api_key else 'off'})", file=sys.stderr, flush=True)
    if llm.prefix_store is not None:
        print(f"dualpath: prompt pages kept on disk in {llm.prefix_store.folder} (POST /v1/warm computes a "
              "prompt ahead; --no-prefix-cache turns this off)", file=sys.stderr, flush=True)
    uvicorn.Server(uvicorn_config(app, sc, log_level="info" if args.verbose else "warning",
                                  timeout_graceful_shutdown=5)).run()
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .config import CHAT_TEMPLATES, SPECULATIVE_MODES

    p = argparse.ArgumentParser(prog="dualpath", description="On-device LLM inference on the CPU.")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the library does")
    sub = p.add_subparsers(dest="command", required=True)

    def config_args(sp):
        sp.add_argument("-c", "--config", help="YAML config file (see configs/default.yaml)")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a config key, e.g. runtime.num_threads=2")
        sp.add_argument("-t", "--threads", type=int, help="threads (runtime.num_threads)")
        sp.add_argument("--ctx-size", type=int, help="context window in tokens (runtime.max_context_tokens)")
        from .kernels import KV_DTYPE_DOCS, KV_DTYPES
        sp.add_argument("--kv-dtype", choices=KV_DTYPES, help="KV cache element type (kv_cache.kv_dtype; "
                        + "; ".join(f"{n} = {doc}" for n, doc in KV_DTYPE_DOCS.items()) + ")")
        sp.add_argument("--memory-budget", metavar="MIB|auto", type=_budget,
                        help="resident memory the model may take (runtime.memory_budget_mb): the largest context "
                        "and KV type that fit are used, or the load is refused before any weight is read; auto: "
                        "what MemAvailable allows, less headroom for the OS")
        sp.add_argument("--chat-template", choices=CHAT_TEMPLATES,
                        help="a built-in chat template instead of the model's (runtime.chat_template)")
        sp.add_argument("--speculative", choices=SPECULATIVE_MODES, help="speculative decoding "
                        "(runtime.speculative): ngram proposes tokens from the request's own text, draft from "
                        "--draft-model; same output, faster where the proposals are right")
        sp.add_argument("--draft-model", help="a smaller GGUF with the same vocabulary (runtime.draft_model; "
                        "implies --speculative draft)")
        disk = sp.add_mutually_exclusive_group()
        disk.add_argument("--prefix-cache", metavar="DIR", help="keep prompt pages on disk in DIR, so that a "
                          "restarted process reuses a prefix it saw (prefix_cache.dir; on by default in serve)")
        disk.add_argument("--no-prefix-cache", action="store_true", help="no prefix pages on disk "
                          "(prefix_cache.use: never)")

    r = sub.add_parser("run", help="generate text from a prompt, streamed to stdout")
    model_args(r)
    config_args(r)
    r.add_argument("prompt", nargs="?", help="the prompt (default: empty, i.e. start from BOS)")
    r.add_argument("-n", "--max-tokens", type=int, help="tokens to generate (default: up to --steps)")
    r.add_argument("--steps", type=int, default=256,
                   help="stop when prompt + generated reach this many positions, as llama2.c's -n (default 256)")
    sampling_args(r, temperature=0.8)
    r.add_argument("--stop", action="append", help="stop string (repeatable)")
    r.add_argument("--ignore-eos", action="store_true")
    r.add_argument("--no-echo", dest="echo", action="store_false", help="do not print the prompt before the output")
    r.add_argument("--verbose", dest="load_report", action="store_true",
                   help="print the load time split into its stages (and log what the library does, as -v)")
    r.set_defaults(func=cmd_run)

    ch = sub.add_parser("chat", help="an interactive conversation in the terminal (piped: one reply per line)")
    model_args(ch)
    config_args(ch)
    ch.add_argument("--system", help="a system prompt")
    ch.add_argument("-n", "--max-tokens", type=int, default=512, help="tokens a reply may take (default 512)")
    sampling_args(ch, temperature=0.7)
    ch.set_defaults(func=cmd_chat)

    _add_cache_parser(sub)

    t = sub.add_parser("tokenize", help="print the token ids of a text")
    model_args(t)
    t.add_argument("text")
    t.add_argument("--no-bos", action="store_true")
    t.add_argument("--ids-only", action="store_true", help="print a JSON list of ids")
    t.set_defaults(func=cmd_tokenize)

    i = sub.add_parser("info", help="versions, CPU features, kernels, and a model's hyper-parameters")
    model_args(i)
    config_args(i)
    i.set_defaults(func=cmd_info)

    _add_synth_parser(sub)

    sv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (needs the [server] extra)")
    model_args(sv)
    config_args(sv)
    _serve_options(sv)

    from .bench import add_bench_parser

    add_bench_parser(sub)
    return p


def model_args(sp) -> None:
    """Which model: ``-m FILE`` or ``-hf REPO``, and a llama2.c checkpoint's tokenizer."""
    which = sp.add_mutually_exclusive_group()
    which.add_argument("-m", "--model", help="a .gguf file, a llama2.c .bin, or synth:PRESET (random weights, "
                       "real shapes; presets as for synth). Default: the built-in stories260K.gguf")
    which.add_argument("-hf", "--hf-repo", metavar="REPO[:QUANT]", help="a GGUF from the Hugging Face Hub, e.g. "
                       "bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M (default quant Q4_K_M; REPO:FILE.gguf "
                       "names a file; cached by huggingface_hub, HF_HUB_OFFLINE=1 to use the cache only)")
    sp.add_argument("--tokenizer", help="tokenizer for a llama2.c checkpoint (default: tok<vocab>.bin beside it)")


def sampling_args(sp, temperature: float) -> None:
    """The sampling options of ``run`` and ``chat`` (``SamplingParams``, built by ``_sampling``)."""
    sp.add_argument("--temperature", type=float, default=temperature)
    sp.add_argument("--top-k", type=int, default=40)
    sp.add_argument("--top-p", type=float, default=0.95)
    sp.add_argument("--min-p", type=float, default=0.05)
    sp.add_argument("--repeat-penalty", type=float, default=1.0)
    sp.add_argument("--seed", type=int)


def _add_cache_parser(sub) -> None:
    c = sub.add_parser("cache", help="the converted-model cache and the prefix pages on disk: list, remove, prune")
    c.add_argument("--dir",
                   help="the cache folder (default: model_cache.dir, $DUALPATH_CACHE_DIR or ~/.cache/dualpath/models)")
    c.add_argument("--prefix-dir",
                   help="the prefix pages' folder (default: prefix_cache.dir or ~/.cache/dualpath/prefix)")
    csub = c.add_subparsers(dest="cache_command", required=True)
    csub.add_parser("ls", help="list entries (key, size, last use, source file, graphs) and prefix stores")
    crm = csub.add_parser("rm", help="remove entries or prefix stores by key (or --all)")
    crm.add_argument("keys", nargs="*")
    crm.add_argument("--all", action="store_true")
    cpr = csub.add_parser("prune",
                          help="remove least recently used entries down to a size, and stale temporary folders")
    cpr.add_argument("--max-size-gb", type=float, help="default: model_cache.max_size_gb")
    cpr.add_argument("--prefix-max-size-gb", type=float, help="prefix pages kept, least recently used "
                     "removed first (default: prefix_cache.max_size_gb)")
    c.set_defaults(func=cmd_cache)


def _add_synth_parser(sub) -> None:
    from .models.synth import LLAMA_CPP_TYPES, PRESETS, TYPES

    s = sub.add_parser("synth", help="write a GGUF with random weights and real shapes (for benchmarks)")
    s.add_argument("--preset", choices=list(PRESETS),
                   help="a shape (default: stories15M, or the --arch family's tiny test shape)")
    s.add_argument("--arch", choices=sorted({p.arch for p in PRESETS.values()}),
                   help="model family (GGUF general.architecture)")
    s.add_argument("--type", default="F32", type=str.upper, choices=list(TYPES + LLAMA_CPP_TYPES),
                   help=f"{', '.join(LLAMA_CPP_TYPES)} are quantized by llama.cpp (needs llama-cpp-python)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--ctx", type=int, help="context_length to record (default: the preset's)")
    s.add_argument("-o", "--out", required=True)
    s.set_defaults(func=cmd_synth)


def _serve_options(sv) -> None:
    """``serve``'s own options, after the model and config ones."""
    sv.add_argument("--host", help="bind address (server.host, default 127.0.0.1: loopback only)")
    sv.add_argument("--port", type=int, help="TCP port (server.port, default 8080)")
    sv.add_argument("--alias", help="the model id /v1/models lists and responses carry (server.model_name; "
                                    "default: the file's name). Requests may name any model unless "
                                    "server.strict_model_name is true")
    key = sv.add_mutually_exclusive_group()
    key.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (server.api_key). Other local users "
                     "see a command line in ps: prefer env DUALPATH_API_KEY or --api-key-file",
                     default=os.environ.get("DUALPATH_API_KEY") or None)
    key.add_argument("--api-key-file", metavar="FILE", help="require the key held in FILE (server.api_key_file)")
    sv.add_argument("--allowed-hosts", metavar="NAMES", help="Host names answered besides localhost, 127.0.0.1 "
                    "and [::1], joined by commas (server.allowed_hosts; a loopback bind refuses any other, "
                    "against DNS rebinding; * = any)")
    sv.add_argument("--no-webui", action="store_true", help="no chat page at / (server.webui: false)")
    sv.set_defaults(func=cmd_serve)


def main(argv=None) -> int:
    from .errors import DualPathError

    args = build_parser().parse_args(argv)
    verbose = args.verbose or getattr(args, "load_report", False)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except DualPathError as e:
        print(f"dualpath: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
