"""Tokens to text: the stream ends just before the first stop string, and names it on its last piece
(the only piece that may be empty)."""

from __future__ import annotations

from localspec.engine.backend import LlamaModel
from localspec.engine.decoder import SpeculativeDecoder, Step
from localspec.engine.text import stream_text


def _pieces(tiny_target, stop=()):
    decoder = SpeculativeDecoder(LlamaModel(tiny_target, n_ctx=256, n_threads=1), method="lookup")
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
    """A long accepted draft (an answer found in the history, say) can hold the stop string and reach
    the token budget in one round: the decoder then says "length", the last piece knows better."""
    model = LlamaModel(tiny_target, n_ctx=256, n_threads=1, vocab_only=True)
    tokens = model.tokenize("hello world the code", add_bos=False)
    last_round = Step(tokens, ["suffix"] * len(tokens), "suffix", len(tokens) - 1, len(tokens) - 1)
    pieces = list(stream_text(model, [last_round], stop=("world",)))
    assert "".join(p.text for p in pieces).strip() == "hello" and pieces[-1].stop == "world"
    assert all(p.stop is None for p in stream_text(model, [last_round], stop=("nowhere",)))
