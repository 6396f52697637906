"""The llama.cpp door: the only package that touches llama-cpp-python (models, head contexts, kernels, memory, the machine)."""
