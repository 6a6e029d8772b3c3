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

Two forwards run inside the step:

* ``static``: the ``transformers`` model itself and the sorted sampler.  Tokens
  and log-probs are bit-identical to the eager path's for the same seeds
  (``sample_banning`` and ``position_uniforms`` are ``sample`` and
  ``position_uniform`` as tensor operations); ``tests/test_hf_static.py`` checks it.
* ``fused``: :class:`~april_bench.engines.hf.fused.FusedQwen` (merged products,
  fused norms, rotary with the KV store, attention over each row's own keys)
  and the sort-free sampler.  Its attention needs no padded KV view, so on CUDA
  there is one graph per batch bucket (and sampler kind), all captured by
  :meth:`StaticDecoder.capture_all` when the engine starts.  It agrees with the
  eager path within float tolerance (logits, greedy tokens) and in distribution
  (sampled tokens); ``tests/test_hf_fused.py`` states the tolerances.

Per-slot state is two matrices (int64: last token, position, counters, seed,
live flag, stop ids, generated tokens; float32: temperature, top-p, log-probs),
so admitting sequences is one host-to-device copy per matrix and moving
finished sequences' slots is one gather and one scatter per matrix
(:meth:`StaticDecoder.move_many`), whatever the number of sequences.

A step's ``done`` flags are copied to pinned host memory behind the step
(:meth:`StaticDecoder.launch`) and read when the host asks
(:meth:`StaticDecoder.finished`), so the engine can launch step t+1 before it
reads step t's flags: a row that finished at step t is padding at step t+1 (the
step clears its live flag), so the late read loses nothing.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from april_bench.engines.hf.cache import SlotKVCache, device_ints
from april_bench.engines.hf.sampling import position_uniforms, sample_banning, sample_sort_free, seed_bits

if TYPE_CHECKING:
    from april_bench.engines.hf.fused import FusedQwen

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


#: Columns of the int64 state matrix before the stop ids and the generated tokens.
_LAST, _POSITION, _GENERATED, _REPLAY_LEN, _MAX_NEW, _SEED, _LIVE = range(7)
_INT_COLUMNS = 7
#: Columns of the float32 state matrix before the log-probs.
_TEMPERATURE, _TOP_P = range(2)
_FLOAT_COLUMNS = 2


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
        fused: FusedQwen | None = None,
    ) -> None:
        self.model = model
        self.cache = cache
        self.fused = fused
        self.device = cache.row_index.device
        slots, max_len = cache.slots, cache.max_len
        self.max_len = max_len
        self.stop_width = len(eos) + EXTRA_STOPS
        self.ints = torch.zeros(
            slots, _INT_COLUMNS + self.stop_width + max_len, dtype=torch.long, device=self.device
        )
        self.floats = torch.zeros(slots, _FLOAT_COLUMNS + max_len, dtype=torch.float32, device=self.device)
        # named views of the two matrices (columns: strided, which elementwise kernels take as they are)
        self.last_token = self.ints[:, _LAST]
        self.position = self.ints[:, _POSITION]
        self.generated = self.ints[:, _GENERATED]
        self.replay_len = self.ints[:, _REPLAY_LEN]  # -1: no replayed length
        self.max_new = self.ints[:, _MAX_NEW]
        self.seed = self.ints[:, _SEED]
        self.live = self.ints[:, _LIVE]  # 1: a sequence decodes in this slot; 0: padding
        self.stops = self.ints[:, _INT_COLUMNS : _INT_COLUMNS + self.stop_width]
        self.tokens = self.ints[:, _INT_COLUMNS + self.stop_width :]
        # float32, as the eager path's torch.tensor([python floats]) makes them
        self.temperature = self.floats[:, _TEMPERATURE]
        self.top_p = self.floats[:, _TOP_P]
        self.logprobs = self.floats[:, _FLOAT_COLUMNS:]
        self.done = torch.zeros(slots, dtype=torch.bool, device=self.device)
        vocab = model.get_output_embeddings().weight.shape[0]
        self.ban_tokens = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        if eos:
            self.ban_tokens[sorted(eos)] = True
        self.has_eos = bool(eos)
        self.span = torch.arange(max_len, device=self.device)
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        #: Pad batches to buckets (what graphs need); eager CPU decoding runs exact shapes.
        self.pad_to_buckets = self.use_graphs
        self.batch_buckets = batch_buckets(min(max_graph_batch, slots))
        self.kv_buckets = kv_buckets(max_len)
        #: The fused forward's Triton attention reads each row's own keys: no KV view, one graph per batch.
        self.needs_view = fused is None or not getattr(fused.ops, "reads_own_keys", False)
        self.graph_error: str | None = None
        self._graphs: dict[tuple[int, int, bool], torch.cuda.CUDAGraph] = {}
        self._pool: Any = None
        self._inflight: deque[tuple[torch.Tensor, torch.cuda.Event | None]] = deque()
        self._read_event: torch.cuda.Event | None = None
        self._side: torch.cuda.Stream | None = None

    def _side_stream(self) -> torch.cuda.Stream:
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        return self._side

    # ------------------------------------------------------------ slot state (host -> device)
    def admit(self, admissions: Sequence[Admission]) -> None:
        """Load sequences into their slots: one host-to-device copy and one scatter per state matrix."""
        if not admissions:
            return
        ints = torch.zeros(len(admissions), self.ints.shape[1], dtype=torch.long)
        floats = torch.zeros(len(admissions), self.floats.shape[1], dtype=torch.float32)
        for i, a in enumerate(admissions):
            stops = sorted(a.stops) + [-1] * (self.stop_width - len(a.stops))
            ints[i, :_INT_COLUMNS] = torch.tensor(
                [
                    a.tokens[-1],
                    a.position,
                    len(a.tokens),
                    -1 if a.replay_len is None else a.replay_len,
                    a.max_new_tokens,
                    seed_bits(a.seed),
                    1,
                ]
            )
            ints[i, _INT_COLUMNS : _INT_COLUMNS + self.stop_width] = torch.tensor(stops)
            ints[i, _INT_COLUMNS + self.stop_width : _INT_COLUMNS + self.stop_width + len(a.tokens)] = (
                torch.tensor(list(a.tokens))
            )
            floats[i, _TEMPERATURE] = a.temperature
            floats[i, _TOP_P] = a.top_p
            floats[i, _FLOAT_COLUMNS : _FLOAT_COLUMNS + len(a.logprobs)] = torch.tensor(
                list(a.logprobs), dtype=torch.float32
            )
        slots = device_ints([a.slot for a in admissions], self.device)
        cuda = self.device.type == "cuda"
        self.ints[slots] = (ints.pin_memory() if cuda else ints).to(self.device, non_blocking=cuda)
        self.floats[slots] = (floats.pin_memory() if cuda else floats).to(self.device, non_blocking=cuda)

    def move(self, src: int, dst: int) -> None:
        """Slot ``src``'s state into slot ``dst`` (the KV cache moves separately)."""
        self.move_many([src], [dst])

    def move_many(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Slots ``src[i]``' state into slots ``dst[i]``: one gather and one scatter per state matrix."""
        if not src:
            return
        index = device_ints([*src, *dst], self.device)
        source, target = index[: len(src)], index[len(src) :]
        self.ints[target] = self.ints[source]
        self.floats[target] = self.floats[source]

    def clear(self, slot: int) -> None:
        """Free ``slot``: a padding row from now on (position 0, never finishes)."""
        self.clear_many([slot])

    def clear_many(self, slots: Sequence[int]) -> None:
        """Free ``slots`` (one scatter)."""
        if not slots:
            return
        index = device_ints([*slots, _LIVE, _POSITION, _GENERATED], self.device)
        rows, columns = index[: len(slots)], index[len(slots) :]
        self.ints[rows[:, None], columns[None, :]] = 0

    def pull(
        self, slots: Sequence[int], counts: Sequence[int], *, behind_read: bool = False
    ) -> list[tuple[list[int], list[float]]]:
        """The first ``counts[i]`` tokens and log-probs of ``slots[i]``, in one device-to-host copy.

        ``behind_read``: the tokens are final once the step last read by :meth:`finished` ran (sequences
        that finished in it), so on CUDA the copy waits for that step only, on a side stream, not for a
        step launched after it."""
        width = max(counts)
        event = self._read_event if behind_read else None
        if event is None:
            index = device_ints(slots, self.device)
            both = torch.stack(
                [self.tokens[index, :width].double(), self.logprobs[index, :width].double()]
            ).cpu()
        else:
            side = self._side_stream()
            side.wait_event(event)
            with torch.cuda.stream(side):
                index = device_ints(slots, self.device)
                gathered = torch.stack(
                    [self.tokens[index, :width].double(), self.logprobs[index, :width].double()]
                )
                both = torch.empty(gathered.shape, dtype=gathered.dtype, pin_memory=True)
                both.copy_(gathered, non_blocking=True)
            side.synchronize()
        return [
            ([int(t) for t in both[0, i, :n].tolist()], both[1, i, :n].tolist()) for i, n in enumerate(counts)
        ]

    # ------------------------------------------------------------ the step
    def step(self, batch: int, kv_len: int, *, nucleus: bool = True) -> tuple[list[int], bool]:
        """:meth:`launch` then :meth:`finished`: the rows that finished and whether a graph was captured."""
        captured = self.launch(batch, kv_len, nucleus=nucleus)
        return self.finished(), captured

    def launch(self, batch: int, kv_len: int, *, nucleus: bool = True) -> bool:
        """Start decoding rows ``0 .. batch`` once (KV positions below ``kv_len``) and the copy of their
        ``done`` flags to the host; returns whether a graph was captured for this step (its time is not
        a step's time).  ``nucleus=False`` promises every live row has top_p = 1 (the fused path then
        samples without the top-p threshold)."""
        rows, view = batch, kv_len
        if self.pad_to_buckets:
            rows = _bucket(batch, self.batch_buckets) or batch
            view = _bucket(kv_len, self.kv_buckets) or self.max_len
        if not self.needs_view:
            view = self.max_len
        nucleus = nucleus or self.fused is None  # the sorted sampler has one kind
        captured = False
        graph = None
        if self.use_graphs and self.graph_error is None and rows in self.batch_buckets:
            graph = self._graphs.get((rows, view, nucleus))
            if graph is None:
                graph = self._capture(rows, view, nucleus)
                captured = graph is not None
        with torch.inference_mode():
            if graph is not None:
                graph.replay()
            else:
                self._step(rows, view, nucleus)
            if self.device.type == "cuda":
                host = torch.empty(batch, dtype=torch.bool, pin_memory=True)
                host.copy_(self.done[:batch], non_blocking=True)
                event = torch.cuda.Event()
                event.record()
                self._inflight.append((host, event))
            else:
                self._inflight.append((self.done[:batch].clone(), None))
        return captured

    def finished(self) -> list[int]:
        """The rows that finished in the oldest launched step not yet read (waits for that step only)."""
        done, event = self._inflight.popleft()
        if event is not None:
            event.synchronize()
        self._read_event = event
        return done.nonzero().flatten().tolist() if bool(done.any()) else []

    def _step(self, rows: int, view: int, nucleus: bool) -> None:
        """One decode step as device operations only (what a graph captures)."""
        pos = self.position[:rows]
        live = self.live[:rows] != 0
        generated = self.generated[:rows]
        replay_len = self.replay_len[:rows]
        if self.fused is not None:
            # a finished row rides along as padding until the host reads its flag: keep its write in bounds
            logits = self.fused.decode(self.last_token[:rows], pos.clamp(max=self.max_len - 1), view=view)
        else:
            self.cache.bind_static_decode(rows, pos, view)
            visible = (self.span[:view][None, :] <= pos[:, None])[:, None, None, :]
            logits = self.model(
                input_ids=self.last_token[:rows, None],
                position_ids=pos[:, None],
                attention_mask=visible,
                past_key_values=self.cache,
                use_cache=True,
            ).logits[:, -1]
        # as the eager path: EOS is banned while a replayed length is not yet reached (if there is an EOS)
        replaying = live & (replay_len > generated + 1) if self.has_eos else torch.zeros_like(live)
        uniforms = position_uniforms(self.seed[:rows], pos + 1).float()
        if self.fused is not None:
            tokens, logprobs = sample_sort_free(
                logits,
                self.temperature[:rows],
                self.top_p[:rows],
                uniforms,
                replaying,
                self.ban_tokens,
                nucleus=nucleus,
                threshold=self.fused.ops.top_p_threshold,
            )
        else:
            tokens, logprobs = sample_banning(
                logits, self.temperature[:rows], self.top_p[:rows], uniforms, replaying, self.ban_tokens
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
        self.live[:rows] = (live & ~finished).long()  # a finished row is padding from the next step on

    def capture_all(self) -> int:
        """Capture every batch bucket's graph now (both sampler kinds on the fused path), so no capture
        lands in the middle of a rollout; returns how many were captured.  Needs the fused Triton forward
        (one graph per batch, whatever the KV length) and no live sequence."""
        if not self.use_graphs or self.needs_view:
            return 0
        kinds = (False, True) if self.fused is not None else (True,)
        for rows in self.batch_buckets:
            for nucleus in kinds:
                if self.graph_error is None and (rows, self.max_len, nucleus) not in self._graphs:
                    self._capture(rows, self.max_len, nucleus)
        torch.cuda.synchronize(self.device)
        return len(self._graphs)

    def _capture(self, rows: int, view: int, nucleus: bool) -> torch.cuda.CUDAGraph | None:
        """Capture the step for (rows, view); ``None`` (and eager decoding from then on) if that fails."""
        saved = self.ints[:rows].clone(), self.done.clone()

        def restore() -> None:
            self.ints[:rows].copy_(saved[0])
            self.done.copy_(saved[1])

        try:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            # a warm-up run first (lazy initialisation, Triton compilation, allocator), on a side stream as
            # torch advises; it writes the same KV and tokens the real step will; the counters are restored
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side), torch.inference_mode():
                self._step(rows, view, nucleus)
            torch.cuda.current_stream(self.device).wait_stream(side)
            restore()
            graph = torch.cuda.CUDAGraph()
            with (
                torch.inference_mode(),
                torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"),
            ):
                self._step(rows, view, nucleus)
        except Exception as exc:  # an op that cannot be captured: decode eagerly, say so once
            restore()
            self.graph_error = f"{type(exc).__name__}: {exc}"
            log.warning("hf engine: CUDA graph capture failed, decoding eagerly (%s)", self.graph_error)
            return None
        self._graphs[(rows, view, nucleus)] = graph
        return graph

    @property
    def graphs_captured(self) -> int:
        return len(self._graphs)
