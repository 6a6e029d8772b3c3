"""Per-sample sampling seeds, shared by the rollout loop, the engines and the evaluators.

Every arm of a comparison draws sample ``index`` of prompt ``uid`` with the
same seed, and so does every resume of that sample: engines key their draws by
absolute position, so a resumed request continues the stream it was cut from.
Evaluators use negative uids (``-1 - problem``), which never collide with
training prompts.
"""

from __future__ import annotations

__all__ = ["sample_seed"]

_MASK63 = (1 << 63) - 1


def sample_seed(seed: int, uid: int, index: int) -> int:
    """The sampling seed of sample ``index`` of prompt ``uid`` (a 63-bit splitmix-style hash)."""
    z = (seed * 0x9E3779B97F4A7C15 + uid * 0xBF58476D1CE4E5B9 + index * 0x94D049BB133111EB) & _MASK63
    z = ((z ^ (z >> 31)) * 0xD6E8FEB86659FD93) & _MASK63
    return z ^ (z >> 29)
