"""A request's incremental detokenizer: the text streamed so far, held back where a stop string could start, and the
stop strings themselves, found in the text of the tokens just committed. The one place stop strings are handled."""

from __future__ import annotations

from collections.abc import Callable

# What a byte-level decoder renders for bytes that do not yet form a whole character.
_INCOMPLETE = "\ufffd"


class Detokenizer:
    """Text of one request as its tokens are committed. `push` never emits half a multi-byte character, and with stop
    strings it holds back the tail that could start one; `find_stop` ends the tokens at a stop string."""

    def __init__(self, decode: Callable[[list[int]], str], stop_strings: tuple[str, ...] = ()):
        self.decode, self.stop_strings = decode, tuple(stop_strings)
        self.holdback = max((len(s) for s in stop_strings), default=1) - 1
        self.sent = ""

    def push(self, generated: list[int]) -> str:
        """New text since the last call, given every token committed so far."""
        # Decoding the whole sequence (not a window) keeps the pieces equal to the final text for any tokenizer.
        text = self.decode(generated).rstrip(_INCOMPLETE)
        text = text[: len(text) - self.holdback]
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta

    def finish(self, final_text: str) -> str:
        """The rest of the request's final text (cut before a stop string, whole characters)."""
        delta = final_text[len(self.sent) :]
        self.sent = final_text
        return delta

    def find_stop(self, generated: list[int], new: int) -> str | None:
        """When a stop string shows in the text of `generated` (whose last `new` tokens were just committed): cut
        `generated`, in place, to the fewest tokens whose text reaches it, and return the text before it; else None."""
        if not self.stop_strings:
            return None
        # A stop string not seen before ends in the new tokens' text and starts at most len(stop) characters earlier:
        # at most 4 tokens a character (byte-level tokens), plus slack for a character split at the window's edge.
        # Decoding only that tail keeps a long generation linear; the whole text is decoded once a stop string shows.
        window = new + 4 * max(len(s) for s in self.stop_strings) + 4
        if len(generated) > window:
            tail = self.decode(generated[-window:])
            if not any(s in tail for s in self.stop_strings):
                return None
        text = self.decode(generated)
        hits = [i for i in (text.find(s) for s in self.stop_strings) if i >= 0]
        if not hits:
            return None
        cut = min(hits)
        # keep the fewest tokens whose text reaches the stop string
        while len(generated) > 1 and len(self.decode(generated[:-1])) > cut:
            generated.pop()
        return text[:cut]
