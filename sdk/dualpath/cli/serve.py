"""``dualpath serve``: the OpenAI-compatible server, and its shutdown check."""

from __future__ import annotations

import sys

from .common import mmproj_path, model_path, overrides_from_args


def cmd_serve(args) -> int:
    from ..errors import DualPathError

    try:
        import uvicorn

        from ..server import create_app
        from ..server.connections import uvicorn_config
    except ImportError as e:
        raise DualPathError(f"the server needs the [server] extra: pip install 'dualpath[server]' ({e})") from None
    from ..llm import LLM

    overrides = overrides_from_args(args)
    for key, name in (("host", "host"), ("port", "port"), ("api_key", "api_key"), ("api_key_file", "api_key_file"),
                      ("alias", "model_name"), ("allowed_hosts", "allowed_hosts")):
        value = getattr(args, key)
        if value is not None:
            overrides[f"server.{name}"] = value
    if args.api_key_file:  # a file named on the command line wins over DUALPATH_API_KEY
        overrides.pop("server.api_key", None)
    if args.no_webui:
        overrides["server.webui"] = False
    if args.embedding_model:
        overrides["server.embedding_model"] = args.embedding_model
    if args.embeddings:
        overrides["server.embeddings"] = "on"
    if args.embedding_dimensions:
        overrides["server.embedding_dimensions"] = args.embedding_dimensions
    from ..config import load_config
    from ..server.embeddings import chat_config, embedder_bytes, load_embedder, warm_up

    cfg = load_config(args.config, overrides)
    embedder = load_embedder(cfg)  # first: an auto memory budget then sees what it holds
    # The server is the long-lived process an app restarts: its prompt pages go to disk
    # unless the config or --no-prefix-cache says never.
    llm = LLM(model_path(args), chat_config(cfg, embedder), tokenizer_path=args.tokenizer,
              prefix_cache=cfg.prefix_cache.use != "never", mmproj=mmproj_path(args))
    if llm.encoder is not None and embedder is not None:
        from ..errors import ConfigError

        raise ConfigError(f"{llm.spec.path} is an embedding model: it serves /v1/embeddings by itself; "
                          "--embedding-model goes beside a text-generation model")

    def stopped():
        # The engine has stopped (the app's shutdown): whatever load it served, the cache must
        # account for every page. Load tests read this line from stderr.
        from ..errors import InvariantError

        if llm.encoder is not None:  # an embedding-only server has no KV cache
            return
        cache = llm.cache
        try:
            cache.check_invariants()
        except InvariantError as e:
            print(f"dualpath: KV cache invariants broken at shutdown: {e}", file=sys.stderr, flush=True)
            return
        print(f"dualpath: stopped; KV cache invariants hold ({cache.num_sequences} sequences held, "
              f"{cache.free_page_count()} of {cache.num_blocks * cache.pages_per_block} pages free or cached)",
              file=sys.stderr, flush=True)

    if llm.encoder is None:
        llm.runner.warm_up()  # the first request does not wait for the weights to be paged in
    app = create_app(llm, on_shutdown=stopped, embedder=embedder)
    warm_up(app.state.server.embedder)
    sc = cfg.server
    if sc.webui and llm.encoder is None:
        print(f"dualpath: chat page at http://{sc.host}:{sc.port}/", file=sys.stderr)
    what = ("embeddings only" if llm.encoder is not None else
            f"{cfg.runtime.max_num_seqs} requests at once, {llm.runner.kv_cache_tokens} KV tokens")
    print(f"dualpath: serving {app.state.server.model_name} on http://{sc.host}:{sc.port}/v1 "
          f"({what}, api key {'required' if app.state.server.api_key else 'off'})", file=sys.stderr, flush=True)
    _print_embeddings(app.state.server.embedder, llm, embedder_bytes(embedder) if embedder is not None else 0)
    if llm.encoder is None and llm.prefix_store is not None:
        print(f"dualpath: prompt pages kept on disk in {llm.prefix_store.folder} (POST /v1/warm computes a "
              "prompt ahead; --no-prefix-cache turns this off)", file=sys.stderr, flush=True)
    uvicorn.Server(uvicorn_config(app, sc, log_level="info" if args.verbose else "warning",
                                  timeout_graceful_shutdown=5)).run()
    return 0


def _print_embeddings(e, llm, beside_bytes: int) -> None:
    """Where /v1/embeddings is answered from, and the memory the embedding model adds."""
    if e.refusal:
        print("dualpath: /v1/embeddings is off (--embedding-model FILE serves an embedding model beside the chat "
              "model; --embeddings pools the chat model's own states)", file=sys.stderr, flush=True)
        return
    src = e.source
    extra = f", planned at {beside_bytes / (1 << 20):,.0f} MiB beside the chat model" if beside_bytes else ""
    plan = getattr(llm, "memory_plan", None)
    if plan is not None and beside_bytes:
        extra += f" (the chat model's plan: {plan.total_full / (1 << 20):,.0f} MiB)"
    print(f"dualpath: /v1/embeddings from {e.model_name} ({src.spec.config.arch}, {e.dimensions[0]} dimensions, "
          f"{e.pooling} pooling{extra})", file=sys.stderr, flush=True)
