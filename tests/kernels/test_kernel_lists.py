"""The KV dtypes and kernel ISAs are the C tables' lists (dp_kv_types, dp_isas), read
through ``dualpath.kernels``; what the configuration accepts is the same, and
DUALPATH_DISABLE_CPU_FEATURES takes exactly the ISAs that a CPU feature names."""

import os
import subprocess
import sys

import pytest

import dualpath
from dualpath.config import KVCacheConfig, RuntimeConfig
from dualpath.kernels import KERNEL_FEATURES, KERNEL_ISAS, KV_DTYPE_DOCS, KV_DTYPES, KVArena, available_kernels


def _choices(names: tuple[str, ...]) -> str:
    return ", ".join(map(repr, names))


def test_the_lists_come_from_the_c_tables():
    assert tuple(KV_DTYPE_DOCS) == KV_DTYPES and all(KV_DTYPE_DOCS.values())
    assert KERNEL_ISAS[0] == "generic" and KERNEL_FEATURES == KERNEL_ISAS[1:]  # generic needs no feature
    assert available_kernels()[0] == "generic" and set(available_kernels()) <= set(KERNEL_ISAS)
    for kv_dtype in KV_DTYPES:
        assert KVArena(1 << 16, 1, 1, 2, 64, kv_dtype).kv_dtype == kv_dtype


def test_config_accepts_exactly_the_kernel_lists():
    # config reads the same lists (dualpath.kernels sits beside it in the layer map): its checks take them.
    for kv_dtype in KV_DTYPES:
        assert KVCacheConfig(kv_dtype=kv_dtype).kv_dtype == kv_dtype
    with pytest.raises(dualpath.ConfigError, match=f"must be one of {_choices(KV_DTYPES)}$"):
        KVCacheConfig(kv_dtype="q4")
    for isa in KERNEL_ISAS:
        assert RuntimeConfig(kernel_isa=isa).kernel_isa == isa
    with pytest.raises(dualpath.ConfigError, match=f"must be one of {_choices(('auto',) + KERNEL_ISAS)}$"):
        RuntimeConfig(kernel_isa="sse4")


def _import_with_disabled(value: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DUALPATH_DISABLE_CPU_FEATURES=value)
    return subprocess.run([sys.executable, "-c", "import dualpath.kernels as k; print(k.default_kernel())"],
                          env=env, capture_output=True, text=True)


def test_disabling_every_cpu_feature_by_name_leaves_generic():
    out = _import_with_disabled(" ".join(KERNEL_FEATURES))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["generic"]


@pytest.mark.parametrize("bad", ["avx5l2", "generic", "fp16"])
def test_an_unknown_disabled_feature_fails_naming_it_and_the_features(bad):
    out = _import_with_disabled(f"avx2,{bad}")
    assert out.returncode != 0
    assert (f"ValueError: DUALPATH_DISABLE_CPU_FEATURES='avx2,{bad}': {bad!r} is not a CPU feature; "
            f"the features are {', '.join(KERNEL_FEATURES)}") in out.stderr
