"""The path router, as the scheduler sees it: prefill longer than
``seq_path_threshold`` -> SEQUENTIAL, shorter -> HYBRID; decode whose measured
locality score reaches ``locality_threshold`` -> SEQUENTIAL, else RANDOM;
``path_mode`` forces one path. The rule itself is ``dualpath.cache.routing`` (the
cache applies it by default), documented there in full.
"""

from ..cache.routing import Path, Phase, route

__all__ = ["Path", "Phase", "route"]
