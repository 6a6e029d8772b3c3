"""``hf``: continuous batching over a Hugging Face ``transformers`` causal LM (CPU or CUDA).

Importing this package imports torch and transformers; ``april_bench`` only does
so when the ``hf`` engine is asked for.
"""

from april_bench.engines.hf.engine import HFEngine

__all__ = ["HFEngine"]
