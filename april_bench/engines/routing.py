"""Routing requests across engine replicas: one policy set for the simulator and the Ray pool.

* ``cache_aware``: a request with a ``routing_key`` (a prompt's samples share one) goes where the
  first request with that key went, so the prompt's prefix is cached once (SGLang's router);
  the first goes to the least-loaded replica.  A weight update clears the map (every prefix cache
  is flushed);
* ``round_robin``: replicas in turn;
* ``least_load``: the replica with the fewest outstanding requests (ties: the lowest index).
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

    def route(self, routing_key: str | None, outstanding: Sequence[int]) -> int:
        """The replica for one request; ``outstanding[i]``: requests replica ``i`` has not returned."""
        if self.policy == "round_robin":
            self._rr = (self._rr + 1) % self.replicas
            return self._rr
        if self.policy == "cache_aware" and routing_key is not None:
            chosen = self._affinity.get(routing_key)
            if chosen is None:
                chosen = self._affinity[routing_key] = _least_loaded(outstanding)
            return chosen
        return _least_loaded(outstanding)

    def forget_prefixes(self) -> None:
        """New weights: no replica holds a useful prefix any more."""
        self._affinity.clear()

    def export_state(self) -> dict[str, Any]:
        return {"rr": self._rr, "affinity": dict(self._affinity)}

    def restore_state(self, state: dict[str, Any]) -> None:
        self._rr = state["rr"]
        self._affinity = dict(state["affinity"])


def _least_loaded(outstanding: Sequence[int]) -> int:
    return min(range(len(outstanding)), key=lambda i: (outstanding[i], i))
