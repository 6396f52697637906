"""Prompt lookup: draft tokens by finding the current suffix earlier in the session and copying what followed.

Code edits, quoted files and repeated boilerplate make the answer repeat text the session has already
seen, and there a lookup drafts long runs for free (no draft model). The index is incremental, so a
round costs O(max_ngram) however long the session is.

A renamed identifier breaks a copy at every occurrence. When the answer replaces a token of the text it
copies and then carries on copying, the replacement is learned. Seen once it may be a one-off fix, so a
draft applies it only as its last token (a wrong guess costs one short round); seen twice it is a rename:
drafts apply it throughout and matching treats the two tokens as equal, so the copy runs through the
later occurrences. Writing the old token again unlearns it.

Copies follow their source. A file whose functions repeat near-identical lines gives a short match many
earlier occurrences, and the most recent one is often another function than the one being copied. So
the proposer tracks where a copy in progress reads from: once the answer's last FOLLOW_MIN_MATCH tokens
occurred before, each token that equals the source's next one (or its learned replacement) moves the
source on, and a match elsewhere no longer than the copy does not move it. After an edit (tokens
replaced, inserted or dropped) the copy resumes where the answer meets the source again near where it
left it. Such a copy applies renames but not a replacement seen once: in a file of near-identical
functions, the prompt's own repetition teaches one-off "replacements" (one function's constant for the
previous one's), and the source being copied knows better.
"""

from __future__ import annotations

from collections.abc import Sequence

from localspec.engine.drafters.base import MAX_COPY_DRAFT

DEFAULT_MAX_NGRAM = 4
DEFAULT_MIN_NGRAM = 1
# A token written where a copy's source had another is learned as a replacement when this many tokens
# before it occurred before (a copy) and the two tokens after it follow the source again.
REPLACEMENT_CONTEXT = 4
# A copy resumed after an edit reports at least this match length: a resumed copy is likelier than a
# short match is right, but the model may be writing new text instead.
RESUMED_MATCH_LEN = 3
# A longest match is measured back past max_ngram up to this length: a long verbatim run is a copy in
# progress, and the controller drafts more the longer the run.
MAX_REPORTED_MATCH = 64
# A replacement seen this many times is a rename, applied throughout a draft.
RENAME_SEEN = 2
# After an edit, a copy resumes within this many source tokens of where it broke off, or is dropped.
RESUME_WINDOW = 16
# A copy starts where the last this many tokens (or more) occurred before; an edit that writes them jumps
# the copy there (the answer moved on to another part of the source).
FOLLOW_MIN_MATCH = 3


class PromptLookupIndex:
    """Drafts the continuation of the longest, most recent earlier occurrence of the history's suffix.

    Feed it every token the session sees with ``extend`` (prompt, earlier turns, accepted tokens) and
    ask ``propose`` for a draft. The draft is deterministic, so verification treats it as a point mass.

    Args:
        max_ngram: longest suffix tried first.
        min_ngram: shortest suffix accepted as a match.
        max_draft: cap on the draft length, whatever ``propose`` is asked for.
    """

    def __init__(
        self,
        *,
        max_ngram: int = DEFAULT_MAX_NGRAM,
        min_ngram: int = DEFAULT_MIN_NGRAM,
        max_draft: int = MAX_COPY_DRAFT,
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        if max_draft < 1:
            raise ValueError(f"max_draft must be at least 1, got {max_draft}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.max_draft = max_draft
        self.last_match_len = 0
        self._tokens: list[int] = []
        # n-gram -> position of the token that followed its latest occurrence. An n-gram is indexed only
        # once its follower exists, so the history's own suffix never matches itself.
        self._follower: dict[tuple[int, ...], int] = {}
        # position q -> the follower of the latest earlier occurrence of the REPLACEMENT_CONTEXT tokens before
        # q, kept until q + 2 shows whether the token at q replaced that follower in a copy
        self._copied_from: dict[int, int] = {}
        # learned replacements, old token -> (new token, times seen)
        self._replacements: dict[int, tuple[int, int]] = {}
        self._reset_copy()

    def _reset_copy(self) -> None:
        self._source: int | None = None  # the position a copy in progress reads its next token from
        self._copied = 0  # tokens that copy has followed its source for (halved at each edit)
        self._broken_at: int | None = None  # where the source was when an edit broke the copy
        self._since_break = 0  # tokens written since then

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def history(self) -> Sequence[int]:
        """Every token seen so far; change it only through ``extend`` and ``truncate``."""
        return self._tokens

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens the session has seen (the prompt, then each accepted batch)."""
        for token in tokens:
            token = int(token)
            position = len(self._tokens)
            self._learn_replacement(position, token)
            # The new token is the follower of every n-gram that ends just before it.
            for n in range(self.min_ngram, min(self.max_ngram, position) + 1):
                key = tuple(self._tokens[position - n : position])
                if n == REPLACEMENT_CONTEXT and key in self._follower:
                    self._copied_from[position] = self._follower[key]
                self._follower[key] = position
            self._follow_source(position, token)
            self._tokens.append(token)

    def _learn_replacement(self, position: int, token: int) -> None:
        """Before ``token`` is appended at ``position``: unlearn it as an old token, and learn the token
        two back as a replacement if it took the place of a copied token and the copy then went on."""
        tokens = self._tokens
        self._replacements.pop(token, None)
        edit = position - 2
        source = self._copied_from.pop(edit, None)
        if source is not None and tokens[source] != tokens[edit]:
            if tokens[source + 1] == tokens[edit + 1] and tokens[source + 2] == token:
                old, new = tokens[source], tokens[edit]
                known, seen = self._replacements.get(old, (new, 0))
                self._replacements[old] = (new, seen + 1 if known == new else 1)

    def _follow_source(self, position: int, token: int) -> None:
        """Before ``token`` is appended at ``position``: move the copy's source on (a learned replacement
        counts as the token it replaces), or at an edit break it and resume it, or start one."""
        tokens = self._tokens
        if self._source is not None:
            expected = tokens[self._source]
            if token == expected or self._replacements.get(expected, (None,))[0] == token:
                self._source += 1
                self._copied += 1
                return
            self._broken_at, self._since_break, self._source = self._source, 0, None
        elif self._broken_at is not None:
            self._since_break += 1
            resumed = self._resume(position, token)
            if resumed is not None:
                self._source, self._copied = resumed[0] + 1, resumed[1]
                self._broken_at = None
                return
            if self._since_break >= RESUME_WINDOW:
                self._broken_at = None
        # A copy starts (or, at a break, jumps) where the suffix ending with this token occurred before.
        for n in range(min(self.max_ngram, position + 1), max(self.min_ngram, FOLLOW_MIN_MATCH) - 1, -1):
            source = self._follower.get((*tokens[position - n + 1 : position], token))
            if source is not None:
                self._source, self._broken_at, self._copied = source, None, n
                return

    def _resume(self, position: int, token: int) -> tuple[int, int] | None:
        """Where ``token`` meets the source again after an edit, and the copied length to report from
        there; None if it does not. First as if the edit replaced as many tokens as it wrote, then as if
        it inserted them (the copy goes on, with half its length); elsewhere near the break the token
        before it must match too (a copy of two tokens)."""
        tokens, broken_at = self._tokens, self._broken_at
        for j in (broken_at + self._since_break, broken_at):
            if j < position and tokens[j] == token:
                return j, max(RESUMED_MATCH_LEN, self._copied // 2)
        for j in range(max(1, broken_at), min(broken_at + RESUME_WINDOW, position)):
            if tokens[j] == token and tokens[j - 1] == tokens[position - 1]:
                return j, 2
        return None

    def truncate(self, n: int) -> None:
        """Drop history back to its first ``n`` tokens (a reset, or a turn regenerated or edited).

        To drop the oldest turns instead, truncate to 0 and extend with what remains. Rebuilds the index:
        later occurrences overwrote earlier ones, so they cannot be undone in place.
        """
        if not 0 <= n <= len(self._tokens):
            raise ValueError(f"cannot truncate {len(self._tokens)} tokens to {n}")
        kept = self._tokens[:n]
        self._tokens = []
        self._follower = {}
        self._copied_from = {}
        self._replacements = {}
        self._reset_copy()
        self.extend(kept)

    def propose(self, max_tokens: int) -> list[int]:
        """Draft up to ``max_tokens`` tokens continuing the history; sets ``last_match_len``.

        The longest suffix that occurred earlier is continued (a match of ``max_ngram`` tokens is
        measured further back, up to ``MAX_REPORTED_MATCH``), unless a copy in progress has followed its
        source at least as long. Right after an edit nothing is drafted: guessing which source token the
        edit stood for was right for 13% of such drafts on the shipped workloads' answers, and the copy
        resumes a token later, where the answer meets its source again. Renames (replacements
        seen RENAME_SEEN times) count as equal tokens in matching (a suffix is tried as written, then
        with its new tokens turned back into the old ones) and apply to the whole draft; a replacement
        seen once is applied too, but ends the draft.

        Returns:
            The draft, empty when no suffix of at least ``min_ngram`` tokens occurred earlier.
        """
        tokens = self._tokens
        size = len(tokens)
        self.last_match_len = 0
        count = min(max_tokens, self.max_draft)
        if count <= 0:
            return []
        replace = {old: new for old, (new, _) in self._replacements.items()}
        renames = {old: new for old, (new, seen) in self._replacements.items() if seen >= RENAME_SEEN}
        restore = {new: old for old, new in renames.items()}
        for n in range(min(self.max_ngram, size - 1), self.min_ngram - 1, -1):
            suffix = tuple(tokens[size - n :])
            start = self._follower.get(suffix)
            if start is None and restore:
                restored = tuple(restore.get(t, t) for t in suffix)
                if restored != suffix:
                    start = self._follower.get(restored)
            if start is not None:
                if n == self.max_ngram:
                    while n < MAX_REPORTED_MATCH and n < start:
                        earlier, later = tokens[start - 1 - n], tokens[size - 1 - n]
                        if earlier != later and renames.get(earlier) != later:
                            break
                        n += 1
                break
        else:
            n, start = 0, None
        if self._source is not None and n <= self._copied:
            # The copy in progress, unless the answer matches elsewhere further back than it has copied.
            # A replacement seen once is not applied: the source is known, so its token is the likelier.
            n, start, replace = min(self._copied, MAX_REPORTED_MATCH), self._source, renames
        if start is None:
            return []
        self.last_match_len = n
        # Copy what followed the match. A copy that runs into the present means the text repeats with
        # period size - start, so keep repeating it (as an overlapping LZ77 copy would).
        copy = tokens[start : start + count]
        if len(copy) < count:
            copy = (copy * -(-count // len(copy)))[:count]
        if not replace:
            return copy
        draft = []
        for token in copy:
            draft.append(replace.get(token, token))
            if token in replace and token not in renames:
                break
        return draft
