"""GGUF files as untrusted input: the bounded header reader, sandboxed chat templates, and the pair checker."""
