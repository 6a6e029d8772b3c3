"""The policy models and their checkpoint files, below the engines and the trainers that both load them.

:mod:`april_bench.models.zoo` builds a named architecture (``ls models``) or loads a checkpoint
directory; :mod:`april_bench.models.checkpoint` writes and reads the safetensors checkpoints and the tiny
tokenizer the embedded default uses.  Importing this package is light; the modules import torch and
transformers.  It imports only neutral layers (``config``, ``profiles``).
"""
