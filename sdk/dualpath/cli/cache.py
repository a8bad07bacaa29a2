"""``dualpath cache``: the converted-model cache and the prefix pages on disk."""

from __future__ import annotations

import sys
import time


def cmd_cache(args) -> int:
    from ..cache import disk
    from ..config import load_config
    from ..models.private_files import UnsafeFolderError
    from ..models.store import ModelStore

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
            print(f"{e.key}  {e.size_bytes / (1 << 20):9.1f} MiB  {when(e.last_used)}  {e.source}  "
                  f"({', '.join(e.graphs) or 'no graphs yet'})")
        total = sum(e.size_bytes for e in entries)
        print(f"{len(entries)} entries, {total / (1 << 20):.1f} MiB in {store.root}")
        for s in stores:
            ns = s.namespace
            print(f"{s.key}  {s.size_bytes / (1 << 20):9.1f} MiB  {when(s.last_used)}  prefix pages of "
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


def when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"
