"""DualPath: on-device LLM inference on the CPU.

ONNX Runtime runs the dense math; the KV cache and attention are ours.

    >>> import dualpath
    >>> llm = dualpath.LLM("stories260K.gguf")
    >>> llm.generate("Once upon a time", dualpath.SamplingParams(temperature=0)).text
"""

from .chat import Chat
from .completion import Completion, Timings, Usage
from .config import Config, DualPathConfig, KVCacheConfig, RuntimeConfig, load_config
from .errors import (
    ChatTemplateError,
    ConfigError,
    DualPathError,
    InvalidPromptError,
    ModelLoadError,
    PromptTooLongError,
    SamplingParamsError,
    TokenizerError,
)
from .llm import LLM
from .sampling_params import SamplingParams

__version__ = "0.1.0"

__all__ = [
    "LLM", "Chat", "SamplingParams", "Completion", "Usage", "Timings", "Config", "KVCacheConfig", "RuntimeConfig",
    "DualPathConfig", "load_config", "DualPathError", "ModelLoadError", "ConfigError", "SamplingParamsError",
    "PromptTooLongError", "InvalidPromptError", "TokenizerError", "ChatTemplateError", "ModelTaskError",
]
