"""Battery, external power and temperature, read from sysfs and ``termux-battery-status``.

Sources, each optional (a missing or denied file, SELinux on Android, means "unknown";
nothing here raises):

- ``/sys/class/power_supply/*/{type,scope,capacity,status,online,temp}``: batteries
  (``type`` Battery, not ``scope`` Device: a mouse's battery is not ours) and external
  supplies (Mains, USB, Wireless...: ``online``).
- ``/sys/class/thermal/thermal_zone*/{type,temp,trip_point_N_temp,trip_point_N_type}``:
  temperatures in millidegrees C; a zone's trip point is its lowest passive, hot or
  critical trip (active trips start fans, they are no limit).
- ``termux-battery-status`` (JSON ``percentage``, ``status``, ``plugged``, ``temperature``),
  run only when sysfs gave no battery: it costs a round trip through Android (a large
  fraction of a second) and can hang, so it runs with a timeout and its process group is killed after.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

BATTERY_STATUS = {"charging": "charging", "discharging": "discharging", "full": "full",
                  "not charging": "not_charging", "not_charging": "not_charging"}
"""sysfs and termux status words (lower-cased) -> ours; anything else (Unknown) -> None."""

_TRIP_TYPES = ("passive", "hot", "critical")


@dataclass(frozen=True)
class ThermalZone:
    """One readable ``/sys/class/thermal/thermal_zoneN``."""

    name: str
    """Directory name, e.g. ``thermal_zone3``."""
    type: str
    """Its ``type`` file (``cpu-1-0-usr``, ``x86_pkg_temp``, ``battery``...), ``""`` if unreadable."""
    temp_c: float
    """Temperature in degrees C."""
    trip_c: float | None
    """Lowest passive/hot/critical trip point in degrees C; None where none is readable."""

    @property
    def headroom_c(self) -> float | None:
        """Degrees C left before the trip point (negative past it); None without one."""
        return None if self.trip_c is None else self.trip_c - self.temp_c


@dataclass(frozen=True)
class PowerState:
    """What is known about power and heat; None everywhere = nothing is known."""

    battery_pct: float | None = None
    """Battery charge, 0..100 (the mean when there are several batteries)."""
    battery_status: str | None = None
    """``charging``, ``discharging``, ``full`` or ``not_charging``; None = unknown."""
    ac_online: bool | None = None
    """An external supply (mains, USB, wireless) is connected; None = unknown."""
    battery_temp_c: float | None = None
    """Battery temperature in degrees C."""
    zones: tuple[ThermalZone, ...] = ()
    """Readable thermal zones, in directory order."""
    sources: tuple[str, ...] = ()
    """What answered: ``power_supply``, ``thermal``, ``termux``."""

    @property
    def hottest(self) -> ThermalZone | None:
        """The zone with the highest temperature."""
        return max(self.zones, key=lambda z: z.temp_c, default=None)

    @property
    def thermal_c(self) -> float | None:
        z = self.hottest
        return None if z is None else z.temp_c

    @property
    def tightest(self) -> ThermalZone | None:
        """The zone closest to (or furthest past) its trip point."""
        with_trip = [z for z in self.zones if z.trip_c is not None]
        return min(with_trip, key=lambda z: z.trip_c - z.temp_c, default=None)  # type: ignore[operator]

    @property
    def on_external_power(self) -> bool | None:
        """True when charging, full or an external supply is online; False when discharging
        or every supply is offline; None when nothing says."""
        if self.battery_status in ("charging", "full") or self.ac_online:
            return True
        if self.battery_status == "discharging" or self.ac_online is False:
            return False
        return None

    @property
    def discharging(self) -> bool:
        """Running from the battery: status says so, or no supply is online and a battery exists."""
        if self.battery_status == "discharging":
            return True
        return self.battery_status is None and self.ac_online is False and self.battery_pct is not None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:  # missing, or denied by SELinux
        return None


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _millideg(text: str | None) -> float | None:
    """A thermal reading in degrees C. The kernel writes millidegrees; some old Android
    kernels write degrees, so values under 1000 in magnitude are taken as degrees.
    Readings outside -40..150 C are sensors that are off or broken: None."""
    value = _number(text)
    if value is None:
        return None
    deg = value / 1000.0 if abs(value) >= 1000 else value
    return deg if -40.0 <= deg <= 150.0 else None


def _zone(path: str, name: str) -> ThermalZone | None:
    temp = _millideg(_read(os.path.join(path, "temp")))
    if temp is None:
        return None
    trips = []
    for entry in _listdir(path):
        m = re.fullmatch(r"trip_point_(\d+)_temp", entry)
        if not m:
            continue
        kind = (_read(os.path.join(path, f"trip_point_{m[1]}_type")) or "").lower()
        trip = _millideg(_read(os.path.join(path, entry)))
        if trip is not None and trip > 0 and (kind in _TRIP_TYPES or not kind):
            trips.append(trip)
    return ThermalZone(name=name, type=_read(os.path.join(path, "type")) or "", temp_c=temp,
                       trip_c=min(trips) if trips else None)


def _merge_status(statuses: list[str]) -> str | None:
    for wanted in ("charging", "discharging", "not_charging", "full"):
        if wanted in statuses and (wanted != "full" or all(s == "full" for s in statuses)):
            return wanted
    return statuses[0] if statuses else None


def read_power_state(sysfs_root: str = "/sys", termux_cmd: str | None = "termux-battery-status",
                     timeout_s: float = 2.0) -> PowerState:
    """Read every source that answers; ``termux_cmd=None`` skips termux."""
    sources: list[str] = []
    supplies = os.path.join(sysfs_root, "class", "power_supply")
    pcts: list[float] = []
    statuses: list[str] = []
    batt_temps: list[float] = []
    online: list[bool] = []
    for name in _listdir(supplies):
        d = os.path.join(supplies, name)
        kind = (_read(os.path.join(d, "type")) or "").lower()
        if kind == "battery":
            if (_read(os.path.join(d, "scope")) or "").lower() == "device":
                continue  # a peripheral's battery (mouse, headset)
            pct = _number(_read(os.path.join(d, "capacity")))
            if pct is not None and 0 <= pct <= 100:
                pcts.append(pct)
            status = BATTERY_STATUS.get((_read(os.path.join(d, "status")) or "").lower())
            if status:
                statuses.append(status)
            temp = _number(_read(os.path.join(d, "temp")))  # tenths of a degree C
            if temp is not None and -400 <= temp <= 1500:
                batt_temps.append(temp / 10.0)
        elif kind:
            flag = _read(os.path.join(d, "online"))
            if flag in ("0", "1"):
                online.append(flag == "1")
    if pcts or statuses or online or batt_temps:
        sources.append("power_supply")

    zones = []
    thermal = os.path.join(sysfs_root, "class", "thermal")
    for name in _listdir(thermal):
        if name.startswith("thermal_zone"):
            zone = _zone(os.path.join(thermal, name), name)
            if zone is not None:
                zones.append(zone)
    zones.sort(key=lambda z: int(z.name[12:]) if z.name[12:].isdigit() else 1 << 30)
    if zones:
        sources.append("thermal")

    battery_pct = sum(pcts) / len(pcts) if pcts else None
    battery_status = _merge_status(statuses)
    ac_online = any(online) if online else None
    battery_temp_c = max(batt_temps) if batt_temps else None
    if battery_pct is None and termux_cmd:
        data = _run_termux(termux_cmd, timeout_s)
        if data is not None:
            sources.append("termux")
            pct = data.get("percentage")
            if isinstance(pct, (int, float)) and not isinstance(pct, bool) and 0 <= pct <= 100:
                battery_pct = float(pct)
            battery_status = battery_status or BATTERY_STATUS.get(str(data.get("status", "")).lower())
            plugged = data.get("plugged")
            if ac_online is None and isinstance(plugged, str) and plugged:
                ac_online = plugged.upper() != "UNPLUGGED"
            temp = data.get("temperature")
            if battery_temp_c is None and isinstance(temp, (int, float)) and not isinstance(temp, bool) \
                    and -40 <= temp <= 150:
                battery_temp_c = float(temp)
    return PowerState(battery_pct=battery_pct, battery_status=battery_status, ac_online=ac_online,
                      battery_temp_c=battery_temp_c, zones=tuple(zones), sources=tuple(sources))


def _run_termux(cmd: str, timeout_s: float) -> dict | None:
    """The JSON object ``cmd`` prints, or None (absent, failed, timed out, not JSON)."""
    exe = shutil.which(cmd)
    if exe is None:
        return None
    try:
        proc = subprocess.Popen([exe], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError as e:
        log.debug("cannot run %s: %s", exe, e)
        return None
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log.warning("%s did not answer within %.1f s; battery state unknown", exe, timeout_s)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the helpers it started go too
        except OSError:
            pass
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        return None
    if proc.returncode != 0:
        log.debug("%s exited with %d", exe, proc.returncode)
        return None
    try:
        data = json.loads(out.decode("utf-8", errors="replace"))
    except ValueError:
        log.debug("%s printed no JSON", exe)
        return None
    return data if isinstance(data, dict) else None


class BackgroundPowerReader:
    """Reads the power state every ``interval_s`` on a daemon thread, so the governor's
    ``choose()`` between decode steps never waits on ``termux-battery-status`` (a round
    trip through Android, or the whole timeout when it hangs). Calling it returns the latest state at once.

    ``start()`` reads once before returning (so the first choice is informed) and starts
    the thread; ``close()`` stops and joins it. Create it before pinning any thread: the
    reader thread inherits the creating thread's CPU mask.
    """

    def __init__(self, reader: Callable[[], PowerState] = read_power_state, interval_s: float = 5.0):
        self.reader = reader
        self.interval_s = interval_s
        self._state = PowerState()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> BackgroundPowerReader:
        if self._thread is None:
            self._state = self.reader()
            self._thread = threading.Thread(target=self._loop, name="dualpath-power", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._state = self.reader()
            except Exception:  # a reader bug must not kill the thread silently
                log.exception("power state read failed; keeping the previous state")

    def __call__(self) -> PowerState:
        return self._state

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> BackgroundPowerReader:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
