"""Tokens to text: the stream ends just before the first stop string, and names it on its last piece
(the only piece that may be empty)."""

from __future__ import annotations

from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.decoding.stats import StopReason
from localspec.engine.decoding.text import stream_text
from localspec.engine.llama.model import Model


def _pieces(tiny_target, stop=()):
    decoder = SpeculativeDecoder(Model(tiny_target, n_ctx=256, n_threads=1), method="lookup")
    prompt = decoder.target.tokenize("hello world the code", add_bos=True)
    return list(stream_text(decoder.target, decoder.generate(prompt, max_tokens=40), stop=stop)), decoder


def test_without_stop_strings_every_piece_has_text(tiny_target):
    pieces, _ = _pieces(tiny_target)
    assert pieces and all(piece.text for piece in pieces)


def test_output_ends_before_the_first_stop_string(tiny_target):
    pieces, _ = _pieces(tiny_target)
    full = "".join(p.text for p in pieces)
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    cut_pieces, decoder = _pieces(tiny_target, stop=(stop, "never-in-the-output"))
    assert "".join(p.text for p in cut_pieces) == full[: full.index(stop)]
    assert decoder.stats.generated_tokens < 40  # the decoder was stopped, not run to the token budget
    assert cut_pieces[-1].stop == stop and all(p.stop is None and p.text for p in cut_pieces[:-1])
    assert all(p.stop is None for p in pieces)


def test_a_stop_string_in_the_round_that_ends_the_budget_is_still_the_reason(tiny_target):
    """The round that emits the stop string may also use up the token budget: the decoder then says
    "length", and its stream says "stop_string" instead."""
    decoder = SpeculativeDecoder(Model(tiny_target, n_ctx=256, n_threads=1), method="none")
    prompt = decoder.target.tokenize("hello world the code", add_bos=True)
    budget = 20
    full = "".join(piece.text for piece in decoder.stream(prompt, max_tokens=budget))
    assert decoder.stats.stop_reason == "length" and decoder.stats.generated_tokens == budget
    stop = next(full[-n:] for n in range(1, len(full) + 1) if full.index(full[-n:]) == len(full) - n)
    pieces = list(decoder.stream(prompt, stop=(stop,), max_tokens=budget))
    assert "".join(p.text for p in pieces) == full[: -len(stop)] and pieces[-1].stop == stop
    assert decoder.stats.generated_tokens == budget  # the stop string came in the budget's last round
    assert decoder.stats.stop_reason == StopReason.STOP_STRING
