"""Run by test_affinity.py in a fresh interpreter: ONNX Runtime's global thread pool is
process-wide and, once another test has created it, ORT refuses per-session pools (the
only kind that takes affinities). Prints one JSON object.

    python ort_placement_probe.py phases CPUS[/CPUS...]   e.g. "0,1" or "0/1"
    python ort_placement_probe.py global_pool_then_per_session
"""

import json
import sys
import threading

import numpy as np
import onnxruntime as ort  # imported before any pinning: the import starts an idle thread
from onnx import TensorProto, helper, numpy_helper

from dualpath.platform.affinity import ort_affinity_string, pin_current_thread, thread_placement


def model_bytes() -> bytes:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 256])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def session(cpus: tuple[int, ...] | None):
    so = ort.SessionOptions()
    if cpus is None:
        so.use_per_session_threads = False
    else:
        so.intra_op_num_threads = len(cpus)
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if len(cpus) > 1:
            so.add_session_config_entry("session.intra_op_thread_affinities", ort_affinity_string(cpus, len(cpus)))
    return ort.InferenceSession(model_bytes(), so, providers=["CPUExecutionProvider"])


def phases(spec: str) -> dict:
    """One session per phase ("0,1/1": phase 0 on cpus 0,1; phase 1 on cpu 1); run each
    phase with the caller pinned to its first CPU, twice in turn; report placements."""
    plans = [tuple(int(c) for c in p.split(",")) for p in spec.split("/")]
    x = np.ones((256, 256), np.float32)
    before = set(thread_placement())
    sessions = [session(cpus) for cpus in plans]
    steps = []
    for i in list(range(len(plans))) * 2:
        pin_current_thread({plans[i][0]})
        for _ in range(20):  # warm-up: ORT workers pin themselves shortly after they start
            sessions[i].run(None, {"x": x})
        placement = thread_placement()
        me = placement[threading.get_native_id()]
        new = {tid: [cpu, sorted(allowed)] for tid, (_, cpu, allowed) in placement.items() if tid not in before}
        steps.append({"phase": i, "caller": [me[1], sorted(me[2])], "new_threads": new})
    return {"steps": steps}


def global_pool_then_per_session() -> dict:
    from onnxruntime.capi import _pybind_state

    _pybind_state.set_global_thread_pool_sizes(2, 1)
    session(None)
    try:
        session((0,))
    except Exception as e:  # noqa: BLE001 - the message is the result
        return {"per_session_after_global": "refused", "message": str(e)}
    return {"per_session_after_global": "ok"}


if __name__ == "__main__":
    mode = sys.argv[1]
    result = phases(sys.argv[2]) if mode == "phases" else global_pool_then_per_session()
    print(json.dumps(result))
