"""Grammar-constrained decoding with llguidance: the token masks verification applies, and forced tokens.

Speculation stays lossless with respect to the constrained distribution: row i of a verification is
masked exactly as the target alone would mask it after the context plus the first i drafted tokens, so
the acceptance rule compares drafts against the distribution target-alone constrained decoding samples
from. A draft token the grammar refuses has probability 0 there and is rejected like any other.

Tokens the grammar forces (a key, a closing brace, a function's name) are drafted for free: the target
still verifies them, so a forced token that the target's own tokenization would not choose costs one
rejected draft position, never a different answer.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Sequence

import llguidance
import llguidance.llamacpp
import numpy as np

from localspec.engine.llama.model import Model
from localspec.errors import GrammarError

# The separators templates write (their tojson is json.dumps), and no other whitespace.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@functools.lru_cache(maxsize=4)
def _tokenizer(model: Model) -> llguidance.LLTokenizer:
    # About a second for a 150k-token vocabulary, so built once per model. It calls the binding's deprecated
    # llama_token_get_attr once per token: one warning per token would drown a test run's output.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return llguidance.llamacpp.lltokenizer_from_vocab(model.vocab_handle)


def compact_json(schema: dict, *, lenient: bool = False) -> str:
    """``schema`` as llguidance's ``%json`` takes it, asking for compact JSON (", " and ": " separators,
    no free whitespace): a model cannot wander into whitespace, and the separators become forced tokens.

    ``lenient``: keywords llguidance does not implement (an unknown ``format``, ``dependentRequired``...)
    are ignored instead of refused, so the answer may break only those.
    """
    return json.dumps({**schema, "x-guidance": {**JSON_LAYOUT, "lenient": lenient}})


def json_schema_grammar(schema: dict) -> str:
    """A Lark grammar (llguidance's dialect) for one JSON value valid against ``schema``."""
    return f"start: %json {compact_json(schema)}"


def special_token_forms(model: Model, texts: Sequence[str]) -> dict[str, str]:
    """Of ``texts``, those that are one special token of ``model``, mapped to llguidance's ``<[id]>`` form."""
    tokenizer = _tokenizer(model)
    forms = {}
    for text in texts:
        ids = model.tokenize(text, add_bos=False, special=True)
        if len(ids) == 1 and tokenizer.is_special_token(ids[0]):
            forms[text] = f"<[{ids[0]}]>"
    return forms


_NEG_INF_BITS = np.float32(-np.inf).view(np.int32)


def _refuse(row: np.ndarray, allowed: np.ndarray) -> None:
    """Set ``row`` (contiguous float32) to -inf where ``allowed`` is False, without branches: writing
    the refused ids one by one costs up to 9x more when a mask is mixed, as inside a JSON string."""
    refused = allowed.view(np.uint8).astype(np.int32)
    refused -= 1  # 0 where allowed, all bits set where refused
    bits = row.view(np.int32)
    bits &= ~refused
    bits |= refused & _NEG_INF_BITS


class GrammarConstraint:
    """The grammar state of one generation: masks logits rows and follows the emitted tokens.

    Raises:
        GrammarError: the grammar (or a JSON schema in it) cannot be built; the message says why.
    """

    def __init__(self, model: Model, grammar: str) -> None:
        self._tokenizer = _tokenizer(model)
        self._matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
        if self._matcher.is_error():
            # llguidance's message is "at LINE(COL): what failed" plus the grammar line and a caret.
            reason = self._matcher.get_error().splitlines()[0].partition(": ")[2]
            raise GrammarError(f"the output grammar cannot be built: {reason}; fix or simplify the JSON schema")
        self.n_vocab = model.n_vocab
        self._bits = np.zeros((1, (self._tokenizer.vocab_size + 31) // 32), dtype=np.int32)

    def allowed(self) -> np.ndarray:
        """A boolean (n_vocab,) mask of the tokens the grammar allows next."""
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little", count=self.n_vocab).view(bool)

    def restrict(self, logits: np.ndarray, draft: Sequence[int] = ()) -> None:
        """Mask ``logits`` in place: row i as after the tokens so far plus ``draft[:i]``.

        Rows after the first draft token the grammar refuses are left alone: verification stops there.
        """
        consumed = 0
        for i in range(len(draft) + 1):
            allowed = self.allowed()
            _refuse(logits[i], allowed)
            if i == len(draft) or not allowed[draft[i]]:
                break
            self._matcher.consume_token(draft[i])
            consumed += 1
        if consumed:
            self._matcher.rollback(consumed)

    def advance(self, tokens: Sequence[int]) -> None:
        """Follow the tokens emitted (each was allowed by the mask its row got)."""
        for token in tokens:
            self._matcher.consume_token(token)

    def step_back(self, n: int) -> None:
        """Forget the last ``n`` tokens followed (a draft model's look-ahead)."""
        if n:
            self._matcher.rollback(n)

    def forced(self) -> list[int]:
        """Tokens the grammar allows no alternative to, next (often none)."""
        return self._matcher.compute_ff_tokens()
