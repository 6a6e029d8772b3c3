"""``--engine sim``: the simulator's engine (``engine.py``), its SGLang-like replicas
(``replica.py``) and their failure model (``failures.py``).  They implement the engine protocol on
the cost, length and workload models of :mod:`april_bench.sim`, which sit below ``engines/`` and
never import an engine."""
