"""``describe``: the text ``dualpath info`` prints."""

from platform_testlib import fixture_topology

from dualpath.cache.policy import PathPolicy
from dualpath.config import Config, KVCacheConfig, PowerConfig
from dualpath.platform.describe import describe
from dualpath.platform.governor import Governor
from dualpath.platform.power import PowerState, ThermalZone
from dualpath.platform.profiles import resolve_plan

GOLDEN_8GEN2 = """\
CPU topology (8 online CPUs; classes from cpu_capacity)
  cpu  class   core  capacity  max MHz  clock domain  smt siblings  part
  0    little  0     206       2016     0-2           0             Cortex-A510
  1    little  1     206       2016     0-2           1             Cortex-A510
  2    little  2     206       2016     0-2           2             Cortex-A510
  3    big     3     609       2803     3-6           3             Cortex-A715
  4    big     4     609       2803     3-6           4             Cortex-A715
  5    big     5     609       2803     3-6           5             Cortex-A710
  6    big     6     609       2803     3-6           6             Cortex-A710
  7    prime   7     1024      3187     7             7             Cortex-X3
Classes (biggest first):
  prime   cpu 7          mask 0x80  1 core, capacity 1024, max 3187 MHz
  big     cpu 3-6        mask 0x78  4 cores, capacity 609, max 2803 MHz
  little  cpu 0-2        mask 0x7  3 cores, capacity 206, max 2016 MHz
Power: battery 55%, discharging, no external power, battery 31.5 °C (from power_supply, thermal)
  hottest zone: cpu-1-0-usr at 48.0 °C, trip 95.0 °C
  closest to its trip: skin-therm at 36.0 °C, trip 45.0 °C
Profile: balanced (auto): on battery (55%)
  prefill  big cpu 3-6, 4 threads, mask 0x78, pinned; caller on cpu 3; ORT intra_op_thread_affinities "5;6;7"
  decode   little cpu 0-2, 3 threads, mask 0x7, pinned; caller on cpu 0; ORT intra_op_thread_affinities "2;3"
  path: dual, sequential from 8192 tokens, decode by locality >= 0.5 over 512-token runs, prefill chunk 512 tokens, spinning on"""  # noqa: E501


def test_describe_golden_snapdragon_8gen2_on_battery():
    topo = fixture_topology("snapdragon_8gen2")
    power = PowerState(battery_pct=55, battery_status="discharging", ac_online=False, battery_temp_c=31.5,
                       zones=(ThermalZone("thermal_zone0", "cpu-1-0-usr", 48.0, 95.0),
                              ThermalZone("thermal_zone1", "skin-therm", 36.0, 45.0)),
                       sources=("power_supply", "thermal"))
    gov = Governor(topo, lambda: power, Config(), allowed_cpus=range(8))
    plan = gov.choose()  # reads the power state
    path = PathPolicy.from_config(KVCacheConfig(), PowerConfig(), plan.profile).summary()
    assert describe(topo, gov.power, plan, path) == GOLDEN_8GEN2


def test_describe_says_when_all_cores_are_equal_and_power_is_unknown():
    topo = fixture_topology("x86_vm")
    text = describe(topo, PowerState(), resolve_plan("low_power", topo))
    assert "Classes: all cores are equal (nothing tells them apart): all = cpu 0-3" in text.splitlines()
    assert "Power: unknown (no battery, supply or thermal zone is readable)" in text.splitlines()
    assert "Profile: low_power" in text.splitlines()
    assert "  prefill  all cpu 0-1, 2 threads, mask 0x3, pinned; caller on cpu 0; " \
           "ORT intra_op_thread_affinities \"2\"" in text.splitlines()


def test_describe_shows_smt_offline_and_unpinned():
    topo = fixture_topology("intel_i7_1260p")
    plan = resolve_plan("balanced", topo, Config(power=PowerConfig(pin_threads=False)))
    lines = describe(topo, None, plan).splitlines()
    assert "  big     cpu 0-7        mask 0xff  4 cores, 8 logical, capacity -, max 4700 MHz" in lines
    assert "  1    big     0     -         4700     1             0-1           P-core" in lines
    assert "Power: not read" in lines
    assert "  prefill  big cpu 0,2,4,6, 4 threads, mask 0x55, not pinned (OS placement); caller on cpu 0" in lines
    offline = describe(fixture_topology("rk3399_cpu5_offline"), None, plan).splitlines()
    assert "  offline (not used): cpu 5" in offline
