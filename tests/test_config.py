"""Config loading: defaults match the shipped YAML, bad input names file, key and range."""

import dataclasses
import os
from pathlib import Path

import pytest
import yaml

from dualpath.config import Config, KVCacheConfig, RuntimeConfig, load_config, with_overrides
from dualpath.errors import ConfigError

DEFAULT_YAML = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(text)
    return path


def test_default_yaml_loads_to_exactly_the_code_defaults():
    assert load_config(DEFAULT_YAML) == Config()


def test_default_yaml_lists_every_key_of_every_section():
    data = yaml.safe_load(DEFAULT_YAML.read_text())
    sections = {f.name: f.metadata["section"] for f in dataclasses.fields(Config)}
    assert set(data) == set(sections)
    for name, cls in sections.items():
        assert set(data[name]) == {f.name for f in dataclasses.fields(cls)}, name


def test_every_setting_has_a_docstring_comment_in_default_yaml():
    lines = [line for line in DEFAULT_YAML.read_text().splitlines() if line.startswith("  ")]
    assert lines and all("# " in line for line in lines)


def test_no_path_means_defaults():
    assert load_config() == Config()


@pytest.mark.parametrize("text", ["", "runtime:\n", "kv_cache: {}\n"])
def test_empty_file_or_section_means_defaults(tmp_path, text):
    assert load_config(write(tmp_path, text)) == Config()


def test_file_values_override_defaults_and_leave_the_rest(tmp_path):
    path = write(tmp_path, "kv_cache:\n  block_bytes: 4096\n  path_mode: random\n"
                           "runtime:\n  num_threads: 3\n")
    config = load_config(path)
    assert config.kv_cache == KVCacheConfig(block_bytes=4096, path_mode="random")
    assert config.runtime == RuntimeConfig(num_threads=3)


@pytest.mark.parametrize("key, value, allowed", [
    ("kv_cache.block_bytes", "1000", "a power of two between 4096 (4 KiB) and 16777216 (16 MiB)"),
    ("kv_cache.block_bytes", "2048", "between 4096 (4 KiB) and 16777216 (16 MiB)"),
    ("kv_cache.block_bytes", "33554432", "between 4096 (4 KiB) and 16777216 (16 MiB)"),
    ("kv_cache.block_bytes", "true", "a power of two"),  # bool is not an int
    ("kv_cache.block_bytes", "'131072'", "a power of two"),  # a string is not a number
    ("kv_cache.block_bytes", "131072.0", "a power of two"),  # a float is not an int
    ("kv_cache.seq_path_threshold", "0", ">= 1"),
    ("kv_cache.locality_window", "-5", ">= 1"),
    ("kv_cache.prefetch_degree", "65", "between 0 and 64"),
    ("kv_cache.page_tokens", "24", "a power of two between 1 and 1024"),
    ("kv_cache.page_tokens", "2048", "a power of two between 1 and 1024"),
    ("kv_cache.locality_threshold", "1.5", "a number between 0 and 1"),
    ("kv_cache.locality_threshold", ".nan", "a number between 0 and 1"),
    ("kv_cache.locality_threshold", "false", "a number between 0 and 1"),
    ("kv_cache.locality_threshold", "1e-3", "1.0e-3"),  # YAML 1.1 string: the message says why
    ("kv_cache.path_mode", "both", "one of 'dual', 'sequential', 'random'"),
    ("kv_cache.kv_dtype", "bf16", "one of 'f16', 'f32', 'q8'"),
    ("kv_cache.kv_dtype", "16", "one of 'f16', 'f32', 'q8'"),
    ("runtime.num_threads", "-1", "0 (all usable cores) or between 1 and 1024"),
    ("runtime.num_threads", "1025", "0 (all usable cores) or between 1 and 1024"),
    ("runtime.max_context_tokens", "-1", "0 (the model's trained context length) or >= 1"),
    ("runtime.prefill_chunk_tokens", "0", "between 1 and 65536"),
    ("runtime.prefill_chunk_tokens", "65537", "between 1 and 65536"),
    ("runtime.quantized_matmul_accuracy", "5", "one of 0, 1, 2, 3, 4"),
    ("runtime.intra_op_spinning", "1", "true or false"),
    ("runtime.intra_op_spinning", "'yes'", "true or false"),
])
def test_bad_value_error_names_file_key_value_and_range(tmp_path, key, value, allowed):
    section, name = key.split(".")
    path = write(tmp_path, f"{section}:\n  {name}: {value}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message.startswith(f"{path}: {key}=")
    assert "must be " in message and allowed in message


@pytest.mark.parametrize("text, expected", [
    ("kv_cache:\n  blok_bytes: 4096\n", "unknown key kv_cache.blok_bytes (did you mean "
                                              "kv_cache.block_bytes?)"),
    ("runtime:\n  threads: 2\n", "unknown key runtime.threads"),
    ("scheduler:\n  x: 1\n", "unknown key scheduler.x; the top level has kv_cache, runtime"),
    ("num_threads: 2\n", "unknown key num_threads"),
    ("runtime:\n  num_threads:\n    x: 1\n", "runtime.num_threads is a setting, not a section"),
    ("runtime: 4\n", "runtime must be a mapping of num_threads"),
    ("- runtime\n", "must be a mapping with keys kv_cache, runtime, power, server, model_cache, prefix_cache, "
                    "reasoning, got list"),
    ("runtime: [unclosed\n", "invalid YAML"),
    ("runtime:\n  num_threads: 1\n  num_threads: 2\n", "duplicate key 'num_threads'"),
    ("1: 2\n", "key 1 must be a string"),
])
def test_bad_structure_error_names_file_and_key(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: ")
    assert expected in str(err.value)


def test_missing_file_error_names_the_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="nope.yaml: cannot read config file"):
        load_config(path)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_dotted_and_nested_overrides_apply_on_top_of_the_file(tmp_path):
    path = write(tmp_path, "runtime:\n  num_threads: 3\n  prefill_chunk_tokens: 64\n")
    config = load_config(path, {"runtime.num_threads": 2,
                                "kv_cache": {"page_tokens": 32, "kv_dtype": "f32"}})
    assert config.runtime == RuntimeConfig(num_threads=2, prefill_chunk_tokens=64)
    assert config.kv_cache == KVCacheConfig(page_tokens=32, kv_dtype="f32")


def test_override_errors_name_overrides_as_the_source(tmp_path):
    path = write(tmp_path, "runtime:\n  num_threads: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, {"runtime.num_threads": 0.5})
    assert str(err.value).startswith("<overrides>: runtime.num_threads=0.5 must be ")
    with pytest.raises(ConfigError, match=r"^<overrides>: unknown key runtime.nthreads"):
        load_config(None, {"runtime": {"nthreads": 1}})


def test_same_override_key_given_twice_raises():
    with pytest.raises(ConfigError, match="runtime.num_threads is given twice"):
        load_config(None, {"runtime": {"num_threads": 1}, "runtime.num_threads": 2})


def test_with_overrides_returns_a_new_config_and_leaves_the_old_one():
    base = Config()
    new = with_overrides(base, {"kv_cache.locality_threshold": 1})
    assert base == Config()
    assert new.kv_cache.locality_threshold == 1.0
    assert isinstance(new.kv_cache.locality_threshold, float)  # int is stored as float


def test_constructing_in_code_is_validated_too():
    with pytest.raises(ConfigError, match=r"^kv_cache.block_bytes=1000 must be a power of two"):
        KVCacheConfig(block_bytes=1000)
    with pytest.raises(ConfigError, match=r"^runtime.num_threads=True must be .* \(got bool\)"):
        RuntimeConfig(num_threads=True)
    with pytest.raises(ConfigError, match=r"^runtime must be a RuntimeConfig, got dict"):
        Config(runtime={"num_threads": 2})


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().runtime.num_threads = 2


def test_zero_threads_means_every_usable_core():
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert RuntimeConfig().effective_num_threads() == usable
    assert RuntimeConfig(num_threads=3).effective_num_threads() == 3


def test_parse_overrides_reads_key_value_items_as_yaml():
    from dualpath.config import parse_overrides

    assert parse_overrides(None) == {}
    assert parse_overrides(["runtime.num_threads=2", " kv_cache.kv_dtype =f32", "power.cpu_classes=[0, 1]",
                            "server.api_key=a=b"]) == {
        "runtime.num_threads": 2, "kv_cache.kv_dtype": "f32", "power.cpu_classes": [0, 1],
        "server.api_key": "a=b"}


@pytest.mark.parametrize("item, message", [
    ("runtime.num_threads", r"--set 'runtime.num_threads': expected KEY=VALUE \(e.g. runtime.num_threads=2\)"),
    ("=2", r"--set '=2': expected KEY=VALUE"),
    ("runtime.num_threads=[", r"--set 'runtime.num_threads=\[': the value is not valid YAML \("),
])
def test_parse_overrides_names_a_malformed_item(item, message):
    from dualpath.config import parse_overrides

    with pytest.raises(ConfigError, match=message):
        parse_overrides([item])


def test_an_unquoted_off_is_named_with_the_fix(tmp_path):
    """YAML 1.1 reads `speculative: off` as false: the error says to quote it."""
    path = tmp_path / "c.yaml"
    path.write_text("runtime:\n  speculative: off\n")
    with pytest.raises(ConfigError, match=r"runtime.speculative=False must be one of 'off', 'ngram'.*write it quoted"):
        load_config(path)
    path.write_text("runtime:\n  speculative: \"off\"\n")
    assert load_config(path).runtime.speculative == "off"


def test_a_renamed_key_is_read_as_its_new_name_with_a_warning(tmp_path, caplog):
    path = write(tmp_path, "runtime:\n  attention_kernel: generic\n")
    with caplog.at_level("WARNING", logger="dualpath.config"):
        from_file = load_config(path)
        from_override = load_config(None, {"runtime.attention_kernel": "generic"})
        nested = with_overrides(Config(), {"runtime": {"attention_kernel": "generic"}})
    assert from_file.runtime.kernel_isa == from_override.runtime.kernel_isa == nested.runtime.kernel_isa == "generic"
    assert sum("runtime.attention_kernel is now runtime.kernel_isa" in r.getMessage() for r in caplog.records) == 3


def test_a_renamed_key_beside_its_new_name_is_refused(tmp_path):
    path = write(tmp_path, "runtime:\n  attention_kernel: generic\n  kernel_isa: avx2\n")
    with pytest.raises(ConfigError,
                       match=r"x\.yaml: runtime\.attention_kernel and runtime\.kernel_isa are one setting"):
        load_config(path)


def test_what_a_profile_overrides_is_one_table_read_by_the_plan_and_the_path_policy():
    """``PROFILE_OVERRIDES`` is the one home: the governor's plan and the path policy both
    read it (``profile_value``), and other profiles change nothing."""
    from dualpath.cache.policy import PathPolicy
    from dualpath.config import PROFILE_OVERRIDES, PowerConfig, profile_value

    power = PowerConfig(low_power_prefill_chunk_tokens=100, low_power_seq_path_threshold=50000)
    assert set(PROFILE_OVERRIDES) == {"low_power"}
    assert profile_value("low_power", "runtime.prefill_chunk_tokens", 512, power) == 100
    assert profile_value("low_power", "runtime.prefill_chunk_tokens", 64, power) == 64
    assert profile_value("low_power", "runtime.intra_op_spinning", True, power) is False
    assert profile_value("balanced", "runtime.prefill_chunk_tokens", 512, power) == 512
    assert profile_value("low_power", "runtime.prefill_chunk_tokens", 512, None) == 512
    config = with_overrides(Config(), {"power.low_power_prefill_chunk_tokens": 100,
                                       "power.low_power_seq_path_threshold": 50000})
    assert PathPolicy.from_config(config.kv_cache, config.power, "low_power").seq_path_threshold == 50000
    assert PathPolicy.from_config(config.kv_cache, config.power, "balanced").seq_path_threshold == 8192
    # The plan's side (chunk, spinning): tests/platform/test_profiles.py on low_power.yaml.


def test_the_old_kv_cache_section_and_block_size_are_read_with_a_deprecation_warning(tmp_path, caplog):
    old = write(tmp_path, "dualpath_config:\n  block_size: 4096\n  path_mode: random\n")
    with caplog.at_level("WARNING", logger="dualpath.config"):
        from_file = load_config(old)
        from_override = load_config(None, {"dualpath_config.block_size": 8192, "kv_cache.page_tokens": 4})
        nested = with_overrides(Config(), {"dualpath_config": {"kv_dtype": "f32"}})
        half_renamed = load_config(None, {"kv_cache.block_size": 16384})
        empty = load_config(write(tmp_path, "dualpath_config:\n"))
    assert from_file.kv_cache == KVCacheConfig(block_bytes=4096, path_mode="random")
    assert (from_override.kv_cache.block_bytes, from_override.kv_cache.page_tokens) == (8192, 4)
    assert nested.kv_cache.kv_dtype == "f32" and half_renamed.kv_cache.block_bytes == 16384
    assert empty == Config()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("dualpath_config.block_size is now kv_cache.block_bytes (the old name is deprecated)" in m
               for m in messages) == 2
    assert any("dualpath_config.path_mode is now kv_cache.path_mode" in m for m in messages)
    assert any("kv_cache.block_size is now kv_cache.block_bytes" in m for m in messages)


def test_an_old_kv_cache_key_beside_its_new_name_is_refused(tmp_path):
    path = write(tmp_path, "dualpath_config:\n  block_size: 4096\nkv_cache:\n  block_bytes: 8192\n")
    with pytest.raises(ConfigError, match=r"dualpath_config\.block_size and kv_cache\.block_bytes are one setting"):
        load_config(path)


def test_the_old_python_names_still_read_the_kv_cache_section():
    from dualpath import DualPathConfig

    config = load_config(None, {"kv_cache.block_bytes": 8192})
    assert DualPathConfig is KVCacheConfig
    assert config.dualpath_config is config.kv_cache and config.kv_cache.block_size == 8192
