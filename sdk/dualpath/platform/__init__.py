"""CPU topology and features, thread placement, power and thermal state, and the governor
that picks where prefill and decode run. Imports nothing above it (no onnxruntime)."""

from .affinity import ort_affinity_string, pin_current_thread, thread_placement
from .describe import describe, describe_placement
from .governor import Governor, Switch
from .placement import PhaseCheck, PlacementReport, Placer, SetPlacement, ThreadSeen
from .power import BackgroundPowerReader, PowerState, ThermalZone, read_power_state
from .profiles import PROFILES, PhasePlan, Plan, SessionSpec, resolve_plan
from .topology import CoreClass, CpuInfo, Topology, load_topology, read_topology

__all__ = ["BackgroundPowerReader", "CoreClass", "CpuInfo", "Governor", "PROFILES", "PhaseCheck", "PhasePlan",
           "Placer", "PlacementReport", "Plan", "PowerState", "SessionSpec", "SetPlacement", "Switch", "ThermalZone",
           "ThreadSeen", "Topology", "describe", "describe_placement", "load_topology", "ort_affinity_string",
           "pin_current_thread", "read_power_state", "read_topology", "resolve_plan", "thread_placement"]
