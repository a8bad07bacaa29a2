"""The engine: requests over a driver that steps the scheduler and the executor
(schedule, run, update_from_output); outputs, handles, speculative decoding, metrics."""
