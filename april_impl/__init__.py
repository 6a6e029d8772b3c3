"""The reference APRIL strategy (Active Partial Rollouts, arXiv 2509.18521) and its variants."""

from april_impl.adaptive import AdaptiveAprilStrategy
from april_impl.april import AprilStrategy
from april_impl.consistent import ConsistentStrategy
from april_impl.length_aware import LengthAwareStrategy
from april_impl.response_oversample import ResponseOversampleStrategy
from april_impl.sagc import StragglerAwareGroupStrategy
from april_impl.segment import SegmentRolloutStrategy

__all__ = [
    "AdaptiveAprilStrategy",
    "AprilStrategy",
    "ConsistentStrategy",
    "LengthAwareStrategy",
    "ResponseOversampleStrategy",
    "SegmentRolloutStrategy",
    "StragglerAwareGroupStrategy",
]
