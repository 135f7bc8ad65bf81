"""A size-bounded dict for the host-side caches of prepared launches (op wrappers, autograd)."""

from __future__ import annotations


class BoundedCache(dict):
    """A dict of at most `maxsize` entries: `put` evicts the oldest entry when full. Reads are plain
    dict reads (thread-safe under the GIL; a racing `put` at worst evicts one entry too many)."""

    def __init__(self, maxsize: int = 1024):
        super().__init__()
        self.maxsize = maxsize

    def put(self, key, value):
        """Store `value` under `key` (evicting the oldest entry when full) and return `value`."""
        if key not in self and len(self) >= self.maxsize:     # a replaced entry makes no room to free
            try:
                del self[next(iter(self))]
            except (KeyError, StopIteration, RuntimeError):   # another thread changed it meanwhile
                pass
        self[key] = value
        return value
