"""``dualpath serve``: the OpenAI-compatible server, and its shutdown check."""

from __future__ import annotations

import sys

from .common import model_path, overrides_from_args


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
    from ..config import load_config

    cfg = load_config(args.config, overrides)
    # The server is the long-lived process an app restarts: its prompt pages go to disk
    # unless the config or --no-prefix-cache says never.
    llm = LLM(model_path(args), cfg, tokenizer_path=args.tokenizer,
              prefix_cache=cfg.prefix_cache.use != "never")
    if llm.encoder is not None:
        from ..errors import ModelTaskError

        raise ModelTaskError(f"{llm.spec.path} is an embedding model ({llm.spec.config.arch}): the server does not "
                             "serve encoders yet; use dualpath embed or LLM.embed")

    def stopped():
        # The engine has stopped (the app's shutdown): whatever load it served, the cache must
        # account for every page. Load tests read this line from stderr.
        from ..errors import InvariantError

        cache = llm.cache
        try:
            cache.check_invariants()
        except InvariantError as e:
            print(f"dualpath: KV cache invariants broken at shutdown: {e}", file=sys.stderr, flush=True)
            return
        print(f"dualpath: stopped; KV cache invariants hold ({cache.num_sequences} sequences held, "
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
