"""Power state from fake sysfs trees and a fake termux-battery-status: every source optional."""

import json
import os
import threading
import time

import pytest

from dualpath.platform.power import PowerState, ThermalZone, read_power_state

PHONE = {
    "sys/class/power_supply/battery/type": "Battery",
    "sys/class/power_supply/battery/capacity": "57",
    "sys/class/power_supply/battery/status": "Discharging",
    "sys/class/power_supply/battery/temp": "312",          # tenths of a degree
    "sys/class/power_supply/usb/type": "USB",
    "sys/class/power_supply/usb/online": "0",
    "sys/class/power_supply/wireless/type": "Wireless",
    "sys/class/power_supply/wireless/online": "0",
    "sys/class/thermal/thermal_zone0/type": "cpu-1-0-usr",
    "sys/class/thermal/thermal_zone0/temp": "48300",
    "sys/class/thermal/thermal_zone0/trip_point_0_temp": "125000",
    "sys/class/thermal/thermal_zone0/trip_point_0_type": "critical",
    "sys/class/thermal/thermal_zone0/trip_point_1_temp": "95000",
    "sys/class/thermal/thermal_zone0/trip_point_1_type": "passive",
    "sys/class/thermal/thermal_zone0/trip_point_2_temp": "40000",
    "sys/class/thermal/thermal_zone0/trip_point_2_type": "active",   # a fan step, no limit
    "sys/class/thermal/thermal_zone1/type": "skin-therm",
    "sys/class/thermal/thermal_zone1/temp": "36100",
    "sys/class/thermal/thermal_zone1/trip_point_0_temp": "40000",
    "sys/class/thermal/thermal_zone1/trip_point_0_type": "passive",
    "sys/class/thermal/thermal_zone2/type": "gpuss-0",
    "sys/class/thermal/thermal_zone2/temp": "-274000",     # a sensor that is off
    "sys/class/thermal/thermal_zone10/type": "battery",
    "sys/class/thermal/thermal_zone10/temp": "31",          # an old kernel writing degrees
}


def test_phone_tree_parses_every_field(write_tree):
    state = read_power_state(os.path.join(write_tree(PHONE), "sys"), termux_cmd=None)
    assert state == PowerState(
        battery_pct=57.0, battery_status="discharging", ac_online=False, battery_temp_c=31.2,
        zones=(ThermalZone("thermal_zone0", "cpu-1-0-usr", 48.3, 95.0),
               ThermalZone("thermal_zone1", "skin-therm", 36.1, 40.0),
               ThermalZone("thermal_zone10", "battery", 31.0, None)),
        sources=("power_supply", "thermal"))
    assert (state.thermal_c, state.hottest.type, state.hottest.trip_c) == (48.3, "cpu-1-0-usr", 95.0)
    assert state.tightest.type == "skin-therm" and state.tightest.headroom_c == pytest.approx(3.9)
    assert state.discharging and state.on_external_power is False


def test_laptop_on_ac_with_a_charging_battery_and_a_mouse_battery(write_tree):
    root = write_tree({
        "sys/class/power_supply/AC/type": "Mains",
        "sys/class/power_supply/AC/online": "1",
        "sys/class/power_supply/BAT0/type": "Battery",
        "sys/class/power_supply/BAT0/capacity": "80",
        "sys/class/power_supply/BAT0/status": "Charging",
        "sys/class/power_supply/BAT1/type": "Battery",
        "sys/class/power_supply/BAT1/capacity": "60",
        "sys/class/power_supply/BAT1/status": "Full",
        "sys/class/power_supply/hidpp_battery_0/type": "Battery",
        "sys/class/power_supply/hidpp_battery_0/scope": "Device",   # the mouse
        "sys/class/power_supply/hidpp_battery_0/capacity": "5",
        "sys/class/power_supply/hidpp_battery_0/status": "Discharging",
        "sys/class/thermal/thermal_zone0/type": "x86_pkg_temp",
        "sys/class/thermal/thermal_zone0/temp": "61000",
    })
    state = read_power_state(os.path.join(root, "sys"), termux_cmd=None)
    assert (state.battery_pct, state.battery_status, state.ac_online) == (70.0, "charging", True)
    assert state.on_external_power is True and not state.discharging
    assert state.hottest == ThermalZone("thermal_zone0", "x86_pkg_temp", 61.0, None)


def test_nothing_readable_is_all_unknown_and_no_exception(tmp_path):
    state = read_power_state(str(tmp_path / "sys"), termux_cmd=None)
    assert state == PowerState()
    assert state.on_external_power is None and not state.discharging
    assert state.hottest is None and state.thermal_c is None and state.tightest is None


def test_denied_files_are_unknown_and_the_rest_still_reads(write_tree):
    files = dict(PHONE)
    root = write_tree(files)
    for rel in ("sys/class/power_supply/battery/capacity", "sys/class/power_supply/battery/status",
                "sys/class/thermal/thermal_zone0/temp", "sys/class/thermal/thermal_zone1/trip_point_0_temp"):
        path = os.path.join(root, rel)  # a directory where a file should be: open() fails like EACCES
        os.unlink(path)
        os.mkdir(path)
    state = read_power_state(os.path.join(root, "sys"), termux_cmd=None)
    assert (state.battery_pct, state.battery_status, state.ac_online) == (None, None, False)
    assert state.battery_temp_c == 31.2
    zones = [(z.name, z.trip_c) for z in state.zones]
    assert ("thermal_zone0", 95.0) not in zones and ("thermal_zone1", None) in zones
    assert not state.discharging  # no battery reading: nothing says we run from one


def write_fake_termux(tmp_path, body: str) -> str:
    path = tmp_path / "termux-battery-status"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


TERMUX_JSON = {"health": "GOOD", "percentage": 14, "plugged": "UNPLUGGED", "status": "DISCHARGING",
               "temperature": 38.5, "current": -412000}


def test_termux_fills_in_when_sysfs_has_no_battery(tmp_path, write_tree):
    root = write_tree({"sys/class/thermal/thermal_zone0/type": "cpu-0-0",
                       "sys/class/thermal/thermal_zone0/temp": "52000"})
    cmd = write_fake_termux(tmp_path, f"cat <<'JSON'\n{json.dumps(TERMUX_JSON, indent=2)}\nJSON\n")
    state = read_power_state(os.path.join(root, "sys"), termux_cmd=cmd)
    assert (state.battery_pct, state.battery_status, state.ac_online, state.battery_temp_c) == \
        (14.0, "discharging", False, 38.5)
    assert state.sources == ("thermal", "termux")


@pytest.mark.parametrize("plugged, status, ac, ours", [
    ("PLUGGED_AC", "CHARGING", True, "charging"), ("PLUGGED_USB", "FULL", True, "full"),
    ("PLUGGED_WIRELESS", "NOT_CHARGING", True, "not_charging"), ("UNPLUGGED", "UNKNOWN", False, None)])
def test_termux_status_and_plugged_words(tmp_path, plugged, status, ac, ours):
    data = dict(TERMUX_JSON, plugged=plugged, status=status)
    cmd = write_fake_termux(tmp_path, f"echo '{json.dumps(data)}'\n")
    state = read_power_state(str(tmp_path / "sys"), termux_cmd=cmd)
    assert (state.ac_online, state.battery_status) == (ac, ours)


def test_termux_is_not_run_when_sysfs_has_a_battery(tmp_path, write_tree):
    marker = tmp_path / "ran"
    cmd = write_fake_termux(tmp_path, f"touch {marker}\necho '{json.dumps(TERMUX_JSON)}'\n")
    state = read_power_state(os.path.join(write_tree(PHONE), "sys"), termux_cmd=cmd)
    assert state.battery_pct == 57.0 and "termux" not in state.sources
    assert not marker.exists()


def test_hanging_termux_is_killed_at_the_timeout_with_its_children(tmp_path):
    pid_file = tmp_path / "child.pid"
    cmd = write_fake_termux(tmp_path, f"sleep 30 &\necho $! > {pid_file}\nwait\n")
    t0 = time.monotonic()
    state = read_power_state(str(tmp_path / "sys"), termux_cmd=cmd, timeout_s=0.5)
    elapsed = time.monotonic() - t0
    assert state == PowerState()
    assert 0.5 <= elapsed < 2.0
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 2.0
    while _alive(child) and time.monotonic() < deadline:  # SIGKILL lands asynchronously
        time.sleep(0.01)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped by init."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("body", ["echo 'not json'\n", "exit 3\n", "echo '[1, 2]'\n",
                                  "echo '{\"percentage\": \"many\", \"temperature\": true}'\n"])
def test_broken_termux_output_is_unknown(tmp_path, body):
    state = read_power_state(str(tmp_path / "sys"), termux_cmd=write_fake_termux(tmp_path, body))
    assert (state.battery_pct, state.battery_temp_c) == (None, None)


def test_missing_termux_command_is_skipped(tmp_path):
    state = read_power_state(str(tmp_path / "sys"), termux_cmd=str(tmp_path / "no-such-command"))
    assert state == PowerState()


def test_background_reader_answers_at_once_while_a_read_hangs():
    from dualpath.platform.power import BackgroundPowerReader

    calls = []
    slow = threading.Event()

    def reader():
        calls.append(time.monotonic())
        if len(calls) > 1:
            slow.wait(5.0)  # later reads hang until released
        return PowerState(battery_pct=float(len(calls)))

    with BackgroundPowerReader(reader, interval_s=0.01) as bg:
        assert bg().battery_pct == 1.0  # start() read once before returning
        deadline = time.monotonic() + 2.0
        while len(calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        t0 = time.monotonic()
        assert bg().battery_pct == 1.0  # the second read is hanging: the last state, at once
        assert time.monotonic() - t0 < 0.05
        slow.set()
        while bg().battery_pct < 2.0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert bg().battery_pct >= 2.0
    assert bg._thread is None  # closed and joined
