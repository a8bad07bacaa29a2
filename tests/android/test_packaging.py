"""Android packaging: the Termux recipe, the python-for-android recipe, the app's buildozer.spec,
and the core install without tokenizers and onnx (android/README.md).

The recipes are checked against pyproject.toml (version, the dependencies left on Android).
The core install is checked for real: a Python process in which tokenizers, onnx and
ml_dtypes cannot be imported (as on a phone) loads stories260K.gguf from a converted-model
cache entry made beforehand with them, and must reproduce llama2.c's greedy token ids.
"""

from __future__ import annotations

import ast
import configparser
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from tests_shared import REPO_ROOT, require_file

ANDROID = REPO_ROOT / "android"
APP = REPO_ROOT / "examples" / "android_app"
RECIPE = ANDROID / "p4a" / "dualpath" / "__init__.py"
TERMUX_BUILD = ANDROID / "termux" / "build.sh"
TERMUX_INSTALL = ANDROID / "termux" / "install.sh"
SPEC = APP / "buildozer.spec"
ANDROID_ENV = {"sys_platform": "android", "platform_system": "Android"}
LEFT_OUT_ON_ANDROID = {"onnx", "ml_dtypes", "tokenizers"}
"""They need a C++ or Rust build on Android; the core works without them."""
CHILD_TIMEOUT_S = 300


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    with open(REPO_ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def requirements(on_android: bool) -> dict[str, Requirement]:
    """pyproject's dependencies that apply on Android (or on a desktop), by name."""
    env = ANDROID_ENV if on_android else {"sys_platform": "linux", "platform_system": "Linux"}
    reqs = (Requirement(r) for r in pyproject()["dependencies"])
    return {r.name: r for r in reqs if r.marker is None or r.marker.evaluate(env)}


def recipe_class_attrs() -> dict:
    """The class attributes of the recipe class (pythonforandroid is not installed: read, not imported)."""
    tree = ast.parse(RECIPE.read_text())
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)
               and any(getattr(b, "id", None) == "PyProjectRecipe" for b in n.bases)]
    assert len(classes) == 1, "android/p4a/dualpath: expected one PyProjectRecipe subclass"
    attrs = {}
    for node in classes[0].body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                attrs[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    instances = [n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "recipe"]
    assert instances and getattr(instances[0].value.func, "id", None) == classes[0].name, \
        "python-for-android loads the module-level `recipe = ...Recipe()`"
    return attrs


def module_constant(name: str):
    tree = ast.parse(RECIPE.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{RECIPE}: no {name}")


def termux_build_vars(tmp_path: Path) -> dict[str, str]:
    """Source build.sh as termux-packages does and read its variables back."""
    numpy_recipe = tmp_path / "packages" / "python-numpy" / "build.sh"
    numpy_recipe.parent.mkdir(parents=True)
    numpy_recipe.write_text('TERMUX_PKG_VERSION="2.4.4"\n')
    names = ["TERMUX_PKG_HOMEPAGE", "TERMUX_PKG_DESCRIPTION", "TERMUX_PKG_LICENSE", "TERMUX_PKG_MAINTAINER",
             "TERMUX_PKG_VERSION", "TERMUX_PKG_SRCURL", "TERMUX_PKG_SHA256", "TERMUX_PKG_DEPENDS",
             "TERMUX_PKG_BUILD_IN_SRC", "TERMUX_PKG_PYTHON_CROSS_BUILD_DEPS", "TERMUX_PKG_PYTHON_RUNTIME_DEPS"]
    script = f'. "{TERMUX_BUILD}"\n' + "".join(f'printf "%s\\0" "${name}"\n' for name in names)
    env = {"PATH": os.environ["PATH"], "TERMUX_SCRIPTDIR": str(tmp_path), "DUALPATH_SRCDIR": "/src/dualpath"}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True, timeout=30)
    assert out.stderr == "", out.stderr
    return dict(zip(names, out.stdout.split("\0")))


def split_pep508_list(text: str) -> dict[str, Requirement]:
    """``"'gguf>=0.10', 'pyyaml>=6.0'"`` (termux-packages' form) -> requirements by name."""
    reqs = (Requirement(item.strip().strip("'\"")) for item in text.split(","))
    return {r.name: r for r in reqs}


# -- pyproject: what an Android install leaves out ----------------------------------------------
def test_android_leaves_out_only_the_compiled_extras_and_extras_restore_them_with_the_same_pins():
    desktop, android = requirements(on_android=False), requirements(on_android=True)
    assert set(desktop) - set(android) == LEFT_OUT_ON_ANDROID
    assert set(android) == {"numpy", "onnxruntime", "gguf", "pyyaml", "jinja2"}
    extras = {Requirement(r).name: Requirement(r) for extra in ("convert", "bpe")
              for r in pyproject()["optional-dependencies"][extra]}
    assert set(extras) == LEFT_OUT_ON_ANDROID
    for name in LEFT_OUT_ON_ANDROID:
        assert extras[name].specifier == desktop[name].specifier, name


# -- Termux ---------------------------------------------------------------------------------------
def test_termux_build_sh_names_pyproject_version_and_depends_on_termux_numpy_and_onnxruntime(tmp_path):
    v = termux_build_vars(tmp_path)
    assert v["TERMUX_PKG_VERSION"] == pyproject()["version"] == "0.1.0"
    depends = [d.strip() for d in v["TERMUX_PKG_DEPENDS"].split(",")]
    assert {"python", "python-numpy", "python-onnxruntime"} <= set(depends)
    assert "python-pip" in depends  # termux-packages requires it for TERMUX_PKG_PYTHON_RUNTIME_DEPS
    assert v["TERMUX_PKG_SRCURL"] == "file:///src/dualpath"
    assert v["TERMUX_PKG_PYTHON_CROSS_BUILD_DEPS"] == "'numpy==2.4.4'"  # the target's numpy version
    assert v["TERMUX_PKG_LICENSE"] == pyproject()["license"]["text"]
    assert 0 < len(v["TERMUX_PKG_DESCRIPTION"]) <= 100  # termux-packages' lint limit
    assert all(v[k] for k in ("TERMUX_PKG_HOMEPAGE", "TERMUX_PKG_MAINTAINER", "TERMUX_PKG_SHA256"))
    assert v["TERMUX_PKG_BUILD_IN_SRC"] == "true"
    # numpy and onnxruntime are Termux packages; the rest of the Android core comes from pip.
    pure = {n: r for n, r in requirements(on_android=True).items() if n not in ("numpy", "onnxruntime")}
    runtime = split_pep508_list(v["TERMUX_PKG_PYTHON_RUNTIME_DEPS"])
    assert {n: str(r.specifier) for n, r in runtime.items()} == {n: str(r.specifier) for n, r in pure.items()}


def test_termux_scripts_parse_and_have_no_trailing_whitespace():  # termux-packages' lint rules
    for script in (TERMUX_BUILD, TERMUX_INSTALL):
        subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
        text = script.read_text()
        assert not [i for i, line in enumerate(text.splitlines(), 1) if line != line.rstrip()], script
        assert text.endswith("\n")


def test_termux_install_sh_installs_the_android_core_and_builds_without_isolation_or_deps():
    text = TERMUX_INSTALL.read_text()
    pkg = next(line.split() for line in text.splitlines() if line.startswith("pkg install -y python "))
    assert {"python", "python-numpy", "python-onnxruntime", "clang"} <= set(pkg)
    pip_lines = [line.split()[4:] for line in text.splitlines() if line.startswith("python -m pip install ")]
    installed = {}
    for args in pip_lines:
        for arg in args:
            if not arg.startswith("-") and arg != ".":
                r = Requirement(arg.strip('"'))
                installed[r.name] = r
    for name, req in requirements(on_android=True).items():
        if name not in ("numpy", "onnxruntime"):
            assert name in installed and installed[name].specifier == req.specifier, name
    assert ["--no-build-isolation", "--no-deps", "."] in pip_lines
    assert "onnx" not in installed and "ml_dtypes" not in installed  # tokenizers: only with --with-bpe


# -- python-for-android and buildozer -------------------------------------------------------------
def test_p4a_recipe_version_matches_pyproject_and_depends_on_numpy_and_onnxruntime():
    attrs = recipe_class_attrs()
    assert attrs["version"] == pyproject()["version"]
    assert attrs["name"] == pyproject()["name"] == "dualpath"
    assert {"numpy", "onnxruntime"} <= set(attrs["depends"])
    # Together the recipe names the Android core of pyproject.toml (pip installs python_depends
    # without their dependencies, so jinja2's markupsafe is named too), and nothing left out.
    named = set(attrs["depends"]) | set(attrs["python_depends"])
    assert named == set(requirements(on_android=True)) | {"markupsafe"}
    assert not named & LEFT_OUT_ON_ANDROID
    for name in module_constant("SOURCES"):
        assert (REPO_ROOT / name).exists(), f"the recipe copies {name}, which the checkout lacks"


def read_spec() -> configparser.SectionProxy:
    spec = configparser.ConfigParser()
    spec.read(SPEC)
    return spec["app"]


def spec_list(app: configparser.SectionProxy, key: str) -> list[str]:
    return [item.strip() for item in app[key].split(",") if item.strip()]


def test_buildozer_spec_requirements_are_the_recipe_and_its_dependencies():
    app, attrs = read_spec(), recipe_class_attrs()
    reqs = spec_list(app, "requirements")
    assert {"python3", "kivy", "dualpath"} <= set(reqs)
    assert set(attrs["depends"]) | set(attrs["python_depends"]) <= set(reqs)
    assert not set(reqs) & LEFT_OUT_ON_ANDROID
    local_recipes = (SPEC.parent / app["p4a.local_recipes"]).resolve()
    assert local_recipes == (ANDROID / "p4a").resolve() and (local_recipes / "dualpath" / "__init__.py").is_file()
    assert spec_list(app, "android.archs") == ["arm64-v8a"]
    assert int(app["android.minapi"]) >= 24 and app["android.ndk_api"] == app["android.minapi"]
    assert app["version"] == pyproject()["version"]
    assert (SPEC.parent / app["source.dir"] / "main.py").is_file()


# -- the core without tokenizers and onnx, for real ----------------------------------------------
UNIMPORTABLE = """
import sys

class _Absent:
    '''tokenizers, onnx and ml_dtypes cannot be imported, as on a phone without them.'''
    names = ("tokenizers", "onnx", "ml_dtypes")

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

assert not set(_Absent.names) & set(sys.modules), "imported before the test could block them"
sys.meta_path.insert(0, _Absent())
"""

CORE_CHECKS = """
import json
args = json.loads(sys.argv[1])
out = {}
import dualpath
from dualpath import SamplingParams, load_config

llm = dualpath.LLM(args["model"], load_config(None, {"kv_cache.kv_dtype": "f32"}))
out["cache"] = llm.load_stats["cache"]
c = llm.generate(args["prompt_ids"], SamplingParams(temperature=0, max_tokens=args["max_tokens"]))
out["ids"] = list(c.token_ids)
llm.engine.shutdown()
try:
    dualpath.LLM(args["model"], load_config(None, {"model_cache.dir": args["empty_cache"]}))
    out["convert_error"] = None
except dualpath.ModelLoadError as e:
    out["convert_error"] = str(e)
from dualpath.tokenizer import TokenizerSpec, build_tokenizer
try:
    build_tokenizer(TokenizerSpec(model="gpt2", tokens=("a", "b", "ab"), merges=("a b",), pre="gpt2"))
    out["bpe_error"] = None
except dualpath.TokenizerError as e:
    out["bpe_error"] = str(e)
out["imported"] = sorted(n for n in _Absent.names if n in sys.modules)
print(json.dumps(out))
"""

BUNDLE_CHECKS = """
import json
args = json.loads(sys.argv[1])
sys.path.insert(0, args["app_dir"])
import dualpath
import model_bundle

model, config = model_bundle.install(args["bundle"])
llm = dualpath.LLM(model, config)
c = llm.generate(args["prompt_ids"], dualpath.SamplingParams(temperature=0, max_tokens=args["max_tokens"]))
print(json.dumps({"cache": llm.load_stats["cache"], "ids": list(c.token_ids),
                  "imported": sorted(n for n in _Absent.names if n in sys.modules)}))
"""


def run_without_tokenizers_and_onnx(script: str, args: dict, cache_dir: Path) -> dict:
    env = dict(os.environ, DUALPATH_CACHE_DIR=str(cache_dir))
    proc = subprocess.run([sys.executable, "-c", UNIMPORTABLE + script, json.dumps(args)], env=env,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def golden_run(models_dir):
    """llama2.c run.c's greedy ids for "Once upon a time" (the reference of tests/api/test_golden.py)."""
    runs = json.loads(require_file(models_dir / "reference" / "greedy_token_ids.json").read_text())["runs"]
    run = next(r for r in runs if r["name"] == "greedy_once_upon_a_time")
    steps = 256  # run.c -n 256 counts prompt + generated positions; its last token is not fed back
    return {"prompt_ids": run["prompt_ids"], "max_tokens": steps - len(run["prompt_ids"]) + 1,
            "expected": run["generated_ids"]}


@pytest.fixture(scope="module")
def core_results(gguf_path, golden_run, tmp_path_factory):
    """One child process without tokenizers/onnx, against an entry made here with them (the
    child's f32 KV cache reproduces run.c's ids exactly; the entry does not depend on it)."""
    import dualpath

    cache = tmp_path_factory.mktemp("android-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DUALPATH_CACHE_DIR", str(cache))
        llm = dualpath.LLM(gguf_path)
        assert llm.load_stats["cache"] == "miss"
        llm.engine.shutdown()
    args = {"model": str(gguf_path), "empty_cache": str(tmp_path_factory.mktemp("android-empty-cache")),
            "prompt_ids": golden_run["prompt_ids"], "max_tokens": golden_run["max_tokens"]}
    return run_without_tokenizers_and_onnx(CORE_CHECKS, args, cache)


def test_without_tokenizers_and_onnx_a_cached_llama_vocab_model_loads_and_generates_golden_ids(core_results,
                                                                                               golden_run):
    assert core_results["cache"] == "hit"
    assert core_results["ids"] == golden_run["expected"]
    assert core_results["imported"] == []


def test_without_onnx_a_first_conversion_raises_model_load_error_naming_onnx_and_the_command(core_results,
                                                                                            gguf_path):
    message = core_results["convert_error"]
    assert message is not None, "a first conversion without onnx must fail"
    assert message.startswith(f"{gguf_path}: ")
    assert "needs the onnx package" in message
    assert "pip install 'onnx>=1.16'" in message and "dualpath[convert]" in message
    assert "android/README.md" in message


def test_without_tokenizers_a_byte_level_bpe_vocabulary_raises_tokenizer_error_naming_the_command(core_results):
    message = core_results["bpe_error"]
    assert message is not None, "a gpt2 vocabulary without tokenizers must fail"
    assert "Hugging Face tokenizers" in message
    assert "pip install 'tokenizers>=0.19'" in message and "pkg install rust" in message


def test_app_bundle_made_on_a_desktop_loads_after_a_copy_without_onnx(gguf_path, golden_run, tmp_path):
    sys.path.insert(0, str(APP))
    try:
        import model_bundle
    finally:
        sys.path.remove(str(APP))
    # configs/android.yaml with an f32 KV cache: run.c's ids exactly on every machine (f16 KV
    # may leave them at a near-tie, tests/kernels/test_forced_isa_end_to_end.py).
    config = yaml.safe_load(Path(model_bundle.DEFAULT_CONFIG).read_text())
    config["kv_cache"]["kv_dtype"] = "f32"
    config_path = tmp_path / "android-f32.yaml"
    config_path.write_text(yaml.safe_dump(config))
    bundle = tmp_path / "desktop" / "bundle"
    model_bundle.make_bundle(str(gguf_path), str(config_path), str(bundle))
    include_exts = set(spec_list(read_spec(), "source.include_exts"))
    for path in bundle.rglob("*"):
        if path.is_file():
            assert path.suffix.lstrip(".") in include_exts, f"buildozer.spec would leave out {path}"
    # What an APK does to the files: plain copies, so new mtimes and written-out sparse files.
    phone = tmp_path / "phone" / "bundle"
    shutil.copytree(bundle, phone, copy_function=shutil.copyfile)
    copied_model = next((phone / "model").glob("*.gguf"))
    assert copied_model.stat().st_mtime_ns != model_bundle.MODEL_MTIME_NS
    args = {"app_dir": str(APP), "bundle": str(phone), "prompt_ids": golden_run["prompt_ids"],
            "max_tokens": golden_run["max_tokens"]}
    got = run_without_tokenizers_and_onnx(BUNDLE_CHECKS, args, tmp_path / "unused-default-cache")
    assert got["cache"] == "hit"
    assert got["ids"] == golden_run["expected"]
    assert got["imported"] == []
    placeholders = list((phone / "cache").rglob(model_bundle.PLACEHOLDER))
    assert placeholders
    if holes_supported(tmp_path):  # install() made the written-out placeholders sparse again
        assert all(p.stat().st_blocks * 512 < p.stat().st_size // 2 for p in placeholders)


def holes_supported(folder: Path) -> bool:
    probe = folder / "sparse-probe"
    with open(probe, "wb") as f:
        f.truncate(1 << 20)
    return probe.stat().st_blocks * 512 < (1 << 19)


def test_a_bundle_of_an_8bit_model_holds_graphs_for_onnxruntime_before_1_22_too(tmp_path, gguf_path):
    """stories260K in Q8_0: its 172-row FFN matrices are not whole 16s, so they stay
    MatMulNBits (8 bits) and the bundle needs the -dq8 graphs too. A model whose 8-bit
    matrices are all our kernels' (llama3-tiny) needs none: one folder serves both."""
    from dualpath.graph.parts import graph_folder_name
    from dualpath.models.synth import quantize_gguf, synth_gguf

    sys.path.insert(0, str(APP))
    try:
        import model_bundle
    finally:
        sys.path.remove(str(APP))
    ours = synth_gguf(tmp_path / "tiny-q8.gguf", "llama3-tiny", "Q8_0", seed=0)
    model_bundle.make_bundle(str(ours), model_bundle.DEFAULT_CONFIG, str(tmp_path / "ours"))
    assert len([p for p in (tmp_path / "ours" / "cache").rglob("graphs-*") if p.is_dir()]) == 1
    model = quantize_gguf(str(gguf_path), str(tmp_path / "q8.gguf"), "Q8_0")
    bundle = tmp_path / "bundle"
    model_bundle.make_bundle(str(model), model_bundle.DEFAULT_CONFIG, str(bundle))
    from dualpath.executor.session import NBITS8_SINCE, ORT_VERSION

    folders = sorted(p.name for p in (bundle / "cache").rglob("graphs-*") if p.is_dir())
    if ORT_VERSION < NBITS8_SINCE:  # this runtime's graphs are the ones for before 1.22
        assert len(folders) == 1 and "-dq8-" in folders[0], folders
        return
    assert len(folders) == 2, folders  # one for this ONNX Runtime, one for those before 1.22
    older = [f for f in folders if "-dq8-" in f]
    assert len(older) == 1 and older[0].replace("-dq8", "") in folders
    rt = model_bundle.bundle_config(str(bundle)).runtime
    assert older[0].startswith(graph_folder_name(rt.quantized_matmul_accuracy, 0, nbits8=False).rsplit("-c", 1)[0])
