"""APRIL's three published settings as data, each number with its source.

The APRIL README (``RLsys-Foundation/APRIL`` README, "Results and Comparison")
reports the rollout-throughput gain of APRIL over the scripted baseline on
Qwen3-4B for three data sets.  The scripts sit in
``scripts/partial_rollout/qwen/{dapo,grpo,gspo}/``: the folder is the
algorithm, so the rows are DAPO on DAPO-Math-17k, GRPO on DeepScaleR and GSPO
on DeepMath-103K, and the algorithm is never remapped.

A row is only the paper's figure and the (algorithm, data set) it belongs to:
the deployment, batch and limit are the scripts' and are the defaults of
:func:`april_bench.recipes.paper` (what ``run --hw mi300x --algo dapo`` runs),
and the response lengths come from the (data set, model) profiles of
:mod:`april_bench.sim.length_evidence`.  Nothing here is fitted to the paper's gains.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from april_bench.config import ConfigError
from april_bench.sim.length_evidence import LENGTH_FIELDS

__all__ = [
    "AGENT_ROW",
    "HARDWARE",
    "PAPER_SETTINGS",
    "SCRIPT_ROLLOUT",
    "STEPS",
    "AgentRow",
    "PaperSetting",
    "paper_reference",
    "paper_setting",
]

#: Steps per simulated arm in the paper table: enough for the carry-over buffer of APRIL to reach
#: its steady state (about 32 of 64 launched groups are continuations), short enough to fit often.
STEPS = 30
#: The two GPU types the README says the gains were reproduced on.
HARDWARE = ("h100", "mi300x")

_SCRIPTS = "APRIL@a72b585 scripts/partial_rollout/qwen/{algo}/run-qwen3-4B-{data}[-partial].sh"
_ALL_SCRIPTS = _SCRIPTS.format(algo="*", data="*")
_README = "APRIL README (b37fa61) 'Results and Comparison': Qwen3-4B rollout throughput"


@dataclass(frozen=True, slots=True)
class PaperSetting:
    """One row of the paper's table: its figure and the (algorithm, data set) it was measured on."""

    key: str
    dataset: str
    algorithm: str
    #: APRIL's published rollout-throughput gain over the baseline.
    paper_gain: float
    model: str = "qwen3-4b"
    #: Field name -> where its value comes from (the scripts' settings included).
    sources: Mapping[str, str] = field(default_factory=dict)
    #: Other algorithms the row may have been measured with, when its sources disagree (each simulated
    #: beside the row's own algorithm: ``april_bench.experiment.readings``).
    other_readings: tuple[str, ...] = ()
    #: Why the row's algorithm is uncertain, in one line (empty when it is not).
    reading_note: str = ""

    def matches(self, config: Mapping[str, Any]) -> bool:
        """Whether a run's ``config.json`` is this row as the scripts run it (any GPU type of the paper)."""
        rollout = config.get("rollout", {})
        return (
            config.get("model") == self.model
            and config.get("dataset") == self.dataset
            and config.get("algorithm") == self.algorithm
            and config.get("hardware") in HARDWARE
            and all(rollout.get(k) == v for k, v in SCRIPT_ROLLOUT.items())
            and not {k for k in config.get("workload_args", {}) if k in LENGTH_FIELDS}
        )


#: The rollout settings every APRIL script shares (``RolloutConfig`` fields); the baseline differs only in
#: its strategy (no partial rollout, waves of rollout_batch_size).
SCRIPT_ROLLOUT = {
    "rollout_batch_size": 32,
    "n_samples_per_prompt": 8,
    "over_sampling_batch_size": 64,
    "max_response_len": 16384,
    "temperature": 0.8,
    "refill": "wave",
}

_COMMON = {
    "model": _ALL_SCRIPTS + ": --hf-checkpoint Qwen3-4B",
    "gpus": _ALL_SCRIPTS + ": 1 node x 8 GPUs, --colocate; README: reproduced on 8 x H100 and 8 x MI300",
    "tp_size": _ALL_SCRIPTS + ": --rollout-num-gpus-per-engine 2 (4 SGLang engines)",
    "mem_fraction_static": _ALL_SCRIPTS
    + ": --sglang-mem-fraction-static 0.6 (ROCm torch_memory_saver limit)",
    "rollout_batch_size": _ALL_SCRIPTS + ": --rollout-batch-size 32",
    "n_samples_per_prompt": _ALL_SCRIPTS + ": --n-samples-per-prompt 8",
    "over_sampling_batch_size": _ALL_SCRIPTS
    + ": -partial.sh adds --over-sampling-batch-size 64; the baseline leaves it unset, so slime "
    "refills in waves of rollout_batch_size (arguments.py L929)",
    "max_response_len": _ALL_SCRIPTS + ": --rollout-max-response-len 16384",
    "temperature": _ALL_SCRIPTS + ": --rollout-temperature 0.8",
    "refill": "APRIL@a72b585 slime/rollout/sglang_example.py L242: refill a whole over-sampling batch "
    "whenever accepted + in flight < rollout_batch_size",
    "lengths": "april_bench/sim/length_evidence.py: the (data set, Qwen3-4B) profiles, each open with the "
    "AIME'24-anchored model as its central value, chosen before any gain was compared (docs/calibration.md); "
    "nothing fitted to the paper",
}

#: Why the DAPO-Math-17k row's algorithm is uncertain (docs/calibration.md, "Two readings of the DAPO row").
DAPO_ROW_READINGS = (
    "'DAPO' in this row may name the data set, not the algorithm: the README's table says DAPO, but the "
    "same README introduces 'Qwen3-4B with DAPO' with scripts/partial_rollout/qwen/grpo/"
    "run-qwen3-4B-dapo-partial.sh (GRPO on the DAPO-Math data, no filter), and the figure's legend "
    "dapo-qwen3-4B(-partial) follows the naming of the slime fork's run-qwen3-4B-amd.sh, a GRPO script; "
    "so the row is simulated both ways"
)

PAPER_SETTINGS: tuple[PaperSetting, ...] = (
    PaperSetting(
        key="dapo-math",
        dataset="dapo-math-17k",
        algorithm="dapo",
        paper_gain=0.17,
        other_readings=("grpo",),
        reading_note=DAPO_ROW_READINGS,
        sources={
            **_COMMON,
            "paper_gain": _README + ", DAPO-Math-17k +17%",
            "algorithm": _SCRIPTS.format(algo="dapo", data="dapo")
            + ": the grpo estimator plus --dynamic-sampling-filter-path ...check_reward_nonzero_std (L92); "
            "its baseline qwen/dapo/run-qwen3-4B-dapo.sh keeps the filter without partial rollout",
        },
    ),
    PaperSetting(
        key="deepscaler",
        dataset="deepscaler",
        algorithm="grpo",
        paper_gain=0.21,
        sources={
            **_COMMON,
            "paper_gain": _README + ", DeepScaleR +21%",
            "algorithm": _SCRIPTS.format(algo="grpo", data="deepscaler"),
        },
    ),
    PaperSetting(
        key="deepmath",
        dataset="deepmath-103k",
        algorithm="gspo",
        paper_gain=0.35,
        sources={
            **_COMMON,
            "paper_gain": _README + ", DeepMath-103K +35%",
            "algorithm": _SCRIPTS.format(algo="gspo", data="deepmath") + ": --advantage-estimator gspo",
        },
    ),
)


def paper_setting(key: str) -> PaperSetting:
    for setting in PAPER_SETTINGS:
        if setting.key == key:
            return setting
    known = ", ".join(s.key for s in PAPER_SETTINGS)
    raise ConfigError(f"unknown paper setting {key!r}; choose from {known}")


def paper_reference(config: Mapping[str, Any]) -> PaperSetting | None:
    """The paper row a run's ``config.json`` reproduces, if any (shown beside its simulated gain)."""
    return next((s for s in PAPER_SETTINGS if s.matches(config)), None)


@dataclass(frozen=True, slots=True)
class AgentRow:
    """APRIL's fourth row (agent tasks), which names no task, tool or script: the run that predicts it
    and the ranges of what the sources leave open (docs/calibration.md, "The fourth row").  Chosen
    from the sources below before any gain of the row was computed; nothing fitted to the +23%."""

    key: str = "agent"
    model: str = "r1-distill-qwen-1.5b"
    dataset: str = "deepscaler"
    algorithm: str = "grpo"
    paper_gain: float = 0.23
    #: Mean tool calls per episode (Poisson, capped at ``max_calls``): open, so a range.
    calls: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    #: Median seconds per tool call (log-normal, sigma ``latency_sigma``): open, so a range.
    latency_s: tuple[float, ...] = (0.1, 1.0, 5.0)
    latency_sigma: float = 1.0
    max_calls: int = 16
    observation_tokens: int = 32
    tool_slots: int = 32
    timeout_s: float = 120.0
    sources: Mapping[str, str] = field(default_factory=dict)

    def workload_args(self, calls: float, latency_s: float) -> dict[str, float]:
        return {
            "agent_calls": calls,
            "agent_latency_s": latency_s,
            "agent_latency_sigma": self.latency_sigma,
            "agent_max_calls": self.max_calls,
            "agent_observation_tokens": self.observation_tokens,
            "agent_tool_slots": self.tool_slots,
            "agent_timeout_s": self.timeout_s,
        }


_SLIME_RETOOL = "THUDM/slime examples/retool"
AGENT_ROW = AgentRow(
    sources={
        "paper_gain": "APRIL README (b37fa61) 'Results and Comparison': agent tasks, DeepSeek-1.5B, GRPO, "
        "+23% throughput (no script, task, tool or latency published)",
        "model": "same README row: DeepSeek-R1-Distill-Qwen-1.5B",
        "algorithm": "same README row: GRPO",
        "dataset": "assumption: the row names no data set; the R1-Distill-1.5B lengths with a published "
        "source are DeepScaleR's (sim/length_evidence.py profile (deepscaler, r1-distill-qwen-1.5b): "
        "right-answer median 2,566, wrong x3.49, fitted to the DeepScaleR blog); slime's retool example "
        "trains on DAPO-Math-17k, a math set of the same kind",
        "rollout": "assumption: APRIL's scripts' rollout settings (32 x 8, over-sampling 64, 16,384 tokens, "
        "4 engines at TP2), as for the other rows; slime's retool script also uses 32 x 8 "
        "(retool_qwen3_4b_rl.sh)",
        "episode": "slime examples/retool/generate_with_retool.py (APRIL's code base): the response is "
        "turns of generation, each ending in a code_interpreter call whose output is appended as "
        "'<interpreter>...</interpreter>' with loss mask 0; the last turn writes 'Answer: \\boxed{}'",
        "max_calls": _SLIME_RETOOL + "/tool_sandbox.py TOOL_CONFIGS: max_turns 16, max_tool_calls 16",
        "tool_slots": _SLIME_RETOOL + "/tool_sandbox.py TOOL_CONFIGS: tool_concurrency 32 (a semaphore)",
        "timeout_s": _SLIME_RETOOL + "/tool_sandbox.py TOOL_CONFIGS: python_timeout 120 s",
        "calls": "open: no public per-episode call count for this setting was found; range 1-8 (up to half "
        "of slime's cap of 16)",
        "latency_s": "open: each call runs a fresh python3 subprocess (tool_sandbox.py); no published "
        "latency distribution; range 0.1 s (interpreter start + a short script) to 5 s (a loaded or "
        "remote sandbox), log-normal sigma 1.0 (p99 about 10x the median, the tail ratio of landscape.md "
        "5b) as in the synthetic-agent task",
        "observation_tokens": "assumption: the '<interpreter>' wrapper (about 12 tokens) plus a short "
        "printed result; 32 tokens",
        "turn_lengths": "assumption: the length model's response length is split evenly across the turns "
        "(tool use does not change how long the model writes in total)",
    }
)
