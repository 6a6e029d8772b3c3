"""Baseline rollout strategies, siblings of APRIL behind the same protocol."""

from baselines.oversample_discard import OversampleDiscardStrategy
from baselines.sync import SyncStrategy
from baselines.tail_batching import TailBatchingStrategy

__all__ = ["OversampleDiscardStrategy", "SyncStrategy", "TailBatchingStrategy"]
