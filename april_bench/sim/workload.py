"""The simulated workload: prompt lengths, response lengths and rewards per data set and model.

A simulated rollout has lengths and right/wrong outcomes, nothing else: the
outcomes exist only so DAPO dynamic sampling can reject all-equal groups.  They
are not an accuracy, and no accuracy is ever reported for a simulated run.

Every number below is either a published anchor or a labelled assumption; see
``docs/simulator.md`` for the table and ``benchmarks/sim_bench.py`` for how the
throughput gain moves when they change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.profiles.models import MODELS
from april_bench.registry import Registry
from april_bench.sim.length_evidence import LENGTH_FIELDS, length_params
from april_bench.sim.lengths import LengthDraw, LengthModel, LognormalLengths, TraceLengths
from april_bench.types import Prompt, Sample, SampleStatus
from april_bench.workload import EpochOrder, PromptStream

__all__ = ["DATASET_PROFILES", "DatasetProfile", "SimWorkload"]


@dataclass(frozen=True, slots=True)
class DatasetProfile:
    name: str
    #: Prompt tokens (template included): log-normal median and sigma.
    prompt_median: float
    prompt_sigma: float
    #: Median length of a *correct* response at step 0 (tokens) and the mean per-prompt solve rate at the
    #: start of RL - used only for (data set, model) pairs without a profile in
    #: ``length_evidence.LENGTH_PROFILES`` (Qwen3-4B and R1-Distill-1.5B have them and ignore these two).
    response_median: float
    solve_rate: float
    source: str


DATASET_PROFILES: Registry[DatasetProfile] = Registry("dataset")
DATASET_PROFILES.register(
    "dapo-math-17k",
    DatasetProfile(
        name="dapo-math-17k",
        prompt_median=148,
        prompt_sigma=0.39,
        response_median=2000,
        solve_rate=0.65,
        source=(
            "prompts: data README, DAPO user message p50 484 / p90 799 chars at 3.5 chars/token, "
            "+10 template tokens; response median: assumption (no public Qwen3-4B RL length data); "
            "solve rate: APRIL eval_dapo_qwen.png starts at AIME24 0.59, training set assumed easier"
        ),
    ),
    "BytedTsinghua-SIA/DAPO-Math-17k (integer answers, 'Answer:' format)",
)
DATASET_PROFILES.register(
    "deepscaler",
    DatasetProfile(
        name="deepscaler",
        prompt_median=82,
        prompt_sigma=0.42,
        response_median=1700,
        solve_rate=0.55,
        source=(
            "prompts: data README, DeepScaleR problem p50 193 / p90 395 chars + boxed suffix and "
            "template (~27 tokens); response median and solve rate: assumptions for models without a "
            "(data set, model) profile (length_evidence.LENGTH_PROFILES; R1-Distill-1.5B's is fitted to the "
            "DeepScaleR blog's statistics)"
        ),
    ),
    "agentica-org/DeepScaleR-Preview-Dataset (AIME/AMC/Omni-Math, \\boxed answers)",
)
DATASET_PROFILES.register(
    "deepmath-103k",
    DatasetProfile(
        name="deepmath-103k",
        prompt_median=85,
        prompt_sigma=0.45,
        response_median=2700,
        solve_rate=0.5,
        source=(
            "prompts: assumption, as DeepScaleR plus DeepMath's system prompt (no rows in tests/data/math); "
            "response median: DeepMath-103K card, R1 solutions average ~15.9k chars (~4,500 tokens) = "
            "median 2,700 under sigma 1.0; solve rate: assumption (difficulty 5-9 problems)"
        ),
    ),
    "zwhe99/DeepMath-103K (hard problems, \\boxed answers)",
)

DATASET_PROFILES.register(
    "synthetic",
    DatasetProfile(
        name="synthetic",
        prompt_median=6,
        prompt_sigma=0.15,
        response_median=13,
        solve_rate=0.3,
        source=(
            "april_bench.tasks.synthetic with its defaults: prompts '<bos>n-k=' are 5-7 tokens; right "
            "solutions have a median of 13 tokens (p99 72); solve rate: the warm start's held-out accuracy"
        ),
    ),
    "the embedded synthetic task (division by repeated subtraction), for simulating the CPU default",
)

#: The length shape of pairs without a profile in ``length_evidence.LENGTH_PROFILES`` (their
#: level and solve rate come from the data-set profile): the same shape sources, wrong answers 3x.
FALLBACK_SHAPE = {
    "prompt_sigma": 0.8,
    "within_sigma": 0.6,
    "incorrect_factor": 3.0,
    "solve_concentration": 2.0,
    "drift_per_step": 0.0006,
}


class SimWorkload(Configurable):
    """Prompts and replayed lengths for the simulator, identical for every arm."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        dataset: str = param("dapo-math-17k", help="data set profile (prompt and response lengths)")
        model: str = param("qwen3-4b", help="policy model (scales response lengths)")
        seed: int = param(0, help="seed of every per-prompt draw")
        response_median: float | None = param(
            None, help="override: median right-answer length (default: model evidence, else data set)"
        )
        solve_rate: float | None = param(
            None, help="override: mean per-prompt solve rate at the start of RL (drives DAPO rejections)"
        )
        prompt_sigma: float | None = param(
            None,
            help="override: log-sd of response length between prompts (default 0.8; docs/calibration.md)",
        )
        within_sigma: float | None = param(
            None, help="override: log-sd of response length inside a group (default 0.6; Seer: < between)"
        )
        incorrect_factor: float | None = param(
            None, help="override: wrong answers are this much longer (DeepScaleR: ~3x on AIME)"
        )
        solve_concentration: float | None = param(
            None, help="override: a+b of the per-prompt solve-rate Beta (small: U-shaped)"
        )
        drift_per_step: float | None = param(
            None, help="override: log-length drift per step (DAPO: mean 750 -> 2,500 tokens over 2,000 steps)"
        )
        length_trace: Path | None = param(None, help="replay response lengths from this .jsonl/.csv")
        trace: Path | None = param(
            None,
            help="replay a trace (docs/whatif.md) group by group in step order: lengths, prompt lengths "
            "and rewards (a trace file or a run directory)",
        )
        trace_arm: str | None = param(None, help="with trace= a run directory: the arm to replay")
        data_path: Path | None = param(
            None, help="prompt lengths from this local copy of the data set instead of the profile"
        )
        tokenizer: str | None = param(
            None, help="with data_path: a tokenizer directory, so prompt lengths are exact tokens"
        )
        max_prompt_len: int | None = param(
            None, help="longest prompt drawn from the profile (default: its median x exp(5 sigma))"
        )

        def __post_init__(self) -> None:
            if self.dataset not in DATASET_PROFILES:
                DATASET_PROFILES.get(self.dataset)  # raises with did-you-mean
            if self.solve_concentration is not None and self.solve_concentration <= 0:
                raise ConfigError("solve_concentration must be > 0")
            if self.solve_rate is not None and not 0 < self.solve_rate < 1:
                raise ConfigError(f"solve_rate must be in (0, 1), got {self.solve_rate}")
            if self.trace is not None and (self.length_trace is not None or self.data_path is not None):
                raise ConfigError(
                    "workload trace= replays prompt and response lengths; drop length_trace=/data_path="
                )
            if self.trace_arm is not None and self.trace is None:
                raise ConfigError("workload trace_arm= picks an arm of trace=; set both")
            if self.tokenizer is not None and self.data_path is None:
                raise ConfigError("workload tokenizer= only counts prompt tokens of data_path=; set both")

    def __init__(self, config: Config, *, n_samples_per_prompt: int, token_ids: bool = False) -> None:
        self.config = config
        self._vocab = MODELS.get(config.model).vocab if token_ids else None
        self.profile = DATASET_PROFILES.get(config.dataset)
        self.name = f"sim:{config.dataset}"
        self._n = n_samples_per_prompt
        self.lengths: LengthModel = self._length_model()
        self._draws: dict[int, LengthDraw] = {}
        #: Measured prompt lengths (data_path given) and their unit; empty: the profile's log-normal.
        self.prompt_lengths: list[int] = []
        self.prompt_length_unit = "tokens (profile log-normal)"
        #: The data file's load report, when prompt lengths come from one.
        self.load_report: Any = None
        if config.data_path is not None:
            self.prompt_lengths, self.prompt_length_unit = self._measured_prompt_lengths()
            self.name = f"sim:{config.dataset}@{Path(config.data_path).name}"
            self._order = EpochOrder(len(self.prompt_lengths), config.seed)

    def _measured_prompt_lengths(self) -> tuple[list[int], str]:
        from april_bench.data import DATASETS, load, prompt_lengths

        cfg = self.config
        if cfg.dataset not in DATASETS:
            raise ConfigError(
                f"data_path needs a real data set ({', '.join(DATASETS)}), not the {cfg.dataset!r} profile"
            )
        tokenizer = None
        if cfg.tokenizer is not None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer)
        loaded = load(cfg.dataset, cfg.data_path)
        self.load_report = loaded.report
        lengths, unit = prompt_lengths(loaded, tokenizer)
        if not lengths:
            raise ConfigError(f"{cfg.data_path}: no {cfg.dataset} problems to take prompt lengths from")
        return lengths, unit

    def length_parameters(self) -> dict[str, float]:
        """The length model in force: the model's published evidence (``length_evidence``), else the
        data-set profile's labelled assumptions, with this workload's explicit overrides on top."""
        cfg = self.config
        params: dict[str, float] = dict(length_params(cfg.model, cfg.dataset) or {})
        if not params:
            params = {
                "response_median": self.profile.response_median,
                "solve_rate": self.profile.solve_rate,
                **FALLBACK_SHAPE,
            }
        for name in LENGTH_FIELDS:
            value = getattr(cfg, name)
            if value is not None:
                params[name] = float(value)
        return params

    def _length_model(self) -> LengthModel:
        cfg = self.config
        if cfg.trace is not None:
            from april_bench.sim.trace_replay import TraceReplay

            self.name = f"sim:trace:{Path(cfg.trace).name}"
            return TraceReplay(cfg.trace, arm=cfg.trace_arm)
        if cfg.length_trace is not None:
            return TraceLengths(cfg.length_trace, self._n)
        p = self.length_parameters()
        return LognormalLengths(
            median=p["response_median"],
            prompt_sigma=p["prompt_sigma"],
            within_sigma=p["within_sigma"],
            incorrect_factor=p["incorrect_factor"],
            solve_a=p["solve_rate"] * p["solve_concentration"],
            solve_b=(1 - p["solve_rate"]) * p["solve_concentration"],
            drift_per_step=p["drift_per_step"],
            seed=cfg.seed,
        )

    @property
    def has_rewards(self) -> bool:
        return bool(getattr(self.lengths, "has_rewards", True))

    def _draw(self, uid: int) -> LengthDraw:
        draw = self._draws.get(uid)
        if draw is None:
            draw = self._draws[uid] = self.lengths.draw(uid, self._n)
        return draw

    def _prompt(self, uid: int) -> Prompt:
        rng = np.random.default_rng([self.config.seed, uid, 0])
        replay = self._replay
        if replay is not None:  # the trace's group `uid`: its prompt length
            length = replay.group(uid).prompt_tokens
        elif self.prompt_lengths:  # measured: problem `uid` of a per-epoch shuffle of the file
            length = max(1, self.prompt_lengths[self._order.index(uid)])
        else:
            p = self.profile
            draw = round(p.prompt_median * math.exp(p.prompt_sigma * rng.standard_normal()))
            length = min(self._max_prompt, max(4, draw))
        ids = None
        if self._vocab is not None:  # dummy-weight runs on a real engine need ids: random ones
            ids = tuple(int(i) for i in rng.integers(0, self._vocab, length))
        return Prompt(uid=uid, source_id=f"{self.config.dataset}#{uid}", length=length, token_ids=ids)

    @property
    def _max_prompt(self) -> int:
        if self.config.max_prompt_len is not None:
            return self.config.max_prompt_len
        return round(self.profile.prompt_median * math.exp(5 * self.profile.prompt_sigma))

    def longest_prompt(self) -> int:
        """The longest prompt this workload can produce (sizes a real engine's context)."""
        if self._replay is not None:
            return self._replay.longest_prompt()
        return max(self.prompt_lengths) if self.prompt_lengths else self._max_prompt

    @property
    def _replay(self) -> Any:
        """The trace replay (``trace=``), else ``None``."""
        from april_bench.sim.trace_replay import TraceReplay

        return self.lengths if isinstance(self.lengths, TraceReplay) else None

    def prompt_stream(self) -> PromptStream:
        return PromptStream(self._prompt)

    def _sample(self, uid: int, index: int) -> tuple[float, bool]:
        """Sample ``index``'s log-length and correctness (beyond the run's n: the model's extra draw)."""
        draw = self._draw(uid)
        if index < len(draw.log_lengths):
            return draw.log_lengths[index], draw.correct[index]
        return self.lengths.extra(uid, self._n, index)

    def replay_len(self, prompt: Prompt, sample_index: int, start_step: int) -> int:
        log_len = self._sample(prompt.uid, sample_index)[0]
        return max(1, round(math.exp(log_len + self.lengths.drift_per_step * start_step)))

    def reward(self, sample: Sample) -> float:
        """1 for a right answer that was not truncated, else 0 (deepscaler-style).  Drives the
        DAPO filter only; it is not an accuracy.  A replayed trace gives its own rewards."""
        if self._replay is not None:
            truncated = sample.status is SampleStatus.TRUNCATED
            return float(self._replay.reward(sample.prompt.uid, sample.index, truncated=truncated))
        right = self._sample(sample.prompt.uid, sample.index)[1]
        return 1.0 if right and sample.status is SampleStatus.COMPLETED else 0.0
