"""Running the model: ONNX Runtime sessions, the runner over the KV arena and the step's
arrays, and the memory plan."""
