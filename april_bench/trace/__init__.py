"""Rollout traces: what a training run's rollouts looked like, sample by sample, for ``whatif``.

:mod:`april_bench.trace.format` is the one trace format (``docs/whatif.md``); the importers turn
verl's rollout dumps (:mod:`~april_bench.trace.verl`), slime's debug rollout data
(:mod:`~april_bench.trace.slime`) and per-step length statistics (:mod:`~april_bench.trace.stats`)
into it.  Every april-bench run writes its own trace as the ``trace`` table of its run directory.
"""
