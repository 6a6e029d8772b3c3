"""``--engine sim``: the simulator's engine (``engine.py``), its SGLang-like replicas
(``replica.py``), their failure model (``failures.py``) and what a step costs them: the roofline
(``cost.py``) or a measured cost curve (``cost_curve.py``, exported here for ``simcheck`` and
``whatif``).  The lengths and workloads they serve come from :mod:`april_bench.sim`, which they
never import: the engine is handed its requests."""

from april_bench.engines.sim.cost_curve import UNLIMITED, CostCurve

__all__ = ["UNLIMITED", "CostCurve"]
