"""CPU topology from sysfs and procfs: which cores are online, which are alike, and their classes.

Cores that compute alike form a class. Classes are named biggest first:

- one group: ``all`` (and ``Topology.uniform`` says nothing tells the cores apart);
- two groups: ``big``, ``little``;
- three: ``prime``, ``big``, ``little`` (prime = a strictly faster top group, e.g. one Cortex-X3);
- four or more: ``prime``, ``big``, ``mid`` (``mid1``, ``mid2``... when there are several), ``little``.

``little`` is the lowest-capacity group whatever its cores are called: on a Dimensity 9300
it is the Cortex-A720s.

What tells cores apart, in this order (the first that does wins):

1. Intel hybrid: ``/sys/devices/cpu_core/cpus`` (P-cores) and ``/sys/devices/cpu_atom/cpus`` (E-cores).
2. ``cpuN/cpu_capacity`` (1024 = the biggest core; arm64 derives it from the device tree's
   ``capacity-dmips-mhz`` times the maximum frequency), then the maximum frequency.
3. ``cpuN/cpufreq/cpuinfo_max_freq`` alone. On x86 frequencies within 10% of each other are
   one group: favoured cores (Turbo Boost Max) run the same microarchitecture a little faster.
4. The ARM ``CPU part`` in ``/proc/cpuinfo``, where it separates known little cores (A5x, A510,
   A520) from others.

Offline CPUs are left out. Every file is optional: a missing or unreadable one (SELinux)
means "unknown", never an exception. ``sysfs_root`` and ``procfs_root`` point at fake trees
in tests.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dualpath.errors import ConfigError

log = logging.getLogger(__name__)

CPU_CLASSES_ENV = "DUALPATH_CPU_CLASSES"
"""Environment variable that declares core classes (wins over ``power.cpu_classes``)."""

CLASS_RANK = {"prime": 0, "big": 1, "mid": 2, "little": 3}
"""Order of the names a user may declare, biggest first."""

# (implementer, part) -> (name, is a little core). Implementer 0x41 is Arm Ltd.
ARM_PARTS: dict[tuple[int, int], tuple[str, bool]] = {
    (0x41, 0xc07): ("Cortex-A7", True), (0x41, 0xc09): ("Cortex-A9", False),
    (0x41, 0xc0d): ("Cortex-A17", False), (0x41, 0xc0e): ("Cortex-A17", False),
    (0x41, 0xc0f): ("Cortex-A15", False),
    (0x41, 0xd03): ("Cortex-A53", True), (0x41, 0xd04): ("Cortex-A35", True),
    (0x41, 0xd05): ("Cortex-A55", True), (0x41, 0xd07): ("Cortex-A57", False),
    (0x41, 0xd08): ("Cortex-A72", False), (0x41, 0xd09): ("Cortex-A73", False),
    (0x41, 0xd0a): ("Cortex-A75", False), (0x41, 0xd0b): ("Cortex-A76", False),
    (0x41, 0xd0d): ("Cortex-A77", False), (0x41, 0xd41): ("Cortex-A78", False),
    (0x41, 0xd44): ("Cortex-X1", False), (0x41, 0xd46): ("Cortex-A510", True),
    (0x41, 0xd47): ("Cortex-A710", False), (0x41, 0xd48): ("Cortex-X2", False),
    (0x41, 0xd4b): ("Cortex-A78C", False), (0x41, 0xd4d): ("Cortex-A715", False),
    (0x41, 0xd4e): ("Cortex-X3", False), (0x41, 0xd80): ("Cortex-A520", True),
    (0x41, 0xd81): ("Cortex-A720", False), (0x41, 0xd82): ("Cortex-X4", False),
    (0x41, 0xd85): ("Cortex-X925", False), (0x41, 0xd87): ("Cortex-A725", False),
    (0x41, 0xd88): ("Cortex-A520AE", True),
}


# ---------------------------------------------------------------------------
# CPU lists: "0-3,5" <-> (0, 1, 2, 3, 5)
# ---------------------------------------------------------------------------

def parse_cpulist(text: str) -> tuple[int, ...]:
    """``"0-3,5"`` (sysfs lists; ``related_cpus`` separates by spaces) -> ``(0, 1, 2, 3, 5)``."""
    cpus: set[int] = set()
    for item in re.split(r"[,\s]+", text.strip()):
        if not item:
            continue
        lo, _, hi = item.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: Iterable[int]) -> str:
    """``(0, 1, 2, 3, 5)`` -> ``"0-3,5"``; empty -> ``""``."""
    ids = sorted(set(cpus))
    runs: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        runs.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(runs)


def cpu_mask(cpus: Iterable[int]) -> int:
    """Bit mask with bit ``c`` set for every CPU ``c`` (as ``taskset`` takes it)."""
    mask = 0
    for c in cpus:
        mask |= 1 << c
    return mask


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class CpuInfo:
    """One online logical CPU."""

    cpu: int
    """Kernel CPU number (0-based, as in ``/sys/devices/system/cpu/cpuN``)."""
    package: int
    """``topology/physical_package_id`` (0 where unknown)."""
    siblings: tuple[int, ...]
    """Online SMT siblings, this CPU included, ascending; ``(cpu,)`` without SMT."""
    capacity: int | None
    """``cpu_capacity`` (1024 = the biggest core); None where the kernel has none."""
    max_freq_khz: int | None
    """``cpufreq/cpuinfo_max_freq``; None without cpufreq (most VMs)."""
    freq_domain: tuple[int, ...]
    """``cpufreq/related_cpus``: CPUs whose clock moves with this one; () where unknown."""
    part: str
    """Core name: ``Cortex-A510``, ``P-core``/``E-core`` on Intel hybrid, ``0x41:0xd99`` for an
    unknown ARM part, ``""`` where nothing says."""
    cls: str
    """Its class (``prime``, ``big``, ``mid``, ``little``, ``all``), or ``""`` when a declared
    override leaves it unused."""

    @property
    def core(self) -> int:
        """The physical core, named by its lowest online logical CPU."""
        return self.siblings[0]


@dataclass(frozen=True)
class CoreClass:
    """Cores that compute alike; a parallel region never spans two classes."""

    name: str
    """``prime``, ``big``, ``mid``/``midN``, ``little`` or ``all``."""
    cpus: tuple[int, ...]
    """Logical CPUs, ascending (SMT siblings included)."""
    cores: tuple[int, ...]
    """One logical CPU per physical core (the lowest sibling), ascending."""
    capacity: int | None
    """``cpu_capacity`` of its cores (the largest, if they differ); None where unknown."""
    max_freq_khz: int | None
    """Maximum frequency of its cores (the largest, if they differ); None where unknown."""

    @property
    def mask(self) -> int:
        return cpu_mask(self.cpus)


@dataclass(frozen=True)
class Topology:
    """The online CPUs and their classes. Build it with ``read_topology`` or ``load_topology``."""

    cpus: tuple[CpuInfo, ...]
    """Online CPUs, ascending."""
    classes: tuple[CoreClass, ...]
    """Classes, biggest first; every class has at least one CPU."""
    uniform: bool
    """True when nothing tells the cores apart (one class, ``all``)."""
    source: str
    """What the classes come from: ``intel_hybrid``, ``cpu_capacity``, ``cpuinfo_max_freq``,
    ``cpu_part``, ``override`` or ``none``."""
    offline: tuple[int, ...] = ()
    """Present but offline CPUs (left out of everything else)."""

    @property
    def online(self) -> tuple[int, ...]:
        return tuple(c.cpu for c in self.cpus)

    @property
    def smt(self) -> bool:
        """Some physical core runs more than one logical CPU."""
        return any(len(c.siblings) > 1 for c in self.cpus)

    @property
    def little(self) -> CoreClass:
        """The lowest class (``all`` on a uniform machine)."""
        return self.classes[-1]

    def cls(self, name: str) -> CoreClass:
        for c in self.classes:
            if c.name == name:
                return c
        raise KeyError(f"no core class {name!r}; this machine has {', '.join(c.name for c in self.classes)}")

    def cpu(self, cpu: int) -> CpuInfo:
        for c in self.cpus:
            if c.cpu == cpu:
                return c
        raise KeyError(f"cpu {cpu} is not online (online: {format_cpulist(self.online)})")

    def override(self, spec: str, source: str = "override") -> Topology:
        """Classes declared by ``spec`` (``"0:big,1:little"``, ``"0-3:little,4-7:big"``) instead of
        detected ones; the hardware facts stay. Online CPUs the spec does not name are left
        unused (a log line says so). Raises ConfigError naming ``source`` for a malformed spec,
        an unknown class, a CPU named twice or a CPU that is not online."""
        declared = _parse_override(spec, source)
        online = set(self.online)
        missing = sorted(set(declared) - online)
        if missing:
            raise ConfigError(f"{source}: cpu_classes={spec!r} names cpu {format_cpulist(missing)}, "
                              f"which is not online (online: {format_cpulist(online)})")
        unused = sorted(online - set(declared))
        if unused:
            log.warning("cpu_classes=%r leaves cpu %s unused", spec, format_cpulist(unused))
        names = sorted(set(declared.values()), key=CLASS_RANK.__getitem__)
        cpus = tuple(dataclasses.replace(c, cls=declared.get(c.cpu, "")) for c in self.cpus)
        classes = tuple(_make_class(name, [c for c in cpus if c.cls == name]) for name in names)
        return Topology(cpus=cpus, classes=classes, uniform=False, source="override", offline=self.offline)


def _parse_override(spec: str, source: str) -> dict[int, str]:
    declared: dict[int, str] = {}
    for item in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*:\s*(\w+)\s*", item)
        if m is None:
            raise ConfigError(f"{source}: cpu_classes={spec!r} must be CPUS:CLASS items joined by commas, "
                              f"e.g. \"0-3:little,4-7:big\" (bad item {item!r})")
        lo, hi, name = int(m[1]), int(m[2] or m[1]), m[3]
        if name not in CLASS_RANK:
            raise ConfigError(f"{source}: cpu_classes={spec!r}: class {name!r} must be one of "
                              f"{', '.join(CLASS_RANK)}")
        if hi < lo:
            raise ConfigError(f"{source}: cpu_classes={spec!r}: range {lo}-{hi} is empty")
        for cpu in range(lo, hi + 1):
            if cpu in declared:
                raise ConfigError(f"{source}: cpu_classes={spec!r} names cpu {cpu} twice")
            declared[cpu] = name
    return declared


def _make_class(name: str, members: list[CpuInfo]) -> CoreClass:
    cpus = tuple(c.cpu for c in members)
    cores = tuple(sorted({min(s for s in c.siblings if s in cpus) for c in members}))
    caps = [c.capacity for c in members if c.capacity is not None]
    freqs = [c.max_freq_khz for c in members if c.max_freq_khz is not None]
    return CoreClass(name=name, cpus=cpus, cores=cores, capacity=max(caps) if caps else None,
                     max_freq_khz=max(freqs) if freqs else None)


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------

def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:  # missing, or denied (SELinux on Android)
        return None


def _read_int(path: str) -> int | None:
    text = _read(path)
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _read_cpulist(path: str) -> tuple[int, ...] | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return parse_cpulist(text)
    except ValueError:
        return None


def _parse_cpuinfo(path: str) -> tuple[dict[int, tuple[int, int]], bool]:
    """``processor -> (implementer, part)`` from ``/proc/cpuinfo``, and whether it is x86."""
    text = _read(path) or ""
    parts: dict[int, tuple[int, int]] = {}
    x86 = False
    for block in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        x86 = x86 or "vendor_id" in fields
        proc, impl, part = fields.get("processor", ""), fields.get("CPU implementer"), fields.get("CPU part")
        if proc.isdigit() and impl and part:
            try:
                parts[int(proc)] = (int(impl, 0), int(part, 0))
            except ValueError:
                pass
    return parts, x86


def read_topology(sysfs_root: str = "/sys", procfs_root: str = "/proc") -> Topology:
    """Read the online CPUs and group them into classes (see the module docstring)."""
    base = os.path.join(sysfs_root, "devices", "system", "cpu")
    online = _online_cpus(base)
    present = _read_cpulist(os.path.join(base, "present")) or ()
    offline = tuple(sorted(set(present) - set(online)))
    parts, x86 = _parse_cpuinfo(os.path.join(procfs_root, "cpuinfo"))
    p_cores = set(_read_cpulist(os.path.join(sysfs_root, "devices", "cpu_core", "cpus")) or ())
    e_cores = set(_read_cpulist(os.path.join(sysfs_root, "devices", "cpu_atom", "cpus")) or ())
    hybrid = bool(p_cores & set(online)) and bool(e_cores & set(online))

    raw = []
    for cpu in online:
        d = os.path.join(base, f"cpu{cpu}")
        siblings = _read_cpulist(os.path.join(d, "topology", "core_cpus_list")) \
            or _read_cpulist(os.path.join(d, "topology", "thread_siblings_list")) or (cpu,)
        siblings = tuple(s for s in siblings if s in online) or (cpu,)
        package = _read_int(os.path.join(d, "topology", "physical_package_id"))
        if hybrid and cpu in p_cores:
            part = "P-core"
        elif hybrid and cpu in e_cores:
            part = "E-core"
        elif cpu in parts:
            impl, num = parts[cpu]
            part = ARM_PARTS.get(parts[cpu], (f"{impl:#x}:{num:#x}", False))[0]
        else:
            part = ""
        raw.append(CpuInfo(cpu=cpu, package=package if package is not None else 0, siblings=siblings,
                           capacity=_read_int(os.path.join(d, "cpu_capacity")),
                           max_freq_khz=_read_int(os.path.join(d, "cpufreq", "cpuinfo_max_freq")),
                           freq_domain=_read_cpulist(os.path.join(d, "cpufreq", "related_cpus")) or (),
                           part=part, cls=""))

    source, rank = _rank_cpus(raw, parts, x86, p_cores if hybrid else set())
    levels = sorted(set(rank.values()), reverse=True)  # biggest first
    names = _class_names(len(levels))
    name_of = {level: name for level, name in zip(levels, names)}
    cpus = tuple(dataclasses.replace(c, cls=name_of[rank[c.cpu]]) for c in raw)
    classes = tuple(_make_class(name, [c for c in cpus if c.cls == name]) for name in names)
    topo = Topology(cpus=cpus, classes=classes, uniform=len(classes) == 1, source=source, offline=offline)
    log.debug("topology: %s (%s)", ", ".join(f"{c.name} {format_cpulist(c.cpus)}" for c in classes), source)
    return topo


def _cache_size(text: str | None) -> int | None:
    """A sysfs cache ``size`` ("1024K", "2M") in bytes."""
    m = re.fullmatch(r"(\d+)([KMG]?)", text or "")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)] if m else None


def smallest_l2_bytes(sysfs_root: str = "/sys") -> int | None:
    """The smallest level-2 data (or unified) cache of the online CPUs, in bytes; None where
    sysfs says nothing of it (some VMs and Android kernels). A phone's little cores have
    the smallest, and decode may run there."""
    base = os.path.join(sysfs_root, "devices/system/cpu")
    sizes = []
    for cpu in _online_cpus(base):
        cache = os.path.join(base, f"cpu{cpu}", "cache")
        try:
            names = os.listdir(cache)
        except OSError:
            continue
        for name in names:
            d = os.path.join(cache, name)
            if _read_int(os.path.join(d, "level")) == 2 and _read(os.path.join(d, "type")) in ("Data", "Unified"):
                size = _cache_size(_read(os.path.join(d, "size")))
                if size:
                    sizes.append(size)
    return min(sizes) if sizes else None


def _online_cpus(base: str) -> tuple[int, ...]:
    online = _read_cpulist(os.path.join(base, "online"))
    if online:
        return online
    # No 'online' file: every cpuN directory whose own 'online' flag is not 0 (cpu0 often has none).
    found = []
    try:
        names = os.listdir(base)
    except OSError:
        names = []
    for name in names:
        if re.fullmatch(r"cpu\d+", name) and _read(os.path.join(base, name, "online")) != "0":
            found.append(int(name[3:]))
    return tuple(sorted(found)) or (0,)


def _rank_cpus(cpus: list[CpuInfo], parts: Mapping[int, tuple[int, int]], x86: bool,
               p_cores: set[int]) -> tuple[str, dict[int, tuple]]:
    """``(source, cpu -> comparable rank)``: equal ranks share a class, higher is bigger."""
    if p_cores:
        return "intel_hybrid", {c.cpu: (int(c.cpu in p_cores),) for c in cpus}
    caps = [c.capacity for c in cpus]
    freqs = [c.max_freq_khz for c in cpus]
    if None not in caps and len(set(caps)) > 1:
        return "cpu_capacity", {c.cpu: (c.capacity, c.max_freq_khz or 0) for c in cpus}
    if None not in freqs and len(set(freqs)) > 1:
        if not x86:
            return "cpuinfo_max_freq", {c.cpu: (c.max_freq_khz,) for c in cpus}
        # x86 without hybrid lists: merge frequencies within 10% (favoured cores).
        level, groups, prev = 0, {}, None
        for f in sorted({f for f in freqs if f is not None}, reverse=True):
            if prev is not None and f < 0.9 * prev:
                level -= 1
            groups[f], prev = level, f
        if len(set(groups.values())) > 1:
            return "cpuinfo_max_freq", {c.cpu: (groups[c.max_freq_khz or 0],) for c in cpus}
    littles = {c.cpu: ARM_PARTS.get(parts[c.cpu], ("", False))[1] for c in cpus if c.cpu in parts}
    if len(littles) == len(cpus) and len(set(littles.values())) > 1:
        return "cpu_part", {cpu: (int(not little),) for cpu, little in littles.items()}
    return "none", {c.cpu: (0,) for c in cpus}


def _class_names(n: int) -> list[str]:
    """Names for ``n`` groups, biggest first."""
    if n == 1:
        return ["all"]
    if n == 2:
        return ["big", "little"]
    if n == 3:
        return ["prime", "big", "little"]
    mids = ["mid"] if n == 4 else [f"mid{i}" for i in range(1, n - 2)]
    return ["prime", "big", *mids, "little"]


def load_topology(spec: str = "", sysfs_root: str = "/sys", procfs_root: str = "/proc",
                  environ: Mapping[str, str] | None = None) -> Topology:
    """``read_topology``, then the declared classes: ``$DUALPATH_CPU_CLASSES`` if set, else
    ``spec`` (``power.cpu_classes``); both empty = the detected classes."""
    env = (os.environ if environ is None else environ).get(CPU_CLASSES_ENV, "").strip()
    topo = read_topology(sysfs_root, procfs_root)
    if env:
        log.info("core classes from %s=%r", CPU_CLASSES_ENV, env)
        return topo.override(env, source=f"${CPU_CLASSES_ENV}")
    if spec.strip():
        return topo.override(spec, source="power.cpu_classes")
    return topo
