"""Ctrl-C during an answer: a flag checked between pieces, so the decoder stops cleanly.

A KeyboardInterrupt would be lost if it arrived while llama.cpp calls its Python log callback
(ctypes ignores exceptions raised in callbacks), and could land in the middle of a screen update.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Iterator

from localspec.engine.decoding.text import TextPiece


class CtrlC:
    """While an answer streams, Ctrl-C sets a flag that the answer loop checks between pieces."""

    def __init__(self) -> None:
        self.pressed = False

    def __enter__(self) -> CtrlC:
        self._previous = signal.signal(signal.SIGINT, self._press)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _press(self, signum: int, frame: object) -> None:
        self.pressed = True

    def raise_if_pressed(self) -> None:
        if self.pressed:
            raise KeyboardInterrupt

    def until_pressed(self, pieces: Iterable[TextPiece]) -> Iterator[TextPiece]:
        for piece in pieces:
            if self.pressed:
                return
            yield piece
