"""From tokens to text: incremental UTF-8 decoding, stop strings, and each piece's provenance."""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from localspec.engine.decoding.target import Target


@dataclass
class Step:
    """What one round emitted."""

    tokens: list[int]
    sources: list[str]  # per token: TARGET or the drafter's source
    source: str  # the source the round drafted from, or TARGET_ALONE
    drafted: int
    accepted: int


@dataclass
class TextPiece:
    text: str
    source: str  # where the token(s) behind this text came from: TARGET or a drafter's source
    step: Step  # the round it belongs to, for live figures
    stop: str | None = None  # on the last piece, the stop string that ended the text (its text may be empty)


def stream_text(model: Target, steps: Iterable[Step], *, stop: Sequence[str] = ()) -> Iterator[TextPiece]:
    """Turn decoder steps into text pieces, ending at the first stop string (which is not emitted).

    Text that could be the start of a stop string is held back until it is known not to be one. When a
    stop string is found, the last piece names it (the round that held it may also have used up the token
    budget, so the decoder's stop reason alone cannot tell) and the step iterator is closed, so the
    decoder rolls its caches back at once.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    held = ""  # decoded text not yet emitted: an incomplete character or a possible stop-string start
    source, step = "target", None
    longest_stop = max((len(s) for s in stop), default=0)
    iterator = iter(steps)
    try:
        for step in iterator:
            for token, source in zip(step.tokens, step.sources):
                held += decoder.decode(model.token_bytes(token))
                found = [(i, s) for s in stop if (i := held.find(s)) >= 0]
                if found:
                    cut, matched = min(found)
                    yield TextPiece(held[:cut], source, step, stop=matched)
                    return  # the finally below closes the decoder's generator
                safe = len(held) - max(longest_stop - 1, 0)
                if safe > 0:
                    yield TextPiece(held[:safe], source, step)
                    held = held[safe:]
        held += decoder.decode(b"", final=True)
        if held and step is not None:
            yield TextPiece(held, source, step)
    finally:
        if hasattr(iterator, "close"):
            iterator.close()
