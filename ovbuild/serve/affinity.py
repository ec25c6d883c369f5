"""Prefix affinity: which replica holds a request's prompt prefix, keyed on hashes of the prompt's first blocks.

A replica's prefix cache reuses whole KV blocks of a prompt's beginning, so a conversation's next turn is cheapest on
the replica that served the previous one. The router keys a request on a chain of hashes, one per leading block:
key i hashes blocks 0..i, so two prompts share key i exactly when their first i+1 blocks are equal. The replica that
served a key owns it; a request goes to the owner of its longest owned key, unless that replica is much busier than
the least loaded one (then the least loaded, which becomes the owner of the keys nobody owns yet).

Blocks are cut from the request as the router sees it, without a tokenizer: a token-id prompt in blocks of
`block_tokens` ids, a text prompt (or a chat's messages, role and content in order) in blocks of
`block_tokens * chars_per_token` characters. Text is used, not tokens, because the router runs in the ingress, which
may sit on a machine without the model folder, and should not tokenize and template every request a second time;
affinity only needs equal prefixes to give equal keys, which text gives, and a chat template renders the messages in
order, so a conversation's earlier turns are a prefix of both its text and its tokens.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass

# Live replica ids per application, as the request router of this process last saw them: the ingress, in the same
# process, reads them to gather every replica's /metrics and /health. A module attribute, not a class one: Ray Serve
# ships the router class by value, so a class attribute would be a copy of its own.
LIVE_REPLICAS: dict[str, frozenset[str]] = {}


@dataclass(frozen=True)
class AffinityConfig:
    """How requests are cut into blocks, how far the chain goes, and when a busy owner is passed over."""

    block_tokens: int = 32  # the CPU plugin's KV cache block
    chars_per_token: int = 4  # a BPE token of English or code spans about four characters
    max_blocks: int = 8  # keys per request: the first blocks decide which conversation it continues
    imbalance: int = 8  # ongoing requests the owner may have beyond the least loaded replica and still get it
    max_keys: int = 100_000  # keys remembered (least recently used go first)


def request_prefix(path: str, body: dict) -> str | list[int] | None:
    """The part of an OpenAI request a replica's prefix cache keys on: a completion's (first) prompt, or a chat's
    messages as text in order; None when the request has none (the router then only balances load)."""
    if path.endswith("/chat/completions"):
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        parts = []
        for m in messages:
            if isinstance(m, dict):
                content = m.get("content")
                text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
                parts.append(f"{m.get('role')}\x1f{text}\x1e")
        return "".join(parts)
    if path.endswith("/completions"):
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch: its first prompt places it
        if isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
            return prompt
    return None


def block_keys(prefix: str | list[int] | None, config: AffinityConfig) -> list[str]:
    """Chained hashes of the prefix's whole leading blocks, first block first (a partial block gets no key: a prefix
    cache holds whole blocks only)."""
    if not prefix:
        return []
    if isinstance(prefix, str):
        data, size = prefix.encode("utf-8", "surrogatepass"), config.block_tokens * config.chars_per_token
        blocks = [data[i : i + size] for i in range(0, len(data) - size + 1, size)]
    else:
        size = config.block_tokens
        blocks = [
            b",".join(str(t).encode() for t in prefix[i : i + size]) for i in range(0, len(prefix) - size + 1, size)
        ]
    keys, chain = [], b""
    for block in blocks[: config.max_blocks]:
        chain = hashlib.blake2b(chain + b"\x00" + block, digest_size=12).digest()
        keys.append(chain.hex())
    return keys


class AffinityTable:
    """Block key -> the replica that served it; bounded, least recently used keys forgotten first."""

    def __init__(self, max_keys: int = AffinityConfig.max_keys):
        self.max_keys = max_keys
        self._owners: OrderedDict[str, str] = OrderedDict()

    def owner(self, keys: list[str]) -> str | None:
        """The replica owning the longest owned key of the chain (None: no key is owned)."""
        for key in reversed(keys):
            if (replica := self._owners.get(key)) is not None:
                self._owners.move_to_end(key)
                return replica
        return None

    def assign(self, keys: list[str], replica: str) -> None:
        """The replica that served a request owns its keys nobody owned (owned keys stay: their blocks stay put)."""
        for key in keys:
            self._owners.setdefault(key, replica)
            self._owners.move_to_end(key)
        while len(self._owners) > self.max_keys:
            self._owners.popitem(last=False)

    def keep_only(self, replicas: set[str]) -> None:
        """Forget the keys of replicas that are gone (a replacement starts with an empty cache)."""
        for key in [k for k, r in self._owners.items() if r not in replicas]:
            del self._owners[key]

    def __len__(self) -> int:
        return len(self._owners)


def pick(owner: str | None, loads: dict[str, int], imbalance: int) -> str | None:
    """The owner if it is live and at most `imbalance` requests busier than the least loaded replica, else None (the
    router then takes the least loaded)."""
    if owner is None or owner not in loads:
        return None
    return owner if loads[owner] <= min(loads.values()) + imbalance else None
