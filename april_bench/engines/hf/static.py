"""The static decode path of the ``hf`` engine: per-slot state on the device, one step, CUDA graphs.

The eager path (``HFEngine._decode``) builds its inputs from Python lists,
samples with per-request host values and appends every token to a Python
list: a few hundred small launches and host round trips per step, which is
what kept an H100 at 70-110 ms per step whatever the batch.  Here everything a
step reads or writes lives in device buffers indexed by slot:

* inputs: the last token, its position, the sampling parameters and seed;
* outputs: every generated token and its log-prob (``tokens``, ``logprobs``
  [slots, max_len]), copied to the host only when a sequence finishes or is
  aborted;
* stop test: EOS / stop ids, the length limit and the replayed length, on the
  device; the host reads one ``done`` flag per row per step (the step's only
  synchronisation).

So one step is a fixed sequence of kernels for a given (batch, KV length): on
CUDA it is captured once per bucket (batch padded up to the next bucket, the KV
view up to the next power of two) in a ``torch.cuda.CUDAGraph`` and replayed.
Padding rows are free slots (``live`` False): they write only to their own
slot and never finish.  Graphs read the weights by address, so a weight
update copied in place (``load_state_dict``) is seen by the next replay.  A
failed capture is logged and the step runs eagerly from then on.

Tokens and log-probs are bit-identical to the eager path's for the same
seeds (``sample_banning`` and ``position_uniforms`` are ``sample`` and
``position_uniform`` as tensor operations); ``tests/test_hf_static.py`` checks it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from april_bench.engines.hf.cache import SlotKVCache
from april_bench.engines.hf.sampling import position_uniforms, sample_banning, seed_bits

__all__ = ["Admission", "StaticDecoder", "batch_buckets", "kv_buckets"]

log = logging.getLogger(__name__)

#: Extra stop ids a request may add to the engine's EOS on the static path (the table is fixed-width).
EXTRA_STOPS = 8


def batch_buckets(limit: int) -> tuple[int, ...]:
    """Batch sizes with a graph: 1, 2, 4, 8, then every 16 up to ``limit`` (and ``limit`` itself)."""
    sizes = [b for b in (1, 2, 4, 8) if b < limit] + list(range(16, limit, 16))
    return (*sizes, limit)


def kv_buckets(max_len: int, smallest: int = 128) -> tuple[int, ...]:
    """KV view lengths with a graph: powers of two from ``smallest``, and ``max_len``."""
    sizes, size = [], smallest
    while size < max_len:
        sizes.append(size)
        size *= 2
    return (*sizes, max_len)


def _bucket(value: int, buckets: Sequence[int]) -> int | None:
    return next((b for b in buckets if b >= value), None)


@dataclass(frozen=True, slots=True)
class Admission:
    """A sequence entering decode: its slot, tokens so far (at least one) and sampling state."""

    slot: int
    tokens: Sequence[int]
    logprobs: Sequence[float]
    position: int  # where the last token goes in the KV cache
    temperature: float
    top_p: float
    seed: int
    replay_len: int | None
    max_new_tokens: int
    stops: frozenset[int]


class StaticDecoder:
    """Device-resident decode state for ``cache``'s slots and the step over them."""

    def __init__(
        self,
        model: Any,
        cache: SlotKVCache,
        *,
        eos: frozenset[int],
        cuda_graphs: bool,
        max_graph_batch: int,
    ) -> None:
        self.model = model
        self.cache = cache
        self.device = cache.row_index.device
        slots, max_len = cache.slots, cache.max_len
        self.max_len = max_len

        def zeros(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=self.device)

        self.last_token = zeros(slots)
        self.position = zeros(slots)
        self.generated = zeros(slots)
        self.replay_len = zeros(slots) - 1  # -1: no replayed length
        self.max_new = zeros(slots)
        self.seed = zeros(slots)
        # float32, as the eager path's torch.tensor([python floats]) makes them
        self.temperature = zeros(slots, dtype=torch.float32)
        self.top_p = zeros(slots, dtype=torch.float32)
        self.live = zeros(slots, dtype=torch.bool)
        self.done = zeros(slots, dtype=torch.bool)
        self.stop_width = len(eos) + EXTRA_STOPS
        self.stops = zeros(slots, self.stop_width) - 1
        self.tokens = zeros(slots, max_len)
        self.logprobs = zeros(slots, max_len, dtype=torch.float32)
        vocab = model.get_output_embeddings().weight.shape[0]
        self.ban_tokens = zeros(vocab, dtype=torch.bool)
        if eos:
            self.ban_tokens[sorted(eos)] = True
        self.has_eos = bool(eos)
        self.span = torch.arange(max_len, device=self.device)
        self._per_slot = [
            self.last_token,
            self.position,
            self.generated,
            self.replay_len,
            self.max_new,
            self.seed,
            self.temperature,
            self.top_p,
            self.live,
            self.stops,
            self.tokens,
            self.logprobs,
        ]
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        #: Pad batches and KV views to buckets (what graphs need); eager CPU decoding runs exact shapes.
        self.pad_to_buckets = self.use_graphs
        self.batch_buckets = batch_buckets(min(max_graph_batch, slots))
        self.kv_buckets = kv_buckets(max_len)
        self.graph_error: str | None = None
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._pool: Any = None

    # ------------------------------------------------------------ slot state (host -> device)
    def admit(self, admissions: Sequence[Admission]) -> None:
        """Load sequences into their slots (one host-to-device copy per buffer)."""
        if not admissions:
            return
        slots = torch.tensor([a.slot for a in admissions], device=self.device)

        def put(buffer: torch.Tensor, values: list[Any]) -> None:
            buffer[slots] = torch.tensor(values, dtype=buffer.dtype).to(self.device)

        put(self.last_token, [a.tokens[-1] for a in admissions])
        put(self.position, [a.position for a in admissions])
        put(self.generated, [len(a.tokens) for a in admissions])
        put(self.replay_len, [-1 if a.replay_len is None else a.replay_len for a in admissions])
        put(self.max_new, [a.max_new_tokens for a in admissions])
        put(self.seed, [seed_bits(a.seed) for a in admissions])
        put(self.temperature, [a.temperature for a in admissions])
        put(self.top_p, [a.top_p for a in admissions])
        put(self.live, [True] * len(admissions))
        put(self.stops, [sorted(a.stops) + [-1] * (self.stop_width - len(a.stops)) for a in admissions])
        width = max(len(a.tokens) for a in admissions)
        put(self.tokens[:, :width], [[*a.tokens, *[0] * (width - len(a.tokens))] for a in admissions])
        put(self.logprobs[:, :width], [[*a.logprobs, *[0.0] * (width - len(a.logprobs))] for a in admissions])

    def move(self, src: int, dst: int) -> None:
        """Slot ``src``'s state into slot ``dst`` (the KV cache moves separately)."""
        for buffer in self._per_slot:
            buffer[dst] = buffer[src]

    def clear(self, slot: int) -> None:
        """Free ``slot``: a padding row from now on (position 0, never finishes)."""
        self.live[slot] = False
        self.position[slot] = 0
        self.generated[slot] = 0

    def pull(self, slots: Sequence[int], counts: Sequence[int]) -> list[tuple[list[int], list[float]]]:
        """The first ``counts[i]`` tokens and log-probs of ``slots[i]``, in one device-to-host copy."""
        width = max(counts)
        index = torch.tensor(list(slots), device=self.device)
        both = torch.stack([self.tokens[index, :width].double(), self.logprobs[index, :width].double()]).cpu()
        return [
            ([int(t) for t in both[0, i, :n].tolist()], both[1, i, :n].tolist()) for i, n in enumerate(counts)
        ]

    # ------------------------------------------------------------ the step
    def step(self, batch: int, kv_len: int) -> tuple[list[int], bool]:
        """Decode rows ``0 .. batch`` once (KV positions below ``kv_len``); returns the rows that
        finished and whether a graph was captured for this step (its time is not a step's time)."""
        rows, view = batch, kv_len
        if self.pad_to_buckets:
            rows = _bucket(batch, self.batch_buckets) or batch
            view = _bucket(kv_len, self.kv_buckets) or self.max_len
        captured = False
        graph = None
        if self.use_graphs and self.graph_error is None and rows in self.batch_buckets:
            graph = self._graphs.get((rows, view))
            if graph is None:
                graph = self._capture(rows, view)
                captured = graph is not None
        with torch.inference_mode():
            if graph is not None:
                graph.replay()
            else:
                self._step(rows, view)
        done = self.done[:batch].cpu()  # the step's one host synchronisation
        return (done.nonzero().flatten().tolist() if bool(done.any()) else []), captured

    def _step(self, rows: int, view: int) -> None:
        """One decode step as device operations only (what a graph captures)."""
        pos = self.position[:rows]
        live = self.live[:rows]
        generated = self.generated[:rows]
        replay_len = self.replay_len[:rows]
        self.cache.bind_static_decode(rows, pos, view)
        visible = (self.span[:view][None, :] <= pos[:, None])[:, None, None, :]
        out = self.model(
            input_ids=self.last_token[:rows, None],
            position_ids=pos[:, None],
            attention_mask=visible,
            past_key_values=self.cache,
            use_cache=True,
        )
        # as the eager path: EOS is banned while a replayed length is not yet reached (if there is an EOS)
        replaying = live & (replay_len > generated + 1) if self.has_eos else torch.zeros_like(live)
        uniforms = position_uniforms(self.seed[:rows], pos + 1).float()
        tokens, logprobs = sample_banning(
            out.logits[:, -1],
            self.temperature[:rows],
            self.top_p[:rows],
            uniforms,
            replaying,
            self.ban_tokens,
        )
        index = self.cache.row_index[:rows]
        at = generated.clamp(max=self.max_len - 1)
        self.tokens[index, at] = tokens
        self.logprobs[index, at] = logprobs
        count = generated + 1
        stop = (tokens[:, None] == self.stops[:rows]).any(dim=-1)
        replays = replay_len >= 0
        finished = (replays & (count >= replay_len)) | (~replays & stop) | (count >= self.max_new[:rows])
        self.done[:rows] = live & finished
        advance = live.long()
        self.last_token[:rows] = torch.where(live, tokens, self.last_token[:rows])
        self.generated[:rows] += advance
        self.position[:rows] += advance

    def _capture(self, rows: int, view: int) -> torch.cuda.CUDAGraph | None:
        """Capture the step for (rows, view); ``None`` (and eager decoding from then on) if that fails."""
        mutable = (self.last_token, self.position, self.generated, self.done)
        saved = [t.clone() for t in mutable]
        try:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            # a warm-up run first (lazy initialisation, allocator), on a side stream as torch advises;
            # it writes the same KV and tokens the real step will, and the counters are restored
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side), torch.inference_mode():
                self._step(rows, view)
            torch.cuda.current_stream(self.device).wait_stream(side)
            for tensor, value in zip(mutable, saved, strict=True):
                tensor.copy_(value)
            graph = torch.cuda.CUDAGraph()
            with (
                torch.inference_mode(),
                torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"),
            ):
                self._step(rows, view)
        except Exception as exc:  # an op that cannot be captured: decode eagerly, say so once
            for tensor, value in zip(mutable, saved, strict=True):
                tensor.copy_(value)
            self.graph_error = f"{type(exc).__name__}: {exc}"
            log.warning("hf engine: CUDA graph capture failed, decoding eagerly (%s)", self.graph_error)
            return None
        self._graphs[(rows, view)] = graph
        return graph

    @property
    def graphs_captured(self) -> int:
        return len(self._graphs)
