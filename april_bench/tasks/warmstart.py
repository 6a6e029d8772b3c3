"""A short supervised warm start, cached on disk, so RL starts from a model that solves part of the task.

The cache key hashes everything that determines the weights (task, architecture,
optimiser settings, steps, seed, torch version); the file lives under
``$APRIL_BENCH_CACHE`` (default ``~/.cache/april-bench``) and is written
atomically, so a concurrent run never reads half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.models.packing import pack_rows
from april_bench.models.zoo import build_model, model_config
from april_bench.tasks.synthetic import CharTokenizer, SyntheticTask
from april_bench.threads import choose_threads, torch_threads

__all__ = ["WarmStart", "cache_dir", "writable_cache"]


def cache_dir() -> Path:
    return Path(os.environ.get("APRIL_BENCH_CACHE", Path.home() / ".cache" / "april-bench"))


def writable_cache(path: Path) -> Path:
    """Create ``path`` (a folder in the cache); an unwritable cache (a read-only or missing HOME) is
    one line naming ``APRIL_BENCH_CACHE``, the way to put the cache elsewhere."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe, name = tempfile.mkstemp(dir=path, prefix=".write-check-")
        os.close(probe)
        os.unlink(name)
    except OSError as exc:
        raise ConfigError(
            f"the cache {path} cannot be written ({exc.strerror}); set APRIL_BENCH_CACHE to a writable "
            "directory"
        ) from None
    return path


class WarmStart(Configurable):
    """Supervised fine-tuning on worked solutions; the loss covers response tokens only."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        model: str = param("tiny", help="architecture to train from random weights")
        steps: int = param(500, help="optimizer steps (0: start RL from random weights)")
        batch_size: int = param(32, help="solutions per step")
        lr: float = param(3e-3, help="AdamW learning rate")
        seed: int = param(0, help="seed of the initial weights and of the example order")
        device: str = param("cpu", help="where to train: cpu or cuda (a GPU run's larger models)")

        def __post_init__(self) -> None:
            if self.steps < 0 or self.batch_size < 1 or self.lr <= 0:
                raise ConfigError("warm start needs steps >= 0, batch_size >= 1 and lr > 0")
            if self.device.startswith("cuda") and not torch.cuda.is_available():
                raise ConfigError("--warmstart-arg device=cuda but no CUDA device is visible; use device=cpu")

    def __init__(self, config: Config, *, task: SyntheticTask) -> None:
        self.config = config
        self.task = task

    @property
    def key(self) -> str:
        blob = json.dumps(
            {
                "task": self.task.config.to_dict(),
                # a CPU warm start keeps the key it had before the device option existed
                "warm": {k: v for k, v in self.config.to_dict().items() if k != "device" or v != "cpu"},
                "architecture": model_config(
                    self.config.model, vocab_size=self.task.tokenizer.vocab_size
                ).to_dict(),
                "torch": torch.__version__,
                "alphabet": self.task.ALPHABET,
                # packed rows (models/packing.py): the same loss as padded rows up to float rounding,
                # so a file trained on padded batches is not reused for bit-for-bit repeatability
                "layout": "packed",
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def path(self) -> Path:
        return cache_dir() / "warmstart" / f"{self.config.model}-{self.key}.pt"

    def weights(self, *, progress: bool = True) -> dict[str, torch.Tensor]:
        """The warm-started state dict: from the cache, or trained now and cached."""
        if self.path.exists():
            try:
                return torch.load(self.path, map_location="cpu", weights_only=True)
            except Exception as exc:  # a torn or foreign file: any unpickling error
                raise ConfigError(
                    f"the cached warm start {self.path} is damaged ({type(exc).__name__}); delete it and "
                    "run again (it is retrained in about a minute)"
                ) from None
        writable_cache(self.path.parent)  # before training: a read-only HOME fails at once
        state = self.train(progress=progress)
        from april_bench.trainers.state_file import save_atomic

        save_atomic(state, self.path)  # a unique temporary file, removed if the save fails
        return state

    def train(self, *, progress: bool = True) -> dict[str, torch.Tensor]:
        cfg = self.config
        model = build_model(
            cfg.model, vocab_size=self.task.tokenizer.vocab_size, seed=cfg.seed, device=cfg.device
        ).train()
        if cfg.steps == 0:
            return {k: v.detach().cpu() for k, v in model.state_dict().items()}
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        rng = random.Random(cfg.seed)
        threads = choose_threads(None, torch.device(cfg.device).type)  # one on a CPU: see threads.py
        bar = tqdm(
            range(cfg.steps),
            desc="warm start (SFT, once: cached for later runs)",
            disable=not progress,
            unit="step",
        )
        with torch.random.fork_rng(devices=[]), torch_threads(threads):
            torch.manual_seed(cfg.seed)
            for _ in bar:
                ids, positions, targets = (t.to(model.device) for t in self._batch(rng))
                # packed rows: position ids restart at each row and no cache, so attention stays
                # within a row (models/packing.py); a third of the padded batch's work
                logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits[:, :-1]
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100
                )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    def _batch(self, rng: random.Random) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step's solutions packed end to end: ids and position ids ``[lanes, width]`` and the
        targets ``[lanes, width - 1]`` (the solution tokens after each row's prompt, -100 elsewhere)."""
        task = self.task
        rows = []
        for _ in range(self.config.batch_size):
            problem = task.draw("sft", rng.randrange(1 << 30))
            rows.append((task.prompt_ids(problem), task.solution_ids(problem)))
        full = [prompt + solution for prompt, solution in rows]
        packed = pack_rows(full, [len(f) for f in full], pad_id=CharTokenizer.PAD)
        targets = torch.full(packed.ids.shape, -100, dtype=torch.long).view(-1)
        for (prompt, solution), start in zip(rows, packed.start.tolist(), strict=True):
            # row r's token j is predicted at flat position start + j - 1
            first = start + len(prompt) - 1
            targets[first : first + len(solution)] = torch.tensor(solution)
        return packed.ids, packed.positions, targets.view(packed.ids.shape)[:, :-1]
