"""The reference APRIL strategy (Active Partial Rollouts, arXiv 2509.18521)."""

from april_impl.april import AprilStrategy

__all__ = ["AprilStrategy"]
