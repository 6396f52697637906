"""localspec: lossless speculative decoding for llama.cpp models."""

__version__ = "0.1.0"

from localspec.engine.llama.library import load_native_libraries_first  # noqa: E402

load_native_libraries_first()  # before any numpy import (see there)
