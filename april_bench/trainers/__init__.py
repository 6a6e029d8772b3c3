"""Trainers: the policy update that follows each rollout step."""

from april_bench.trainers.protocol import CheckpointWriter, Trainer, TrainResult

__all__ = ["CheckpointWriter", "TrainResult", "Trainer"]
