"""A small LRU set with an eviction callback (the original's ``LRUCache`` of sealed segments)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class LRUCache(Generic[K]):
    """Keeps at most ``capacity`` keys; the least recently used one is evicted and handed to
    ``on_evict``. Not thread-safe: the owner serializes access."""

    def __init__(self, capacity: int, on_evict: Callable[[K], None]) -> None:
        assert capacity >= 0
        self.capacity = capacity
        self._on_evict = on_evict
        self._keys: OrderedDict[K, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: K) -> bool:
        return key in self._keys

    def touch(self, key: K) -> None:
        """Mark ``key`` most recently used, adding it (and evicting beyond capacity) if new."""
        if key in self._keys:
            self._keys.move_to_end(key)
            return
        self._keys[key] = None
        while len(self._keys) > self.capacity:
            evicted, _ = self._keys.popitem(last=False)
            self._on_evict(evicted)

    def remove(self, key: K) -> None:
        """Forget ``key`` without evicting it."""
        self._keys.pop(key, None)
