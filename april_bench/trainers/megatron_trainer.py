"""``megatron``: the torch trainer's loss and optimizer on a megatron-core ``GPTModel``, over ``tp`` ranks.

Each rank is a spawned process, or under ``--trainer ray`` a Ray actor on any node (:mod:`.ranks`),
that joins a process group (gloo on CPU, nccl on CUDA), sets up megatron-core's model-parallel
groups (``parallel_state.initialize_model_parallel``), builds a ``GPTModel`` from the policy's
Hugging Face config with the local layer spec (``get_gpt_layer_local_spec``: pure megatron-core
modules, no Transformer Engine or Apex), and loads its tensor-parallel shard of the starting weights
through the layout mapping (:mod:`.megatron`: Hugging Face names to megatron-core's, QKV and gate/up
fused, then split by rank).

Training is :class:`~april_bench.trainers.torch_trainer.TorchTrainer`'s, unchanged: the same rows,
advantages, recomputed old log-probs, policy loss (grpo/dapo/gspo, :mod:`april_bench.algorithms.losses`),
micro-batch accumulation and AdamW (elementwise, so AdamW on each rank's shard is AdamW on the whole).
Every tensor-parallel rank computes the whole batch; what differs from one process:

* the logits come from megatron's forward (``parallel_output=False``: gathered over the ranks) with
  an explicit causal mask, and the log-probs are taken from them (:func:`.logprobs.logits_token_logprobs`);
* the gradient norm is summed over the model-parallel ranks, replicated parameters counted once
  (``param_is_not_tensor_parallel_duplicate``), and the QK-norm weights' gradients, which each rank
  computes for its own heads only, are summed over the tensor-parallel ranks first - what
  megatron-core's ``get_grad_norm_fp32`` and ``finalize_model_grads`` do, whose own code assumes CUDA.

A vocabulary that ``tp`` does not divide is padded with zero rows, and the logits of the padding are
cut off before the softmax, so the loss is the unpadded model's.  ``weights()`` gathers every rank's
shard to the driver and maps it back to Hugging Face names (the in-process WeightSync); ``save()``
writes a Hugging Face checkpoint for engines in another process.

Pipeline parallelism: the layout maps and checks ``pp`` (:class:`.megatron.MegatronLayout`), but this
trainer runs ``pp=1``: a pipeline needs megatron's schedules (``get_forward_backward_func``) driving
the loss on the last stage, which is not wired here.

Checked on megatron-core 0.16.1 with torch 2.13.0 (CPU wheels, gloo, tp=1 and tp=2).  On a CPU,
megatron-core puts a few tensors on ``torch.cuda.current_device()`` (the rotary frequencies, the
tensor-parallel gather buffers); a CPU rank answers that with the CPU device for as long as it lives
(it is a process of its own), and uses megatron's no-op RNG tracker (``inference_rng_tracker``): with
dropout 0 there is no random state to fork.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from april_bench.config import ConfigError, Configurable, param
from april_bench.trainers.fsdp import PolicySpec
from april_bench.trainers.logprobs import logits_token_logprobs
from april_bench.trainers.megatron import MegatronLayout, ModelShape, hf_to_mcore, mcore_to_hf, shard, unshard
from april_bench.trainers.protocol import TrainResult
from april_bench.trainers.ranks import Handler, Launcher, RankRecipe, start_ranks
from april_bench.trainers.torch_trainer import TorchTrainer, _Rows
from april_bench.types import Group

__all__ = ["MegatronTrainer", "policy_config", "transformer_config"]

_VOCAB_KEYS = ("model.embed_tokens.weight", "lm_head.weight")


class MegatronTrainer(Configurable):
    """Drives ``tp x pp`` megatron-core ranks; the trainer protocol on this side, megatron on theirs."""

    #: ``weights()`` gathers every rank's shard: callers that only ask whether there are weights must
    #: not call it (``backends.weights.choose_weight_sync``).
    has_weights = True

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(TorchTrainer.Config):
        tp: int = param(1, help="tensor-parallel size (ranks; one GPU each on CUDA)")
        pp: int = param(1, help="pipeline-parallel size (1: pipeline schedules are not wired yet)")
        backend: str = param("auto", help="process-group backend: gloo, nccl, or auto (nccl on CUDA)")
        start_timeout_s: float = param(300.0, help="seconds to wait for the ranks to start")

        def __post_init__(self) -> None:
            TorchTrainer.Config.__post_init__(self)
            if self.tp < 1 or self.pp < 1:
                raise ConfigError(f"--trainer-arg tp and pp must be >= 1, got tp={self.tp} pp={self.pp}")
            if self.pp != 1:
                raise ConfigError(
                    f"--trainer-arg pp={self.pp}: the megatron trainer runs one pipeline stage for now "
                    "(megatron's pipeline schedules are not wired); use pp=1 and tp for the model's width"
                )
            if self.backend not in ("auto", "gloo", "nccl"):
                raise ConfigError(f"--trainer-arg backend must be auto, gloo or nccl, got {self.backend!r}")
            if self.kl_coef > 0:
                raise ConfigError(
                    "the megatron trainer keeps no reference model: use kl_coef=0 (APRIL's setting) "
                    "or --trainer torch"
                )
            if self.activation_checkpointing:
                raise ConfigError(
                    "the megatron trainer does not wire megatron's activation recomputation yet: "
                    "drop --trainer-arg activation_checkpointing=true, or use --trainer torch"
                )

        @property
        def world_size(self) -> int:
            return self.tp * self.pp

        def torch_config(self) -> TorchTrainer.Config:
            """The per-rank trainer's settings (everything but the parallel layout)."""
            torch_names = {f.name for f in fields(TorchTrainer.Config)}
            own = {f.name for f in fields(MegatronTrainer.Config)} - torch_names
            shared = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in own}
            return TorchTrainer.Config(**shared)

    def __init__(self, config: Config, *, model: PolicySpec, launcher: Launcher | None = None) -> None:
        self.config = config
        self.model_spec = model
        hf = policy_config(model)
        self.vocab = int(hf.vocab_size)
        self.layout = MegatronLayout(tp=config.tp, pp=config.pp)
        self.shape = padded_shape(ModelShape.of(hf), config.tp)
        self.layout.check(self.shape)
        self._ranks = start_ranks(
            # megatron's own groups are destroyed before the process group
            RankRecipe(
                functools.partial(_build_rank, config, model),
                scope=_megatron_device,
                leave=_destroy_model_parallel,
            ),
            config,
            name="megatron",
            needs=f"--trainer-arg tp={config.tp} pp={config.pp} needs {config.world_size} GPUs",
            launcher=launcher,
        )

    @property
    def placement(self) -> list[dict[str, Any]]:
        """Where each rank runs (Ray actors: their node ids; local processes: nothing to say)."""
        return self._ranks.placement

    # ------------------------------------------------------------ trainer protocol
    async def train(self, batch: Sequence[Group], *, step: int, policy_version: int) -> TrainResult:
        replies = await self._ranks.acall("train", list(batch), step, policy_version)
        metrics: dict[str, float] = replies[0]
        return TrainResult(metrics=metrics)

    def weights(self) -> dict[str, torch.Tensor]:
        """The full policy in Hugging Face names (CPU tensors): every rank's shard, gathered here."""
        parts = dict(self._ranks.call("weights"))
        state = mcore_to_hf(unshard(parts, self.shape, self.layout), self.shape, spec="local")
        for key in _VOCAB_KEYS:  # the padding rows go
            if key in state:
                state[key] = state[key][: self.vocab]
        return state

    def save(self, path: str) -> str:
        """The policy as a Hugging Face checkpoint directory, for an engine in another process."""
        from april_bench.models.checkpoint import save_state_dict
        from april_bench.models.zoo import build_model

        spec = self.model_spec
        module = build_model(spec.name, vocab_size=spec.vocab_size, seed=spec.seed)
        module.load_state_dict(self.weights())
        return str(save_state_dict(module, path))

    def save_state(self, path: str) -> None:
        """Every rank's model shard and AdamW state, in one file written atomically."""
        states = self._ranks.call("state")
        from april_bench.trainers.state_file import save_atomic

        save_atomic({"tp": self.config.tp, "pp": self.config.pp, "ranks": states}, path)

    def load_state(self, path: str) -> None:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if (saved["tp"], saved["pp"]) != (self.config.tp, self.config.pp):
            raise ConfigError(
                f"{path} was saved with tp={saved['tp']} pp={saved['pp']}; resume with the same "
                f"--trainer-arg tp and pp (now tp={self.config.tp} pp={self.config.pp})"
            )
        self._ranks.call("load_state", path)

    def close(self) -> None:
        """Stop the ranks (idempotent)."""
        self._ranks.close()


# ---------------------------------------------------------------- model and config
def policy_config(model: PolicySpec) -> Any:
    """The policy's ``transformers`` config (a named architecture, or a checkpoint directory's)."""
    if Path(model.name).is_dir():
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(model.name)
    from april_bench.models.zoo import model_config

    return model_config(model.name, vocab_size=model.vocab_size)


def padded_shape(shape: ModelShape, tp: int) -> ModelShape:
    """The shape with the vocabulary padded to a multiple of ``tp`` (megatron splits it by rank)."""
    return replace(shape, vocab=-(-shape.vocab // tp) * tp)


def _rope_theta(hf: Any) -> float:
    rope = getattr(hf, "rope_parameters", None) or {}
    kind = rope.get("rope_type", "default")
    if kind != "default":
        raise ConfigError(f"the megatron trainer supports plain RoPE; this model's rope_type is {kind!r}")
    theta = rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
    return float(theta)


def transformer_config(hf: Any, weights: dict[str, torch.Tensor], *, tp: int, pp: int) -> Any:
    """megatron-core's ``TransformerConfig`` for a Qwen2/Qwen3 ``transformers`` config."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    heads = hf.num_attention_heads
    return TransformerConfig(
        num_layers=hf.num_hidden_layers,
        hidden_size=hf.hidden_size,
        ffn_hidden_size=hf.intermediate_size,
        num_attention_heads=heads,
        num_query_groups=hf.num_key_value_heads,
        kv_channels=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
        normalization="RMSNorm",
        layernorm_epsilon=hf.rms_norm_eps,
        gated_linear_unit=True,  # SwiGLU: fc1 is gate and up fused
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias="model.layers.0.self_attn.q_proj.bias" in weights,  # Qwen2: yes, Qwen3: no
        qk_layernorm="model.layers.0.self_attn.q_norm.weight" in weights,  # Qwen3
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        use_cpu_initialization=True,  # the weights are loaded next; no CUDA RNG needed to build
        params_dtype=torch.float32,
        # the fused kernels need CUDA (and some, Apex or Transformer Engine)
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
    )


def build_gpt(hf: Any, weights: dict[str, torch.Tensor], *, tp: int, pp: int, vocab: int) -> Any:
    """A megatron-core ``GPTModel`` shaped like ``hf`` (its weights still to be loaded)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    config = transformer_config(hf, weights, tp=tp, pp=pp)
    spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization="RMSNorm")
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=vocab,
        max_sequence_length=hf.max_position_embeddings,
        parallel_output=False,  # gather the vocabulary: the policy loss takes whole logits
        share_embeddings_and_output_weights=bool(hf.tie_word_embeddings),
        position_embedding_type="rope",
        rotary_base=_rope_theta(hf),
    )


def pad_vocab(weights: dict[str, torch.Tensor], vocab: int) -> dict[str, torch.Tensor]:
    """Embedding and head with zero rows up to ``vocab`` (never looked up; their logits are cut)."""
    out = dict(weights)
    for key in _VOCAB_KEYS:
        value = out.get(key)
        if value is not None and value.shape[0] < vocab:
            out[key] = torch.cat([value, value.new_zeros(vocab - value.shape[0], *value.shape[1:])])
    return out


# ---------------------------------------------------------------- the rank side
class _McoreRank(TorchTrainer):
    """The torch trainer on a megatron-core model: whole batch on every tensor-parallel rank."""

    _splits_rows = False  # every rank runs the same passes (collectives)

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(TorchTrainer.Config):
        """The torch trainer's options (a rank is built directly, with a ``TorchTrainer.Config``)."""

    def __init__(self, config: TorchTrainer.Config, *, module: torch.nn.Module, vocab: int) -> None:
        super().__init__(config, module=module)
        self.vocab = vocab

    def _logprobs(
        self, model: torch.nn.Module, rows: _Rows, index: torch.Tensor, width: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        ids = rows.ids[index, : width + 1]
        count, length = ids.shape
        positions = torch.arange(length, device=ids.device).expand(count, -1)
        # megatron's mask: True where attention is blocked.  Causal alone suffices: rows are padded
        # on the right, so no real token attends to padding.
        causal = torch.ones(length, length, dtype=torch.bool, device=ids.device).triu(1)[None, None]
        logits = model(input_ids=ids, position_ids=positions, attention_mask=causal)
        logits = logits[:, :-1, : self.vocab]  # the vocabulary padding's logits are not the policy's
        return logits_token_logprobs(
            logits, ids[:, 1:], rows.mask[index, :width], temperature=self.config.temperature
        )

    def _clip_gradients(self) -> torch.Tensor:
        import torch.distributed as dist
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        tp_group = parallel_state.get_tensor_model_parallel_group()
        named = [(n, p) for n, p in self.model.named_parameters() if p.grad is not None]
        if dist.get_world_size(tp_group) > 1:
            for name, parameter in named:  # megatron: _allreduce_non_tensor_model_parallel_grads
                if "q_layernorm" in name or "k_layernorm" in name:
                    assert parameter.grad is not None
                    dist.all_reduce(parameter.grad, group=tp_group)
        squares = torch.zeros((), dtype=torch.float64, device=self.device)
        for _, parameter in named:
            if param_is_not_tensor_parallel_duplicate(parameter):
                assert parameter.grad is not None
                squares += parameter.grad.double().pow(2).sum()
        dist.all_reduce(squares, group=parallel_state.get_model_parallel_group())
        norm = squares.sqrt()
        coefficient = self.config.grad_clip / (float(norm) + 1e-6)  # torch's clip_grad_norm_ rule
        if coefficient < 1.0:
            for _, parameter in named:
                assert parameter.grad is not None
                parameter.grad.mul_(coefficient)
        return norm.float()

    def check_memory(self, micro_batch_tokens: int) -> None:
        """Not estimated: the estimate reads a ``transformers`` config (trainers/memory.py)."""

    def local_state(self) -> dict[str, torch.Tensor]:
        """This rank's shard, megatron names (no ``_extra_state`` placeholders)."""
        return {
            k: v.detach().to("cpu", copy=True)
            for k, v in self.model.state_dict().items()
            if isinstance(v, torch.Tensor)
        }


@contextlib.contextmanager
def _megatron_device(device: str) -> Iterator[None]:
    """On a CPU rank, ``torch.cuda.current_device()`` is the CPU (see the module docstring)."""
    if device != "cpu":
        yield
        return
    from unittest import mock

    with mock.patch.object(torch.cuda, "current_device", lambda: torch.device("cpu")):
        yield


def _destroy_model_parallel() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()


def _build_rank(
    config: MegatronTrainer.Config, model: PolicySpec, rank: int, device: str, index: int
) -> Handler:
    """A rank (the :class:`~april_bench.trainers.ranks.RankRecipe`), in the joined group: set up
    megatron's groups, build and load its shard, then serve the driver's commands."""
    from megatron.core import parallel_state, tensor_parallel

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=config.tp, pipeline_model_parallel_size=config.pp
    )
    if device == "cpu":  # dropout is 0: no random state to fork per tensor-parallel rank
        tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    else:
        tensor_parallel.model_parallel_cuda_manual_seed(model.seed)
    hf = policy_config(model)
    shape = padded_shape(ModelShape.of(hf), config.tp)
    layout = MegatronLayout(tp=config.tp, pp=config.pp)
    where = (
        parallel_state.get_tensor_model_parallel_rank(),
        parallel_state.get_pipeline_model_parallel_rank(),
    )
    module = build_gpt(hf, model.weights, tp=config.tp, pp=config.pp, vocab=shape.vocab)
    full = hf_to_mcore(pad_vocab(model.weights, shape.vocab), shape, spec="local")
    _load_shard(module, shard(full, shape, layout)[where])
    torch_config = config.torch_config().replace(device=device)
    return _handler(_McoreRank(torch_config, module=module, vocab=int(hf.vocab_size)), where, rank)


def _load_shard(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Every parameter of the shard, exactly (only megatron's ``_extra_state`` placeholders may be absent)."""
    missing, unexpected = module.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("._extra_state")]
    if missing or unexpected:
        raise RuntimeError(f"megatron shard does not fit: missing {missing}, unexpected {unexpected}")


def _handler(trainer: _McoreRank, where: tuple[int, int], rank: int) -> Handler:
    import asyncio

    def handle(command: str, args: list[Any]) -> Any:
        if command == "train":
            batch, step, version = args
            return asyncio.run(trainer.train(batch, step=step, policy_version=version)).metrics
        if command == "weights":
            return where, trainer.local_state()
        if command == "state":
            return {"model": trainer.local_state(), "optimizer": trainer.optimizer.state_dict()}
        if command == "load_state":
            (path,) = args
            saved = torch.load(path, map_location="cpu", weights_only=True)["ranks"][rank]
            _load_shard(trainer.model, saved["model"])
            trainer.optimizer.load_state_dict(saved["optimizer"])
            return None
        raise ValueError(f"unknown command {command!r}")

    return handle
