"""Trainers: the policy update that follows each rollout step."""

from april_bench.trainers.protocol import Trainer, TrainResult

__all__ = ["TrainResult", "Trainer"]
