"""localspec: lossless speculative decoding for llama.cpp models."""

__version__ = "0.1.0"
