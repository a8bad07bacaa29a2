"""Topology from fake sysfs/procfs trees: exact classes, CPU lists and masks per machine."""

import filecmp
import os

import pytest
from platform_testlib import FIXTURES, MACHINES, fixture_topology, make_fixtures

from dualpath.errors import ConfigError
from dualpath.platform.topology import (
    CPU_CLASSES_ENV,
    format_cpulist,
    load_topology,
    parse_cpulist,
    read_topology,
    smallest_l2_bytes,
)

# name -> (source, uniform, offline, [(class, cpus, cores, mask, capacity, max_freq_khz)], parts by cpu)
EXPECTED = {
    "snapdragon_8gen2": ("cpu_capacity", False, (), [
        ("prime", (7,), (7,), 0x80, 1024, 3187200),
        ("big", (3, 4, 5, 6), (3, 4, 5, 6), 0x78, 609, 2803200),
        ("little", (0, 1, 2), (0, 1, 2), 0x07, 206, 2016000)],
        ["Cortex-A510"] * 3 + ["Cortex-A715"] * 2 + ["Cortex-A710"] * 2 + ["Cortex-X3"]),
    "rk3588": ("cpu_capacity", False, (), [
        ("big", (4, 5, 6, 7), (4, 5, 6, 7), 0xf0, 1024, 2400000),
        ("little", (0, 1, 2, 3), (0, 1, 2, 3), 0x0f, 397, 1800000)],
        ["Cortex-A55"] * 4 + ["Cortex-A76"] * 4),
    "exynos_4plus4": ("cpuinfo_max_freq", False, (), [
        ("big", (4, 5, 6, 7), (4, 5, 6, 7), 0xf0, None, 2000000),
        ("little", (0, 1, 2, 3), (0, 1, 2, 3), 0x0f, None, 1500000)],
        ["Cortex-A7"] * 4 + ["Cortex-A15"] * 4),
    "dimensity_9300": ("cpu_capacity", False, (), [
        ("prime", (7,), (7,), 0x80, 1024, 3250000),
        ("big", (4, 5, 6), (4, 5, 6), 0x70, 897, 2850000),
        ("little", (0, 1, 2, 3), (0, 1, 2, 3), 0x0f, 344, 2000000)],
        ["Cortex-A720"] * 4 + ["Cortex-X4"] * 4),
    "intel_i7_1260p": ("intel_hybrid", False, (), [
        ("big", (0, 1, 2, 3, 4, 5, 6, 7), (0, 2, 4, 6), 0x00ff, None, 4700000),
        ("little", (8, 9, 10, 11, 12, 13, 14, 15), (8, 9, 10, 11, 12, 13, 14, 15), 0xff00, None, 3400000)],
        ["P-core"] * 8 + ["E-core"] * 8),
    "x86_vm": ("none", True, (), [
        ("all", (0, 1, 2, 3), (0, 1, 2, 3), 0x0f, None, None)],
        [""] * 4),
    "rk3399_cpu5_offline": ("cpu_capacity", False, (5,), [
        ("big", (4,), (4,), 0x10, 1024, 1800000),
        ("little", (0, 1, 2, 3), (0, 1, 2, 3), 0x0f, 381, 1416000)],
        ["Cortex-A53"] * 4 + ["Cortex-A72"]),
}


def test_every_fixture_has_an_expectation():
    assert set(MACHINES) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_classes_cpus_and_masks_are_exact(name):
    source, uniform, offline, classes, parts = EXPECTED[name]
    topo = fixture_topology(name)
    assert topo.source == source
    assert topo.uniform is uniform
    assert topo.offline == offline
    assert [(c.name, c.cpus, c.cores, c.mask, c.capacity, c.max_freq_khz) for c in topo.classes] == classes
    assert [c.part for c in topo.cpus] == parts
    assert topo.little.name == classes[-1][0]
    for cls in topo.classes:  # every CPU knows its class, and the classes partition the online CPUs
        assert all(topo.cpu(c).cls == cls.name for c in cls.cpus)
    assert sorted(c for cls in topo.classes for c in cls.cpus) == list(topo.online)


def test_little_is_the_lowest_capacity_group_not_a_core_name():
    topo = fixture_topology("dimensity_9300")  # no A5x core on this chip
    assert topo.little.cpus == (0, 1, 2, 3)
    assert {topo.cpu(c).part for c in topo.little.cpus} == {"Cortex-A720"}


def test_a715_and_a710_share_the_big_class_on_8gen2():
    topo = fixture_topology("snapdragon_8gen2")
    assert [topo.cpu(c).freq_domain for c in (3, 5, 7)] == [(3, 4, 5, 6), (3, 4, 5, 6), (7,)]
    assert topo.cls("big").cpus == (3, 4, 5, 6)


def test_smt_siblings_are_known_and_the_lowest_sibling_names_the_core():
    topo = fixture_topology("intel_i7_1260p")
    assert topo.smt
    assert [topo.cpu(c).siblings for c in (0, 1, 6, 7, 8)] == [(0, 1), (0, 1), (6, 7), (6, 7), (8,)]
    assert [topo.cpu(c).core for c in (1, 7, 15)] == [0, 6, 15]
    assert not fixture_topology("rk3588").smt


def test_offline_cpu_is_left_out_of_cpus_and_classes():
    topo = fixture_topology("rk3399_cpu5_offline")
    assert topo.online == (0, 1, 2, 3, 4)
    with pytest.raises(KeyError, match="cpu 5 is not online"):
        topo.cpu(5)


def test_fixture_files_equal_the_generator_output(tmp_path):
    make_fixtures.main(str(tmp_path))

    def same(a, b):
        cmp = filecmp.dircmp(a, b)
        assert not cmp.left_only and not cmp.right_only, (a, cmp.left_only, cmp.right_only)
        _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
        assert not mismatch and not errors, (a, mismatch, errors)
        for sub in cmp.common_dirs:
            same(os.path.join(a, sub), os.path.join(b, sub))

    for name in MACHINES:
        same(os.path.join(FIXTURES, name), os.path.join(tmp_path, name))


def test_this_machine_reads_without_error():
    topo = read_topology()
    assert set(topo.online) >= set(os.sched_getaffinity(0))
    assert topo.classes and all(cls.cpus for cls in topo.classes)


# --- odd trees ---------------------------------------------------------------

def _machine(tmp_path, cpus, **kw):
    root = str(tmp_path / "m")
    make_fixtures.write_machine(root, make_fixtures.Machine(cpus=cpus, **kw))
    return read_topology(os.path.join(root, "sys"), os.path.join(root, "proc"))


def test_four_groups_are_prime_big_mid_little(tmp_path):
    # Snapdragon 8 Gen 3 shape: 2 A520, 3 A720 @3.15 GHz, 2 A720 @2.96 GHz, 1 X4 @3.3 GHz.
    Cpu = make_fixtures.Cpu
    cpus = ([Cpu(c, 0xd80, 300, 2265600) for c in (0, 1)] + [Cpu(c, 0xd81, 880, 3148800) for c in (2, 3, 4)]
            + [Cpu(c, 0xd81, 826, 2956800) for c in (5, 6)] + [Cpu(7, 0xd82, 1024, 3302400)])
    topo = _machine(tmp_path, cpus, cpuinfo_style="arm64")
    assert [(c.name, c.cpus) for c in topo.classes] == [
        ("prime", (7,)), ("big", (2, 3, 4)), ("mid", (5, 6)), ("little", (0, 1))]


def test_equal_capacity_falls_back_to_max_frequency_on_arm(tmp_path):
    # A device tree without capacity-dmips-mhz: the kernel reports 1024 everywhere.
    Cpu = make_fixtures.Cpu
    cpus = [Cpu(c, 0xd05, 1024, 1800000) for c in range(4)] + [Cpu(c, 0xd0b, 1024, 2200000) for c in (4, 5)]
    topo = _machine(tmp_path, cpus, cpuinfo_style="arm64")
    assert topo.source == "cpuinfo_max_freq"
    assert [(c.name, c.cpus) for c in topo.classes] == [("big", (4, 5)), ("little", (0, 1, 2, 3))]


def test_x86_favoured_cores_within_ten_percent_are_one_class(tmp_path):
    Cpu = make_fixtures.Cpu
    cpus = [Cpu(c, max_freq_khz=5300000 if c < 2 else 5100000) for c in range(8)]
    topo = _machine(tmp_path, cpus, cpuinfo_style="x86", model_name="x", features="avx2")
    assert topo.uniform and topo.source == "none"
    assert [(c.name, c.cpus) for c in topo.classes] == [("all", tuple(range(8)))]


def test_x86_without_hybrid_lists_splits_on_a_large_frequency_gap(tmp_path):
    # AMD Strix Point shape: Zen 5 @5.1 GHz and Zen 5c @3.3 GHz, no cpu_core/cpu_atom lists.
    Cpu = make_fixtures.Cpu
    cpus = [Cpu(c, max_freq_khz=5100000 if c < 4 else 3300000) for c in range(12)]
    topo = _machine(tmp_path, cpus, cpuinfo_style="x86", model_name="x", features="avx2")
    assert [(c.name, c.cpus) for c in topo.classes] == [("big", (0, 1, 2, 3)), ("little", tuple(range(4, 12)))]


def test_cpu_part_alone_separates_little_cores(tmp_path):
    Cpu = make_fixtures.Cpu
    cpus = [Cpu(c, 0xd03) for c in range(4)] + [Cpu(c, 0xd09) for c in range(4, 8)]  # A53 + A73, no cpufreq
    topo = _machine(tmp_path, cpus, cpuinfo_style="arm64")
    assert topo.source == "cpu_part"
    assert [(c.name, c.cpus) for c in topo.classes] == [("big", (4, 5, 6, 7)), ("little", (0, 1, 2, 3))]


def test_empty_tree_means_one_uniform_cpu(tmp_path):
    topo = read_topology(str(tmp_path / "sys"), str(tmp_path / "proc"))
    assert topo.uniform and topo.online == (0,) and topo.classes[0].cpus == (0,)


def test_unreadable_capacity_files_mean_unknown_not_an_error(tmp_path):
    root = tmp_path / "m"
    make_fixtures.write_machine(str(root), make_fixtures.machines()["rk3588"])
    for c in range(8):  # a directory where a file should be: open() fails like a SELinux denial
        path = root / f"sys/devices/system/cpu/cpu{c}/cpu_capacity"
        path.unlink()
        path.mkdir()
    topo = read_topology(str(root / "sys"), str(root / "proc"))
    assert topo.source == "cpuinfo_max_freq"  # the clocks still tell the clusters apart
    assert [(c.name, c.cpus, c.capacity) for c in topo.classes] == [
        ("big", (4, 5, 6, 7), None), ("little", (0, 1, 2, 3), None)]


# --- override ----------------------------------------------------------------

def test_override_declares_cpu0_big_and_cpu1_little():
    topo = fixture_topology("x86_vm").override("0:big,1:little")
    assert topo.source == "override" and not topo.uniform
    assert [(c.name, c.cpus, c.mask) for c in topo.classes] == [("big", (0,), 0x1), ("little", (1,), 0x2)]
    assert [c.cls for c in topo.cpus] == ["big", "little", "", ""]  # cpu2 and cpu3 unused


def test_override_keeps_hardware_facts_and_orders_classes_biggest_first():
    topo = fixture_topology("snapdragon_8gen2").override("0-2:little,7:prime,3-6:mid")
    assert [(c.name, c.cpus) for c in topo.classes] == [("prime", (7,)), ("mid", (3, 4, 5, 6)), ("little", (0, 1, 2))]
    assert topo.cpu(7).capacity == 1024 and topo.cpu(7).part == "Cortex-X3"


@pytest.mark.parametrize("spec, message", [
    ("0:huge", "class 'huge' must be one of prime, big, mid, little"),
    ("0:big,0:little", "names cpu 0 twice"),
    ("0-1:big,1:little", "names cpu 1 twice"),
    ("0:big,9:little", "names cpu 9, which is not online (online: 0-3)"),
    ("0;big", "must be CPUS:CLASS items joined by commas"),
    ("3-1:big", "range 3-1 is empty"),
])
def test_bad_override_names_the_source_and_the_problem(spec, message):
    with pytest.raises(ConfigError) as err:
        fixture_topology("x86_vm").override(spec, source="power.cpu_classes")
    assert str(err.value).startswith(f"power.cpu_classes: cpu_classes={spec!r}")
    assert message in str(err.value)


def test_environment_override_wins_over_the_config_spec():
    root = os.path.join(FIXTURES, "x86_vm")
    args = (os.path.join(root, "sys"), os.path.join(root, "proc"))
    by_env = load_topology("0:little,1:big", *args, environ={CPU_CLASSES_ENV: "0-1:big,2-3:little"})
    assert [(c.name, c.cpus) for c in by_env.classes] == [("big", (0, 1)), ("little", (2, 3))]
    by_spec = load_topology("0:little,1:big", *args, environ={})
    assert [(c.name, c.cpus) for c in by_spec.classes] == [("big", (1,)), ("little", (0,))]
    assert load_topology("", *args, environ={}).uniform
    with pytest.raises(ConfigError, match=r"^\$DUALPATH_CPU_CLASSES: "):
        load_topology("", *args, environ={CPU_CLASSES_ENV: "0:nope"})


@pytest.mark.parametrize("text, cpus, back", [
    ("0-3,5", (0, 1, 2, 3, 5), "0-3,5"), ("3 4 5 6", (3, 4, 5, 6), "3-6"), ("7\n", (7,), "7"),
    ("", (), ""), ("0,2,4", (0, 2, 4), "0,2,4")])
def test_cpulist_round_trip(text, cpus, back):
    assert parse_cpulist(text) == cpus
    assert format_cpulist(cpus) == back


def test_the_smallest_l2_cache_of_the_online_cpus(tmp_path):
    """A phone's little cores have the smallest L2: read-ahead is sized from it. L1 and
    instruction caches, offline CPUs and unreadable sizes do not count; no cache at all
    is None."""
    base = tmp_path / "devices/system/cpu"
    caches = {0: [(1, "Data", "64K"), (2, "Unified", "512K"), (3, "Unified", "8192K")],
              1: [(1, "Instruction", "64K"), (2, "Unified", "2M")],
              2: [(2, "Unified", "128K")],  # offline
              3: [(2, "Data", "bogus")]}
    for cpu, levels in caches.items():
        for i, (level, kind, size) in enumerate(levels):
            d = base / f"cpu{cpu}/cache/index{i}"
            d.mkdir(parents=True)
            (d / "level").write_text(f"{level}\n")
            (d / "type").write_text(f"{kind}\n")
            (d / "size").write_text(f"{size}\n")
    (base / "online").write_text("0-1,3\n")
    assert smallest_l2_bytes(str(tmp_path)) == 512 << 10
    (base / "online").write_text("1\n")
    assert smallest_l2_bytes(str(tmp_path)) == 2 << 20
    (base / "online").write_text("3\n")
    assert smallest_l2_bytes(str(tmp_path)) is None
    assert smallest_l2_bytes(str(tmp_path / "nowhere")) is None
