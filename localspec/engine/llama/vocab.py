"""llama.cpp's own tokenizer for a GGUF, loaded vocabulary-only: what ``check`` tokenizes sample texts with
(the session hands it to ``gguf.compat.check_pair``, so gguf/ never imports the engine)."""

from __future__ import annotations

from pathlib import Path

from localspec.engine.llama.model import Model
from localspec.errors import GGUFError, LocalspecError


class VocabOnlyTokenizer:
    """llama.cpp's own tokenizer for a GGUF loaded vocabulary-only: no weights, no KV cache.

    Callers validate the header with ``gguf.header.read_header`` first; llama.cpp only ever sees a checked file.
    """

    def __init__(self, path: str | Path) -> None:
        try:
            self._model = Model(path, vocab_only=True)
        except LocalspecError as exc:
            raise GGUFError(f"llama.cpp could not load the vocabulary of {path}: {exc}") from None

    def tokenize(self, text: str) -> list[int]:
        # special=True: special-token strings become their single ids, as in a rendered chat prompt.
        return self._model.tokenize(text, add_bos=False, special=True)

    def __enter__(self) -> VocabOnlyTokenizer:
        return self

    def __exit__(self, *exc) -> None:
        self._model.close()
