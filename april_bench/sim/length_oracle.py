"""Length profiles: what a forced-length run (``run --length-oracle PROFILE``) draws every response's
length and reward from.

A profile is one of

* ``DATASET[@MODEL]`` - a data set's length model for a policy model, the simulator's own
  (:class:`april_bench.sim.workload.SimWorkload`: the model's published evidence for that data set,
  else the data-set profile's labelled assumptions).  ``DATASET`` is ``dapo-math-17k``, ``deepscaler``,
  ``deepmath-103k`` or ``synthetic``; ``MODEL`` defaults to the paper's ``qwen3-4b`` for a math set and
  to the embedded ``tiny`` for ``synthetic``;
* a length-trace file (``.jsonl`` / ``.csv`` with a ``length`` column, optional ``uid`` or
  ``prompt_id`` and ``reward``/``correct``: :class:`april_bench.sim.lengths.TraceLengths`);

followed by options in brackets, ``deepscaler@r1-distill-qwen-1.5b[cap=8192]``:

* ``cap=TOKENS``: the response limit the profile describes (default: the APRIL scripts' 16,384 for a
  math set; none for ``synthetic`` and traces, whose lengths are absolute).  Every length is scaled by
  ``--max-response-len / cap``, so a CPU run at 256 tokens keeps the paper's shape: the same share of
  responses truncated, the same tail;
* ``scale=FACTOR``: scale lengths by this instead (``scale=1``: the profile's own token counts);
* any length-model parameter (``response_median``, ``solve_rate``, ``incorrect_factor``,
  ``prompt_sigma``, ``within_sigma``, ``solve_concentration``, ``drift_per_step``).

**The draw.**  Sample ``index`` of prompt ``uid`` gets the length and right/wrong outcome the length
model draws for it from ``numpy.random.default_rng([seed, uid // 256, group size])`` (one block of
256 prompts at a time): a function of (seed, prompt uid, sample index) for a run's group size,
whatever order prompts arrive or launch in, on any machine (numpy's bit generator and its
distributions are integer-exact; only the final ``exp`` and rounding are floating point, and a length
moves only if the draw lands within one ulp of a half-token).  ``drift_per_step`` is 0 unless given
(a drifting length would depend on the step a sample starts in, which differs between arms).
A resumed partial continues to the same target: the rollout loop asks for ``target - tokens so far``.

**The reward.**  1 when the draw says the answer is right and the response was not truncated, else 0
(deepscaler-style): the correctness model is the profile's (per-prompt solve rate from a Beta around
``solve_rate``; wrong answers ``incorrect_factor`` times longer), so DAPO's filter decides the same
on every machine.  It is not the model's accuracy.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from april_bench.config import ConfigError
from april_bench.sim.length_evidence import LENGTH_FIELDS

__all__ = ["DEFAULT_CAP", "LengthOracle", "OracleSpec", "parse_profile", "profile_names"]

#: The response limit of the APRIL scripts (``--rollout-max-response-len 16384``): the cap a math
#: data set's profile describes unless ``cap=`` says otherwise.
DEFAULT_CAP = 16384
#: Options a profile takes besides the length-model parameters.
_OPTIONS = ("cap", "scale")
_SPEC = re.compile(r"^(?P<name>[^\[\]@]+?)(?:@(?P<model>[^\[\]@]+))?(?:\[(?P<options>[^\[\]]*)\])?$")
_TRACE_SUFFIXES = (".jsonl", ".json", ".csv")


def profile_names() -> list[str]:
    """The data-set profiles a ``--length-oracle`` can name."""
    from april_bench.sim.workload import DATASET_PROFILES

    return list(DATASET_PROFILES.names())


@dataclass(frozen=True, slots=True)
class OracleSpec:
    """A parsed ``--length-oracle`` value."""

    text: str
    #: A data-set profile name, or ``None`` for a trace file.
    dataset: str | None
    model: str | None
    trace: Path | None
    options: dict[str, float]


def parse_profile(text: str) -> OracleSpec:
    """``DATASET[@MODEL][k=v,...]`` or ``PATH[k=v,...]``, checked; one ``ConfigError`` naming the fix."""
    match = _SPEC.match(text.strip())
    if match is None:
        raise ConfigError(
            f"--length-oracle {text!r}: write DATASET[@MODEL][option=value,...] (e.g. deepscaler, "
            "deepscaler@r1-distill-qwen-1.5b[cap=8192]) or a length-trace file (lengths.jsonl[scale=0.1])"
        )
    name, model, raw = match.group("name").strip(), match.group("model"), match.group("options")
    options = _options(text, raw)
    if name.endswith(_TRACE_SUFFIXES) or "/" in name:
        path = Path(name).expanduser()
        if model is not None:
            raise ConfigError(f"--length-oracle {text!r}: a trace file's lengths are its own; drop @{model}")
        if not path.is_file():
            raise ConfigError(f"--length-oracle {text!r}: no length-trace file {path}")
        if set(options) & set(LENGTH_FIELDS):
            raise ConfigError(
                f"--length-oracle {text!r}: a trace replays its lengths; only cap= and scale= apply to it"
            )
        return OracleSpec(text=text, dataset=None, model=None, trace=path, options=options)
    names = profile_names()
    if name not in names:
        raise ConfigError(
            f"--length-oracle {name!r}: not a length profile; choose a data set ({', '.join(names)}) "
            "or give a length-trace file (.jsonl or .csv)"
        )
    from april_bench.profiles.models import MODELS

    model = (model or ("tiny" if name == "synthetic" else "qwen3-4b")).strip()
    if model not in MODELS:
        MODELS.get(model)  # raises with the known names
    return OracleSpec(text=text, dataset=name, model=model, trace=None, options=options)


def _options(text: str, raw: str | None) -> dict[str, float]:
    options: dict[str, float] = {}
    for item in (raw or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in (*_OPTIONS, *LENGTH_FIELDS):
            raise ConfigError(
                f"--length-oracle {text!r}: unknown option {item.strip()!r}; options are "
                f"{', '.join((*_OPTIONS, *LENGTH_FIELDS))} (as name=value)"
            )
        try:
            number = float(json.loads(value))
        except (ValueError, TypeError):
            raise ConfigError(f"--length-oracle {text!r}: {key}= needs a number, got {value!r}") from None
        if not math.isfinite(number) or number < 0 or (key in _OPTIONS and number <= 0):
            raise ConfigError(f"--length-oracle {text!r}: {key}={value} must be a finite positive number")
        options[key] = number
    return options


class LengthOracle:
    """Every sample's forced response length and reward, drawn from one profile (module doc).

    ``length(uid, index)`` is the total response length sample ``index`` of prompt ``uid`` ends at
    (it may exceed ``max_response_len``: the engine then truncates it at the limit);
    ``correct(uid, index)`` whether its answer counts as right.
    """

    def __init__(self, text: str, *, seed: int, n_samples_per_prompt: int, max_response_len: int) -> None:
        from april_bench.sim.workload import SimWorkload

        spec = parse_profile(text)
        self.spec = spec
        options = dict(spec.options)
        cap, scale = options.pop("cap", None), options.pop("scale", None)
        if spec.trace is not None:
            config = SimWorkload.Config(length_trace=spec.trace, seed=seed)
        else:
            assert spec.dataset is not None and spec.model is not None
            options.setdefault("drift_per_step", 0.0)
            if cap is None and scale is None and spec.dataset != "synthetic":
                cap = DEFAULT_CAP
            fields: dict[str, Any] = {"dataset": spec.dataset, "model": spec.model, "seed": seed, **options}
            config = SimWorkload.Config(**fields)
        self._workload = config.build(n_samples_per_prompt=n_samples_per_prompt)
        self._n = n_samples_per_prompt
        self.cap = None if cap is None else int(cap)
        self.scale = float(scale) if scale is not None else (max_response_len / cap if cap else 1.0)
        self.max_response_len = max_response_len

    @property
    def label(self) -> str:
        return self.spec.text

    @property
    def has_rewards(self) -> bool:
        """False for a trace without a reward column (every sample then counts as right)."""
        return self._workload.has_rewards

    @property
    def drift_per_step(self) -> float:
        return float(self._workload.lengths.drift_per_step)

    def length(self, uid: int, index: int, start_step: int = 0) -> int:
        log_len = self._workload.lengths.draw(uid, self._n).log_lengths[index]
        drift = self.drift_per_step * start_step
        return max(1, round(math.exp(log_len + drift) * self.scale))

    def correct(self, uid: int, index: int) -> bool:
        return bool(self._workload.lengths.draw(uid, self._n).correct[index])

    def describe(self) -> dict[str, Any]:
        """What a run's provenance and config record about its forced lengths."""
        out: dict[str, Any] = {
            "profile": self.spec.text,
            "kind": "trace" if self.spec.trace is not None else "dataset",
            "dataset": self.spec.dataset,
            "model": self.spec.model,
            "trace": None if self.spec.trace is None else str(self.spec.trace),
            "cap": self.cap,
            "scale": self.scale,
            "max_response_len": self.max_response_len,
            "keyed_by": "seed, prompt uid, group size, sample index",
            "rewards": "drawn with the length (right and not truncated = 1)"
            if self.has_rewards
            else "none in the trace (every sample right)",
        }
        if self.spec.trace is None:
            out["parameters"] = self._workload.length_parameters()
            out["source"] = self._workload.profile.source
        return out
