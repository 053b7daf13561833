"""Once per run: a value the controller resolves once (the model's GGUF header, its size,
a ref's commit, the gateway's server states, the builder of each fingerprint), however many
hosts ask for it at the same time. pyinfra runs hosts as concurrent greenlets: a plain
functools.lru_cache misses for every greenlet that asks while the first one still waits on
the network, so the first caller of a key holds a lock and the others wait for its value.

    >>> import threading
    >>> calls = []
    >>> size = Once(lambda url: calls.append(url) or 42, threading.Lock)
    >>> size("http://m/a.gguf"), size("http://m/a.gguf"), len(calls)
    (42, 42, 1)
"""
from __future__ import annotations

import threading
from typing import Any, Callable


class Once:
    """fn(*key) computed once per key; concurrent callers of a key wait for the first one.
    An exception is not kept: the next caller tries again. `lock_factory` makes the lock of
    a key (gevent.lock.Semaphore for pyinfra's greenlets; threading.Lock for threads)."""

    def __init__(self, fn: Callable[..., Any], lock_factory: Callable[[], Any] = threading.Lock):
        self.fn, self.lock_factory = fn, lock_factory
        self.values: dict = {}
        self.locks: dict = {}
        self.calls = 0  # how many times fn ran (tests count it)

    def __call__(self, *key):
        if key in self.values:
            return self.values[key]
        lock = self.locks.setdefault(key, self.lock_factory())
        with lock:
            if key not in self.values:
                self.calls += 1
                self.values[key] = self.fn(*key)
        return self.values[key]

    def forget(self, keep: Callable[[tuple], bool] = lambda key: False) -> None:
        """Drop the values whose key `keep` does not keep (all by default): read again next time."""
        for key in [k for k in self.values if not keep(k)]:
            del self.values[key]
