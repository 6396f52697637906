"""localspec: lossless speculative decoding for llama.cpp models."""

__version__ = "0.1.0"

from localspec.engine.library import load_gpu_build_first  # noqa: E402

load_gpu_build_first()  # before any numpy import (see there)
