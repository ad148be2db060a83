"""A bounded prefix cache for the proxy's selector: layers 0..r's KV of prompts already seen.

In a conversation every turn resends the document. vLLM's automatic prefix caching makes the engine's
side of a repeated prefix nearly free, so the selector keeps its own: entries are keyed by block-aligned
token prefixes (as vLLM's are), each holding the K/V of layers 0..r for exactly that prefix. A request
that starts with a stored prefix copies its entry and runs only the tokens after it through layers 0..r.

Questions over one shared document (SCBench's multi-request) share the document but not the question, so the
entry a prompt leaves (its whole blocks, into its question) is no prefix of the next one. The cache therefore
remembers the block keys of the prompts it has run (keys only, no K/V): a prompt that shares blocks with an
earlier one beyond any stored entry stores an entry at that branch point too, as a radix tree would, and every
later question over that document starts from it.

Entries are evicted least recently used first while the K/V they hold exceed the budget in bytes; one
larger than the whole budget is not stored. Not thread-safe by itself: the selector calls it under a lock
of its own.
"""

from __future__ import annotations

import copy
import hashlib
from collections import OrderedDict

BLOCK = 16  # tokens per block, as vLLM's default block size
SEEN = 1 << 18  # block keys remembered (16 bytes each, about 4M tokens of prompts), least recently seen dropped


def block_keys(ids, block: int) -> list:
    """Key of every block-aligned prefix of ``ids``: key i names ids[:(i + 1) * block]. Chained as vLLM's block
    hashes are, each from the previous key and its block's tokens, so all of them cost one pass."""
    keys, prev = [], b""
    for start in range(0, len(ids) - len(ids) % block, block):
        chunk = ",".join(str(int(t)) for t in ids[start : start + block]).encode()
        prev = hashlib.blake2b(prev + b"|" + chunk, digest_size=16).digest()
        keys.append(prev)
    return keys


def cache_bytes(cache) -> int:
    """Bytes of K/V a transformers cache holds."""
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if t is not None:
                total += t.numel() * t.element_size()
    return total


class PrefixCache:
    """LRU store of layer-0..r caches keyed by block-aligned prefixes; ``budget`` bytes of K/V at most."""

    def __init__(self, budget: int, block: int = BLOCK):
        if budget < 0 or block < 1:
            raise ValueError(f"prefix cache: budget {budget} must be >= 0 bytes and block {block} >= 1 tokens")
        self.budget, self.block = int(budget), block
        self._entries: OrderedDict = OrderedDict()  # key -> (prefix length, cache, bytes)
        self._seen: OrderedDict = OrderedDict()  # block keys of the prompts run, least recently seen first
        self.used = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def aligned(self, n: int) -> int:
        """The longest block-aligned prefix of an n-token prompt that leaves at least one token to run."""
        return ((n - 1) // self.block) * self.block

    def lookup(self, ids) -> tuple:
        """(p, a copy of the entry's cache, b) for a prompt ``ids``: p the longest stored block-aligned prefix that
        leaves at least one token ((0, None) when none is stored), b the longest such prefix an earlier prompt
        also began with (0 if none). Notes the prompt's block keys (no K/V) for the prompts after it."""
        keys = block_keys(ids[: self.aligned(len(ids))], self.block)
        p, cache = 0, None
        for i in range(len(keys) - 1, -1, -1):
            if keys[i] in self._entries:
                self._entries.move_to_end(keys[i])
                p, cache = (i + 1) * self.block, copy.deepcopy(self._entries[keys[i]][1])
                break
        self.hits += cache is not None
        self.misses += cache is None
        branch = next(((i + 1) * self.block for i in range(len(keys) - 1, -1, -1) if keys[i] in self._seen), 0)
        for key in keys:
            self._seen[key] = None
            self._seen.move_to_end(key)
        while len(self._seen) > SEEN:
            self._seen.popitem(last=False)
        return p, cache, branch

    def store(self, ids, cache) -> bool:
        """Keep a copy of ``cache`` (layers 0..r of exactly ``ids``, a block-aligned prefix); False if it is
        larger than the whole budget. Evicts least recently used entries to fit."""
        if len(ids) % self.block or not len(ids):
            raise ValueError(
                f"prefix cache: a stored prefix is a whole number of {self.block}-token blocks, got {len(ids)} tokens"
            )
        size = cache_bytes(cache)
        key = block_keys(ids, self.block)[-1]
        if size > self.budget:
            return False
        if key in self._entries:
            self._entries.move_to_end(key)
            return True
        while self._entries and self.used + size > self.budget:
            _, (_, _, freed) = self._entries.popitem(last=False)
            self.used -= freed
        self._entries[key] = (len(ids), copy.deepcopy(cache), size)
        self.used += size
        return True
