"""Which tier holds each key: a store's one index, changed together with the tiers, and checked
against them in one place (:meth:`Placement.check`).
"""

from __future__ import annotations

import threading
from typing import Any

from flowgpu.memory.tiers import LRUTier

__all__ = ["Placement", "Load"]


class Load:
    """A key being brought up a tier outside the store's lock (held in the ``"loading"`` tier);
    readers of the key wait for ``done``."""

    __slots__ = ("done", "dropped")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.dropped = False  # deleted (or overwritten) meanwhile: what the load brings is discarded


class Placement(dict):
    """``key -> tier name``, each key in exactly one tier; reads need no lock, changes take the store's.
    A tier that takes or gives up a key by itself (a disk file) is followed with plain item changes."""

    def __init__(self, tiers: dict[str, Any]):  # name -> tier (flowgpu.memory.tiers)
        super().__init__()
        self.tiers = tiers

    def put(self, key: Any, tier: str, value: Any) -> None:
        """``tier`` holds ``value`` under ``key`` from now on (``key`` must be nowhere yet)."""
        if key in self:
            raise KeyError(f"{key!r} is in the {self[key]} tier already")
        self.tiers[tier].put(key, value)
        self[key] = tier

    def take(self, key: Any) -> Any:
        """Take ``key`` out of its tier; returns what that tier held."""
        return self.tiers[self.pop(key)].pop(key)

    def check(self) -> None:
        """Raise AssertionError unless each tier holds exactly the keys placed in it and each
        in-memory tier's bytes add up."""
        for name, tier in self.tiers.items():
            placed = {k for k, t in self.items() if t == name}
            held = set(tier.keys())
            assert held == placed, f"the {name} tier holds {held - placed or 'no'} keys placed elsewhere " \
                                   f"and lacks {placed - held or 'none'} placed in it"
            if isinstance(tier, LRUTier):
                assert tier.nbytes == tier.counted(), f"the {name} tier counts {tier.nbytes} B of {tier.counted()}"
