"""``dualpath bench vision``: the time to encode one image, and to the first token of a question
about it, DualPath beside llama.cpp's ``mtmd`` on the same text model and projector file; and
DualPath's first token for a second question on the same image, in the same process and after
a restart (the prefix cache on disk: the image's embeddings and pages). With ``--concurrent N``,
a chat's decode rate alone, while a request with N images is encoded beside it, and while that
request's prompt is computed.

The image is ``--image`` (PNG or JPEG) or a seeded noise image of ``--size`` (the encoder's
cost does not depend on what the pixels show); both engines cut it into the same squares
(vision/preprocess.py follows llama.cpp's preprocessing; tests/vision check that the
embeddings agree). Each engine runs in a fresh process per repeat (``harness.run_worker``;
llama.cpp in its own environment, ``_llamacpp_worker.encode_image``), loads the files,
encodes once to warm, then times ``--inner`` encodes of the whole image; its figure is the
median. The engines take turns repeat by repeat (``common.interleaved``) and the table quotes
medians of the repeats; llama.cpp runs flash attention off and on as two variants and the
faster is quoted.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from . import llamacpp
from .common import best_of, interleaved, median_of, write_json
from .embed import time_calls
from .harness import run_worker

TIMEOUT_S = 3600.0
SIZE = "1024x768"


QUESTIONS = (" What is in this picture?", " Which colours does it have?")
"""The first and the second question about the image (after it, as a chat puts them)."""


def ttft_worker(model: str, mmproj: str, image: str, threads: int, prefix: str, questions: list[str]) -> dict:
    """DualPath's run: milliseconds from each question about ``image`` (.npy) to its first
    token, in order, with the prefix cache on disk in ``prefix`` (the image's embeddings and
    pages: a later process finds them)."""
    from ..config import load_config
    from ..llm import LLM
    from ..sampling_params import SamplingParams
    from ..vision.prompt import MARKER

    rgb = np.load(image)
    llm = LLM(model, load_config(None, {"runtime.num_threads": threads}), mmproj=mmproj, prefix_cache=prefix)
    assert llm.images is not None  # loaded with mmproj
    params = SamplingParams(max_tokens=1, temperature=0.0)
    times, cached, positions = [], [], []
    for q in questions:
        t0 = time.perf_counter()
        c = llm.generate(MARKER + q, params, images=[rgb])
        times.append((time.perf_counter() - t0) * 1e3)
        cached.append(c.usage.cached_prompt_tokens)
        positions.append(c.usage.prompt_tokens)
    assert llm.prefix_store is not None
    llm.prefix_store.flush()
    return {"ttft_ms": times, "cached_tokens": cached, "positions": positions,
            "encoded": llm.images.stats["encoded"], "from_disk": llm.images.stats["from_disk"]}


def worker(mmproj: str, image: str, threads: int, inner: int) -> dict:
    """DualPath's run: milliseconds to cut ``image`` (.npy) into squares and encode them."""
    from ..executor.vision import VisionEncoder
    from ..models.store import ModelStore
    from ..vision.preprocess import squares

    rgb = np.load(image)
    encoder = VisionEncoder(ModelStore().load(mmproj, projector=True), threads)
    cut = squares(rgb, encoder.spec)
    ms = time_calls(lambda: encoder.encode(squares(rgb, encoder.spec).images), inner) * 1e3
    import resource

    return {"encode_ms": ms, "chunks": len(cut.images), "tokens": len(cut.images) * encoder.tokens_per_square,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


CHAT_TURN_TOKENS = 128
"""A reply of the chat beside the images: turn after turn of this many tokens, so that its
context, and with it a step's cost, stays the same from the first window to the last."""


def concurrent_worker(model: str, mmproj: str, image: str, threads: int, images: int, alone_s: float) -> dict:
    """DualPath's run: a chat decodes alone for ``alone_s`` (replies of ``CHAT_TURN_TOKENS``,
    one after another), then a request with ``images`` copies of ``image`` (each shifted a
    little: every one is encoded) arrives; the chat's token times give its decode rate alone,
    while the images are encoded, and while the request's prompt (the images' rows) is
    computed, and its longest wait between two tokens in each phase; then it decodes alone
    again for ``alone_s``, and "alone" is the mean of the two."""
    import threading

    from ..config import load_config
    from ..llm import LLM
    from ..sampling_params import SamplingParams
    from ..vision.prompt import MARKER

    rgb = np.load(image)
    llm = LLM(model, load_config(None, {"runtime.num_threads": threads}), mmproj=mmproj)
    assert llm.images is not None  # loaded with mmproj
    times: list[float] = []
    stop = threading.Event()

    def chat() -> None:
        params = SamplingParams(max_tokens=CHAT_TURN_TOKENS, temperature=0.0, ignore_eos=True)
        while not stop.is_set():
            for _ in llm.stream("Once upon a time", params):
                times.append(time.perf_counter())

    thread = threading.Thread(target=chat, daemon=True)
    thread.start()
    while len(times) < 8:  # past the prompt
        time.sleep(0.01)
    t0 = time.perf_counter()
    time.sleep(alone_s)
    t1 = time.perf_counter()
    pictures = [np.roll(rgb, i, axis=1) for i in range(images)]
    ids, embeds = llm.images.prompt(MARKER * images + " What are these?", pictures)
    t2 = time.perf_counter()
    from ..llm import Generation

    for _ in Generation(llm.engine, ids, SamplingParams(max_tokens=1, temperature=0.0), embeds):
        pass
    t3 = time.perf_counter()
    time.sleep(alone_s)
    t4 = time.perf_counter()
    stop.set()
    thread.join()

    def rate(a: float, b: float) -> float:
        return sum(a <= t < b for t in times) / (b - a)

    def longest_gap(a: float, b: float) -> float:
        return float(np.diff([a] + [t for t in times if a <= t < b] + [b]).max()) * 1e3

    alone_gaps = np.diff([t for t in times if t0 <= t < t1])
    return {"alone_tps": (rate(t0, t1) + rate(t3, t4)) / 2, "during_tps": rate(t1, t2), "encode_s": t2 - t1,
            "max_gap_ms": longest_gap(t1, t2), "prefill_tps": rate(t2, t3), "prefill_s": t3 - t2,
            "prefill_max_gap_ms": longest_gap(t2, t3), "alone_step_ms": float(np.median(alone_gaps)) * 1e3,
            "encoded": llm.images.stats["encoded"], "split": llm.images.queue.cores is not None}


def load_image(path: str | None, size: tuple[int, int]) -> np.ndarray:
    """``path`` decoded to (height, width, 3) uint8 RGB, or a seeded noise image of ``size`` (width, height)."""
    if path is None:
        return np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    from ..vision.decode import decode_image

    with open(path, "rb") as f:
        return decode_image(f.read())


def run_vision(model: str, mmproj: str, rgb: np.ndarray, threads: int, repeats: int, inner: int,
               peer: llamacpp.LlamaCppPeer | None, ttft: bool = True) -> dict:
    variants = ["dualpath"] + (llamacpp.variants() if peer is not None else [])
    with tempfile.TemporaryDirectory(prefix="dualpath-bench-vision-") as tmp:
        image = os.path.join(tmp, "image.npy")
        np.save(image, rgb)
        count = iter(range(1 << 30))

        def measure(variant: str) -> dict:
            setting = llamacpp.setting_of(variant)
            if setting is None:
                out = run_worker(worker, {"mmproj": mmproj, "image": image, "threads": threads, "inner": inner},
                                 timeout_s=TIMEOUT_S)
                if ttft:  # a fresh prefix cache: two questions, then a restarted process asks the second again
                    prefix = os.path.join(tmp, f"prefix{next(count)}")
                    kw = {"model": model, "mmproj": mmproj, "image": image, "threads": threads, "prefix": prefix}
                    first = run_worker(ttft_worker, {**kw, "questions": list(QUESTIONS)}, timeout_s=TIMEOUT_S)
                    restart = run_worker(ttft_worker, {**kw, "questions": [QUESTIONS[1]]}, timeout_s=TIMEOUT_S)
                    out.update(first_ms=first["ttft_ms"][0], second_ms=first["ttft_ms"][1],
                               restart_ms=restart["ttft_ms"][0], positions=first["positions"][0],
                               second_cached=first["cached_tokens"][1], restart_cached=restart["cached_tokens"][0],
                               restart_encoded=restart["encoded"])
                return out
            assert peer is not None
            out = peer.encode_image(model, mmproj, image, threads, inner, setting)
            if ttft:
                from ..vision.prompt import MARKER

                first = peer.image_ttft(model, mmproj, image, threads, MARKER + QUESTIONS[0], setting)
                out.update(first_ms=first["ttft_ms"], positions=first["positions"])
            return out

        runs = interleaved(variants, repeats, measure)
    ours = runs["dualpath"][0]
    out = {"model": os.path.basename(model), "mmproj": os.path.basename(mmproj), "image": list(rgb.shape[:2]),
           "threads": threads, "repeats": repeats, "inner": inner, "chunks": ours["chunks"], "tokens": ours["tokens"],
           "dualpath_ms": median_of(runs["dualpath"], "encode_ms"),
           "dualpath_rss_mb": median_of(runs["dualpath"], "peak_rss_mb"), "peer": None}
    if peer is not None:
        settings = {str(llamacpp.setting_of(v)): {"ms": median_of(runs[v], "encode_ms")} for v in llamacpp.variants()}
        best = best_of(settings, lower=("ms",))
        theirs = runs[llamacpp.variants()[0]][0]
        out.update(llama_cpp_ms=best["ms"], flash_attn=best["best"]["ms"], ratio=out["dualpath_ms"] / best["ms"],
                   llama_cpp_chunks=theirs["chunks"], llama_cpp_tokens=theirs["tokens"],
                   settings={s: m["ms"] for s, m in settings.items()},
                   peer={"llama_cpp_python": peer.version, "python": peer.python, "build": peer.system_info})
    if ttft:
        t = {k: median_of(runs["dualpath"], k) for k in ("first_ms", "second_ms", "restart_ms")}
        t.update(positions=ours["positions"], second_cached=ours["second_cached"],
                 restart_cached=ours["restart_cached"], restart_encoded=ours["restart_encoded"])
        if peer is not None:
            settings = {str(llamacpp.setting_of(v)): {"ms": median_of(runs[v], "first_ms")}
                        for v in llamacpp.variants()}
            best = best_of(settings, lower=("ms",))
            t.update(llama_cpp_first_ms=best["ms"], llama_cpp_flash_attn=best["best"]["ms"],
                     llama_cpp_positions=runs[llamacpp.variants()[0]][0]["positions"])
        out["ttft"] = t
    return out


def run_concurrent(model: str, mmproj: str, rgb: np.ndarray, threads: int, images: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="dualpath-bench-vision-") as tmp:
        image = os.path.join(tmp, "image.npy")
        np.save(image, rgb)
        return run_worker(concurrent_worker, {"model": model, "mmproj": mmproj, "image": image, "threads": threads,
                                              "images": images, "alone_s": 5.0}, timeout_s=TIMEOUT_S)


def print_result(res: dict) -> None:
    h, w = res["image"]
    print(f"{res['mmproj']} (text model {res['model']}): one {w}x{h} image, {res['threads']} threads, "
          f"medians of {res['repeats']} runs ({res['inner']} timed encodes each)")
    print(f"DualPath:  {res['dualpath_ms']:9.1f} ms  {res['chunks']} squares, {res['tokens']} embeddings")
    if res["peer"] is not None:
        print(f"llama.cpp: {res['llama_cpp_ms']:9.1f} ms  {res['llama_cpp_chunks']} chunks, "
              f"{res['llama_cpp_tokens']} embeddings ({res['flash_attn']}; "
              + ", ".join(f"{s} {v:.1f}" for s, v in res["settings"].items()) + ")")
        print(f"time ratio (DualPath / llama.cpp): {res['ratio']:.2f}")
    c = res.get("concurrent")
    if c:
        how = "on threads of its own" if c["split"] else "between the engine's steps"
        print(f"a chat decoding while a request's {c['images']} images are encoded ({c['encode_s']:.1f} s, {how}): "
              f"{c['during_tps']:.1f} tokens/s, alone {c['alone_tps']:.1f} "
              f"({c['alone_tps'] / max(c['during_tps'], 1e-9):.2f}x slower); its longest wait between tokens "
              f"{c['max_gap_ms']:.0f} ms, a step alone {c['alone_step_ms']:.1f} ms")
        print(f"  then while the request's prompt is computed ({c['prefill_s']:.1f} s): {c['prefill_tps']:.1f} "
              f"tokens/s, its longest wait {c['prefill_max_gap_ms']:.0f} ms")
    t = res.get("ttft")
    if t:
        print(f"time to first token, a question after the image ({t['positions']} positions): "
              f"DualPath {t['first_ms']:.1f} ms"
              + (f", llama.cpp {t['llama_cpp_first_ms']:.1f} ms ({t['llama_cpp_positions']} positions, "
                 f"{t['llama_cpp_flash_attn']})" if "llama_cpp_first_ms" in t else ""))
        print(f"a second question on the same image: {t['second_ms']:.1f} ms ({t['second_ms'] / t['first_ms']:.3f} "
              f"of the first; {t['second_cached']} positions from the prefix cache)")
        print(f"the second question after a restart: {t['restart_ms']:.1f} ms "
              f"({t['restart_ms'] / t['first_ms']:.3f} of the first; {t['restart_cached']} positions from disk, "
              f"{t['restart_encoded']} images encoded)")


def cmd_bench_vision(args) -> int:
    peer = None if args.no_peer else llamacpp.peer_from_args(args.peer_python)
    rgb = load_image(args.image, args.size)
    res = run_vision(args.model, args.mmproj, rgb, args.threads, args.repeats, args.inner, peer, ttft=not args.no_ttft)
    if args.concurrent:
        res["concurrent"] = {"images": args.concurrent,
                             **run_concurrent(args.model, args.mmproj, rgb, args.threads, args.concurrent)}
    print_result(res)
    if peer is not None:
        llamacpp.print_build(peer)
    write_json(args.json, [res])
    return 0


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        w = h = 0
    if not (1 <= w <= 8192 and 1 <= h <= 8192):
        raise argparse.ArgumentTypeError(f"{text!r}: WIDTHxHEIGHT in pixels, each from 1 to 8192")
    return w, h


def add_parser(bs) -> None:
    v = bs.add_parser("vision", help="time to encode one image, DualPath beside llama.cpp's mtmd, same files")
    v.add_argument("-m", "--model", required=True, help="the text model's GGUF file (llama.cpp needs it)")
    v.add_argument("--mmproj", required=True, help="the projector GGUF file (llama.cpp's --mmproj)")
    v.add_argument("--image", help="a PNG or JPEG file (default: a seeded noise image of --size)")
    v.add_argument("--size", type=_size, default=_size(SIZE), help=f"WIDTHxHEIGHT of the noise image (default {SIZE})")
    v.add_argument("-t", "--threads", type=int, default=2)
    v.add_argument("-r", "--repeats", type=int, default=3, help="processes per engine, interleaved (default 3)")
    v.add_argument("--inner", type=int, default=3, help="timed encodes in each process (default 3)")
    v.add_argument("--no-peer", action="store_true", help="measure DualPath only")
    v.add_argument("--concurrent", type=int, default=0, metavar="IMAGES",
                   help="also time a chat's decode while a request with this many images is encoded (default 0: not)")
    v.add_argument("--no-ttft", action="store_true",
                   help="time the encode only, not the first token of questions about the image")
    v.add_argument("--peer-python", metavar="PATH",
                   help="interpreter of an environment whose llama-cpp-python is the llama.cpp to compare with "
                        f"(default: ${llamacpp.PYTHON_ENV}, else this one); {llamacpp.SETUP_SCRIPT} full builds one")
    v.add_argument("--json", help="also write the figures as JSON here")
    v.set_defaults(func=cmd_bench_vision)
