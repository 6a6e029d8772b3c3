"""The length-model fit and the paper settings (all numbers simulated; nothing here needs data files)."""

from __future__ import annotations

import math

import pytest

from april_bench.config import ConfigError
from april_bench.recipes import paper_experiment
from april_bench.sim.calibration import (
    PUBLISHED,
    PUBLISHED_DRIFT,
    DriftTarget,
    LengthParams,
    LengthTarget,
    all_equal_share,
    fit_drift,
    fit_lengths,
    length_stats,
)
from april_bench.sim.length_evidence import LENGTH_FIELDS, MODEL_LENGTHS, median_from_truncation
from april_bench.sim.paper_settings import PAPER_SETTINGS, paper_setting


def test_length_stats_match_the_lognormal_closed_form_without_a_cap():
    # One right/wrong class (factor 1): the model is a plain log-normal with sigma = hypot(0.8, 0.6) = 1.
    params = LengthParams(median=1000, incorrect_factor=1.0)
    stats = length_stats(params, cap=1 << 30, blocks=32)
    assert stats["mean"] == pytest.approx(1000 * math.exp(0.5), rel=0.03)
    assert stats["truncated"] == 0.0
    assert stats["p99_over_median"] == pytest.approx(math.exp(2.326), rel=0.05)


def test_a_cap_censors_the_mean_and_counts_truncations():
    params = LengthParams(median=4000)
    free, capped = length_stats(params, cap=1 << 30), length_stats(params, cap=8192)
    assert capped["mean"] < free["mean"]
    assert 0.1 < capped["truncated"] < 0.9
    # Wrong answers are longer, so censoring squeezes the wrong/right ratio.
    assert capped["wrong_over_right"] < free["wrong_over_right"]


def test_fit_reproduces_a_synthetic_target_it_was_drawn_from():
    truth = LengthParams(median=1800, incorrect_factor=2.5, solve_rate=0.4)
    stats = length_stats(truth, cap=16384)
    target = LengthTarget(
        name="synthetic",
        model="-",
        cap=16384,
        mean=stats["mean"],
        solve_rate=0.4,
        wrong_over_right=stats["wrong_over_right"],
    )
    fit = fit_lengths(target)
    assert fit.params.median == pytest.approx(1800, rel=0.05)
    assert fit.params.incorrect_factor == pytest.approx(2.5, rel=0.05)


@pytest.mark.parametrize("target", PUBLISHED, ids=lambda t: t.name)
def test_fit_matches_every_published_statistic(target):
    fit = fit_lengths(target)
    rows = fit.rows()
    assert rows, "a target must give at least one statistic"
    for name, published, model in rows:
        assert model == pytest.approx(published, rel=0.03), name
    assert all(target.sources.get(k) for k in ("mean",)), "every target cites its mean"


@pytest.mark.parametrize("target", PUBLISHED_DRIFT, ids=lambda t: t.name)
def test_drift_fit_moves_the_mean_as_published(target):
    fit = fit_drift(target)
    assert fit.start_mean == pytest.approx(target.start_mean, rel=0.03)
    assert fit.end_mean == pytest.approx(target.end_mean, rel=0.03)
    assert (fit.drift_per_step > 0) == (target.end_mean > target.start_mean)


def test_drift_fit_of_a_flat_target_is_zero():
    fit = fit_drift(DriftTarget(name="flat", cap=16384, start_mean=3000, end_mean=3000, steps=100))
    assert fit.drift_per_step == pytest.approx(0.0, abs=1e-6)


def test_paper_settings_cite_every_script_setting_and_fit_nothing():
    cited = {
        "model",
        "gpus",
        "tp_size",
        "mem_fraction_static",
        "rollout_batch_size",
        "n_samples_per_prompt",
        "over_sampling_batch_size",
        "max_response_len",
        "temperature",
        "lengths",
        "paper_gain",
        "algorithm",
        "refill",
    }
    for setting in PAPER_SETTINGS:
        missing = cited - set(setting.sources)
        assert not missing, f"{setting.key}: no source for {sorted(missing)}"
        assert not any(v.startswith("fitted") for v in setting.sources.values()), setting.key


def test_every_length_parameter_cites_its_evidence():
    for evidence in MODEL_LENGTHS.values():
        assert set(LENGTH_FIELDS) <= set(evidence.sources), evidence.model


def test_the_qwen3_4b_median_is_derived_from_its_truncation_anchor():
    evidence = MODEL_LENGTHS["qwen3-4b"]
    anchor = evidence.anchor
    assert anchor is not None
    assert anchor.right_share_over_cap == pytest.approx(1 - 0.59 / 0.738)
    # the derived model really puts that share of right answers past the cap (drawn, not closed form)
    params = LengthParams(evidence.response_median, evidence.prompt_sigma, evidence.within_sigma, 1.0, 0.99)
    stats = length_stats(params, cap=anchor.cap, blocks=64)
    assert stats["truncated"] == pytest.approx(anchor.right_share_over_cap, abs=0.01)
    assert median_from_truncation(1000, 0.5, 1.0) == pytest.approx(1000)


def test_default_runs_draw_from_the_shared_model_and_overrides_win():
    from april_bench.sim.workload import SimWorkload

    def params(**cfg: object) -> dict[str, float]:
        return SimWorkload(SimWorkload.Config(**cfg), n_samples_per_prompt=8).length_parameters()

    shared = MODEL_LENGTHS["qwen3-4b"].workload_args()
    for dataset in ("dapo-math-17k", "deepscaler", "deepmath-103k"):
        assert params(dataset=dataset, model="qwen3-4b") == shared
    assert params(model="qwen3-4b", response_median=123.0)["response_median"] == 123.0
    # R1-Distill-1.5B on DeepScaleR: its (data set, model) profile, fitted to the DeepScaleR blog
    assert params(model="r1-distill-qwen-1.5b", dataset="deepscaler")["response_median"] == 2566.5
    # a pair without a profile keeps the data-set profile's labelled assumptions
    assert params(model="qwen3-8b", dataset="deepscaler")["response_median"] == 1700


def test_every_length_profile_names_its_status_evidence_and_open_range():
    from april_bench.sim.length_evidence import LENGTH_PROFILES
    from april_bench.sim.workload import DATASET_PROFILES

    for (dataset, model), profile in LENGTH_PROFILES.items():
        assert (profile.dataset, profile.model) == (dataset, model)
        assert dataset in DATASET_PROFILES
        assert profile.status in ("derived", "assumed", "open"), profile
        assert set(profile.params) == set(LENGTH_FIELDS) and profile.evidence
        # an open profile carries a range (and only an open one does), central value inside it
        assert bool(profile.open_range) == (profile.status == "open"), profile
        for name, (low, high) in profile.open_range.items():
            assert low < profile.params[name] < high, (dataset, model, name)


def test_an_open_range_has_an_easier_and_a_harder_end():
    from april_bench.sim.length_evidence import length_profile

    profile = length_profile("qwen3-4b", "deepscaler")
    assert profile is not None and profile.status == "open"
    ends = dict(profile.range_ends())
    median = MODEL_LENGTHS["qwen3-4b"].response_median
    assert ends["easier"] == {"response_median": round(median / 2, 1), "solve_rate": 0.8}
    assert ends["harder"] == {"response_median": round(median * 1.5, 1), "solve_rate": 0.4}
    r1 = length_profile("r1-distill-qwen-1.5b", "deepscaler")
    assert r1 is not None and r1.range_ends() == []


def test_the_r1_deepscaler_profile_reproduces_the_published_statistics():
    from april_bench.sim.length_evidence import length_profile

    profile = length_profile("r1-distill-qwen-1.5b", "deepscaler")
    assert profile is not None
    p = profile.params
    params = LengthParams(
        *(
            p[k]
            for k in ("response_median", "prompt_sigma", "within_sigma", "incorrect_factor", "solve_rate")
        ),
        2.0,
    )
    stats = length_stats(params, cap=8192, blocks=64)
    assert stats["mean"] == pytest.approx(5500, rel=0.02)  # DeepScaleR blog: ~5,500 at the 8k stage's start
    # wrong answers ~3x longer, taken at DeepScaleR's 32k evaluation context (the fit's ratio_cap)
    assert length_stats(params, cap=32768, blocks=64)["wrong_over_right"] == pytest.approx(3.0, rel=0.03)


def test_paper_setting_builds_the_scripted_experiment():
    setting = paper_setting("dapo-math")
    config = paper_experiment(setting, "mi300x", steps=3)
    assert config.engine == "sim" and config.algorithm == "dapo" and config.dataset == "dapo-math-17k"
    assert config.rollout.over_sampling_batch_size == 64 and config.rollout.max_response_len == 16384
    assert config.rollout.rollout_batch_size == 32 and config.rollout.temperature == 0.8
    assert not config.workload_args
    with pytest.raises(ConfigError, match="unknown paper setting"):
        paper_setting("nope")


def test_all_equal_share_of_sure_outcomes():
    sure = LengthParams(median=100, solve_rate=0.999, solve_concentration=1000.0)
    assert all_equal_share(sure, cap=1 << 30) > 0.9
    assert all_equal_share(sure, cap=1) == 1.0  # every answer truncated: all zero
