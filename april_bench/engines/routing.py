"""Routing requests across engine replicas: one policy set for the simulator and the Ray pool.

* ``cache_aware``: a request with a ``routing_key`` (a prompt's samples share one) goes where the
  first request with that key went, so the prompt's prefix is cached once (SGLang's router);
  the first goes to the least-loaded replica.  A weight update clears the map (every prefix cache
  is flushed);
* ``round_robin``: replicas in turn;
* ``least_load``: the replica with the fewest outstanding requests (ties: the lowest index).

``alive`` (the replica router's failure handling) restricts every policy to the replicas still
serving: a prefix on a dead replica is forgotten and its key goes to the least-loaded survivor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["ROUTER_POLICIES", "Router"]

ROUTER_POLICIES = ("cache_aware", "round_robin", "least_load")


class Router:
    """Chooses a replica per request from the replicas' outstanding-request counts."""

    def __init__(self, policy: str, replicas: int) -> None:
        if policy not in ROUTER_POLICIES:
            raise ValueError(f"router policy must be one of {', '.join(ROUTER_POLICIES)}, got {policy!r}")
        if replicas < 1:
            raise ValueError(f"a router needs at least one replica, got {replicas}")
        self.policy = policy
        self.replicas = replicas
        self._rr = 0
        self._affinity: dict[str, int] = {}

    def route(
        self, routing_key: str | None, outstanding: Sequence[int], alive: Sequence[bool] | None = None
    ) -> int:
        """The replica for one request; ``outstanding[i]``: requests replica ``i`` has not returned;
        ``alive[i]`` False: replica ``i`` is down (``None``: every replica serves)."""
        up = range(self.replicas) if alive is None else [i for i in range(self.replicas) if alive[i]]
        if not up:
            raise ValueError("no replica is alive to route to")
        if self.policy == "round_robin":
            for _ in range(self.replicas):
                self._rr = (self._rr + 1) % self.replicas
                if alive is None or alive[self._rr]:
                    break
            return self._rr
        if self.policy == "cache_aware" and routing_key is not None:
            chosen = self._affinity.get(routing_key)
            if chosen is None or (alive is not None and not alive[chosen]):
                chosen = self._affinity[routing_key] = _least_loaded(outstanding, up)
            return chosen
        return _least_loaded(outstanding, up)

    def forget_prefixes(self) -> None:
        """New weights: no replica holds a useful prefix any more."""
        self._affinity.clear()

    def export_state(self) -> dict[str, Any]:
        return {"rr": self._rr, "affinity": dict(self._affinity)}

    def restore_state(self, state: dict[str, Any]) -> None:
        self._rr = state["rr"]
        self._affinity = dict(state["affinity"])


def _least_loaded(outstanding: Sequence[int], among: Sequence[int] | range) -> int:
    return min(among, key=lambda i: (outstanding[i], i))
