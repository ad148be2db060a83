"""A bounded prefix cache for the proxy's selector: layers 0..r's KV of prompts already seen.

In a conversation every turn resends the document. vLLM's automatic prefix caching makes the engine's
side of a repeated prefix nearly free, so the selector keeps its own: entries are keyed by block-aligned
token prefixes (as vLLM's are), each holding the K/V of layers 0..r for exactly that prefix. A request
that starts with a stored prefix copies its entry and runs only the tokens after it through layers 0..r.

Entries are evicted least recently used first while the K/V they hold exceed the budget in bytes; one
larger than the whole budget is not stored. Not thread-safe by itself: the selector calls it under its
lock.
"""

from __future__ import annotations

import copy
import hashlib
from collections import OrderedDict

BLOCK = 16  # tokens per block, as vLLM's default block size


def block_keys(ids, block: int) -> list:
    """Key of every block-aligned prefix of ``ids``: key i names ids[:(i + 1) * block]. Chained as vLLM's block
    hashes are, each from the previous key and its block's tokens, so all of them cost one pass."""
    keys, prev = [], b""
    for start in range(0, len(ids) - len(ids) % block, block):
        chunk = ",".join(str(int(t)) for t in ids[start:start + block]).encode()
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
        self.used = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def aligned(self, n: int) -> int:
        """The longest block-aligned prefix of an n-token prompt that leaves at least one token to run."""
        return ((n - 1) // self.block) * self.block

    def lookup(self, ids):
        """(length p, a copy of the entry's cache) for the longest stored block-aligned prefix of ``ids`` that
        leaves at least one token; (0, None) when none is stored."""
        keys = block_keys(ids[:self.aligned(len(ids))], self.block)
        for i in range(len(keys) - 1, -1, -1):
            if keys[i] in self._entries:
                self._entries.move_to_end(keys[i])
                self.hits += 1
                return (i + 1) * self.block, copy.deepcopy(self._entries[keys[i]][1])
        self.misses += 1
        return 0, None

    def store(self, ids, cache) -> bool:
        """Keep a copy of ``cache`` (layers 0..r of exactly ``ids``, a block-aligned prefix); False if it is
        larger than the whole budget. Evicts least recently used entries to fit."""
        if len(ids) % self.block or not len(ids):
            raise ValueError(f"prefix cache: a stored prefix is a whole number of {self.block}-token blocks, "
                             f"got {len(ids)} tokens")
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
