"""A model and its converted-model cache entry, made on a desktop for a phone.

A model's first load builds its ONNX graphs, and that needs the onnx package, which a phone
does not have: python-for-android has no recipe for it, and on Termux it has to be built
from C++ source. So the first load happens here, on a desktop with ``pip install .``, with
the configuration the phone will use (graphs are made per accuracy level and context
length), into a bundle folder that the app ships (buildozer.spec includes it) or that is
copied into Termux::

    bundle/
      model/<name>.gguf   the model (default: DualPath's built-in stories260K.gguf)
      config.yaml         the configuration (default: the repository's configs/android.yaml)
      cache/<key>/        the model's converted-model cache entry (sdk/dualpath/models/store.py)

The cache names an entry by its source file's size, mtime and first 64 KiB, and a copy (into
an APK and out of it, adb push, tar) does not keep an mtime to the nanosecond. So the
bundle's model is given a fixed mtime here before its first load, and the same one on the
phone by ``install`` before it is loaded: the entry then matches, and the store still checks
the model's whole header and tensor table against the entry before using it.

    python model_bundle.py [--model FILE.gguf] [--config FILE.yaml] [--out DIR]   # desktop
    python model_bundle.py --install DIR                                          # Termux

Only GGUF files: a llama2.c checkpoint's entry also names its tokenizer file by absolute path.
Imports nothing of Kivy (the tests use it on a desktop).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

APP_DIR = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BUNDLE = os.path.join(APP_DIR, "bundle")
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(APP_DIR)), "configs", "android.yaml")
MODEL_MTIME_NS = 1_700_000_000 * 1_000_000_000
"""The bundle model's mtime (2023-11-14 22:13:20 UTC): whole seconds, so a copy that keeps
seconds keeps it too."""
OLDEST_ORT = "1.20.1"
"""The oldest ONNX Runtime DualPath supports: the bundle holds the graphs it loads too."""
PLACEHOLDER = "weights.placeholder"
"""graph/parts.py's sparse file, never read: a plain copy writes it out as zeros."""


def make_bundle(model: str | None = None, config: str = DEFAULT_CONFIG, out: str = DEFAULT_BUNDLE) -> str:
    """Copy ``model`` (None: the built-in model) and ``config`` into ``out`` and load the copy
    once, which makes its converted-model cache entry in ``out/cache``. Returns the copy's path."""
    import dualpath
    from dualpath.models import embedded_model_path

    src = os.fspath(model) if model else embedded_model_path()
    if not src.endswith(".gguf"):
        raise SystemExit(f"{src}: model_bundle takes GGUF files only")
    for part in ("model", "cache", "config.yaml"):  # never the rest of a folder the user named
        path = os.path.join(out, part)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
    os.makedirs(os.path.join(out, "model"))
    dst = os.path.join(out, "model", os.path.basename(src))
    shutil.copyfile(src, dst)
    os.utime(dst, ns=(MODEL_MTIME_NS, MODEL_MTIME_NS))
    shutil.copyfile(config, os.path.join(out, "config.yaml"))
    llm = dualpath.LLM(dst, bundle_config(out))
    llm.engine.shutdown()
    # A phone's ONNX Runtime may be older than this desktop's (Termux's has been 1.20-1.29):
    # before 1.22 a model's 8-bit matrices need graphs of their own, made here too.
    from dualpath.executor.session import graphs_for_runtime

    graphs_for_runtime(llm.spec, llm.config.runtime.quantized_matmul_accuracy, llm.context_tokens, OLDEST_ORT)
    return dst


def bundle_config(bundle: str):
    """The bundle's configuration, its converted-model cache folder set to ``bundle/cache``."""
    from dualpath import load_config

    return load_config(os.path.join(bundle, "config.yaml"), {"model_cache.dir": os.path.join(bundle, "cache")})


def bundle_model(bundle: str) -> str | None:
    """The bundle's model file, or None when ``bundle`` holds none."""
    folder = os.path.join(bundle, "model")
    names = sorted(n for n in os.listdir(folder) if n.endswith(".gguf")) if os.path.isdir(folder) else []
    return os.path.join(folder, names[0]) if names else None


def install(bundle: str = DEFAULT_BUNDLE):
    """On the phone: ``(model path, config)`` of the bundle, ready for ``dualpath.LLM``, or
    None when there is no bundle. Gives the model its fixed mtime (the bundle is first copied
    to private storage when its folder is read-only) and makes the copied placeholders sparse."""
    model = bundle_model(bundle)
    if model is None:
        return None
    try:
        os.utime(model, ns=(MODEL_MTIME_NS, MODEL_MTIME_NS))
    except OSError:
        writable = os.path.join(os.environ.get("ANDROID_PRIVATE") or tempfile.gettempdir(), "dualpath-bundle")
        shutil.rmtree(writable, ignore_errors=True)
        shutil.copytree(bundle, writable)
        bundle, model = writable, os.path.join(writable, "model", os.path.basename(model))
        os.utime(model, ns=(MODEL_MTIME_NS, MODEL_MTIME_NS))
    _sparsify_placeholders(os.path.join(bundle, "cache"))
    return model, bundle_config(bundle)


def _sparsify_placeholders(cache: str) -> None:
    for root, _dirs, files in os.walk(cache):
        if PLACEHOLDER in files:
            path = os.path.join(root, PLACEHOLDER)
            st = os.stat(path)
            if st.st_size and getattr(st, "st_blocks", 0) * 512 >= st.st_size // 2:  # written out by a copy
                os.truncate(path, 0)
                os.truncate(path, st.st_size)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="a .gguf file (default: DualPath's built-in stories260K.gguf)")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="the phone's configuration (default: %(default)s)")
    p.add_argument("--out", default=DEFAULT_BUNDLE, help="the bundle folder (default: %(default)s)")
    p.add_argument("--install", metavar="DIR", help="on the phone (Termux): make the bundle DIR ready to load")
    args = p.parse_args(argv)
    if args.install:
        ready = install(args.install)
        if ready is None:
            print(f"{args.install}: no model/*.gguf in this folder", file=sys.stderr)
            return 1
        model = ready[0]
        bundle = os.path.dirname(os.path.dirname(model))
        print(f'dualpath run --config {bundle}/config.yaml --set model_cache.dir={bundle}/cache '
              f'--model {model} "Once upon a time"')
        return 0
    model = make_bundle(args.model, args.config, args.out)
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _d, fs in os.walk(args.out) for f in fs
               if f != PLACEHOLDER)
    print(f"{args.out}: {os.path.basename(model)}, its entry and config.yaml ({size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
