"""A slot KV cache: a ``transformers`` Cache whose batch rows are scheduler slots.

Every slot holds one sequence with its own length.  The scheduler keeps the
active sequences in slots ``0 .. B-1`` (a finished sequence's slot is filled
by moving the last one into it), so a decode step reads the cache through a
*view* ``K[:B, :, :kv_len]`` - no per-step gather or copy.  Before each
forward the engine binds what the model's ``update(key, value, layer)`` calls
mean:

* decode: row ``b`` writes its one new key/value at ``positions[b]``;
* prefill: rows ``start .. start+n`` write ``offset .. offset+length`` (right-padded
  prompts; ``offset`` > 0 for the later chunks of a chunked prefill).

The static decode path binds once per (batch, KV length) bucket: ``positions``
is then a view of a device buffer the step itself advances, and ``kv_len`` a
bucket size, so the same binding serves every replay of a captured CUDA graph.

Attention sees the returned view plus a 4D mask built by the engine, which
marks each row's valid positions; transformers uses a 4D mask as given.  Any
decoder whose attention calls ``past_key_values.update`` works (Llama, Qwen2,
Qwen3, Mistral ...).  The fused decode forward (``fused.py``) reads and writes
the same per-layer tensors directly.

All layers' keys and values live in one tensor ``storage`` [layers, 2, slots,
KV heads, max_len, head dim] (``keys[i]`` and ``values[i]`` are views of it), so
moving finished sequences' slots is one gather and one scatter for every layer
and every moved slot at once (:meth:`SlotKVCache.move_many`), not two copies per
layer per slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

__all__ = ["SlotKVCache", "device_ints"]


def device_ints(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device``.  On CUDA the copy goes through pinned memory without
    blocking the host: a plain ``.to("cuda")`` of pageable memory waits for every queued kernel (here: the
    decode step launched ahead), which would stall the pipeline of :meth:`StaticDecoder.launch`."""
    host = torch.tensor(list(values), dtype=torch.long)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class _SlotLayer(CacheLayerMixin):
    is_compileable = False
    is_sliding = False

    def __init__(self, owner: SlotKVCache, index: int) -> None:
        super().__init__()
        self.owner = owner
        self.index = index
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Storage is allocated up front."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        o = self.owner
        keys, values = o.keys[self.index], o.values[self.index]
        lo, hi = o.rows
        if o.row_ids is not None:  # decode of chosen rows (one weight version's): a gathered view
            keys[o.row_ids, :, o.positions] = key_states[:, :, 0]
            values[o.row_ids, :, o.positions] = value_states[:, :, 0]
            return keys[o.row_ids, :, : o.kv_len], values[o.row_ids, :, : o.kv_len]
        if o.positions is not None:  # decode: one new token per row, each at its own position
            rows = o.row_index[: hi - lo] + lo
            keys[rows, :, o.positions] = key_states[:, :, 0]
            values[rows, :, o.positions] = value_states[:, :, 0]
        else:  # prefill: rows write positions offset .. offset+length
            end = o.offset + key_states.shape[2]
            keys[lo:hi, :, o.offset : end] = key_states
            values[lo:hi, :, o.offset : end] = value_states
        return keys[lo:hi, :, : o.kv_len], values[lo:hi, :, : o.kv_len]

    def get_seq_length(self) -> int:
        return self.owner.kv_len

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.kv_len, 0

    def get_max_length(self) -> int:
        return self.owner.max_len


class SlotKVCache(Cache):
    """``slots`` sequences of up to ``max_len`` tokens, for every layer."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        slots: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_layers, 2, slots, num_kv_heads, max_len, head_dim)
        self.storage = torch.zeros(shape, dtype=dtype, device=device)
        self.keys = [self.storage[i, 0] for i in range(num_layers)]
        self.values = [self.storage[i, 1] for i in range(num_layers)]
        self.slots = slots
        self.max_len = max_len
        self.row_index = torch.arange(slots, device=device)
        self.rows = (0, 0)
        #: Rows of a decode over chosen slots (:meth:`bind_decode_rows`); ``None``: rows ``rows``.
        self.row_ids: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None
        self.kv_len = 0
        self.offset = 0
        super().__init__(layers=[_SlotLayer(self, i) for i in range(num_layers)])

    @classmethod
    def for_model(
        cls, config: Any, *, slots: int, max_len: int, dtype: torch.dtype, device: torch.device
    ) -> SlotKVCache:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            num_layers=config.num_hidden_layers,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            slots=slots,
            max_len=max_len,
            dtype=dtype,
            device=device,
        )

    def bind_decode(self, count: int, positions: torch.Tensor) -> None:
        """The next forward decodes rows ``0 .. count``; row b writes at ``positions[b]``."""
        self.row_ids = None
        self.rows = (0, count)
        self.positions = positions
        self.kv_len = int(positions.max()) + 1

    def bind_static_decode(self, count: int, positions: torch.Tensor, kv_len: int) -> None:
        """As :meth:`bind_decode`, attending to the first ``kv_len`` positions (a bucket at least the
        longest row's; the caller's mask hides the rest) without reading ``positions`` on the host."""
        self.row_ids = None
        self.rows = (0, count)
        self.positions = positions
        self.kv_len = kv_len

    def bind_prefill(self, start: int, count: int, length: int, offset: int = 0) -> None:
        """The next forward prefills rows ``start .. start+count`` with ``length`` (padded) tokens at
        positions ``offset .. offset+length``; attention sees positions ``0 .. offset+length``."""
        self.row_ids = None
        self.rows = (start, start + count)
        self.positions = None
        self.offset = offset
        self.kv_len = offset + length

    def bind_decode_rows(self, rows: torch.Tensor, positions: torch.Tensor) -> None:
        """The next forward decodes the slots ``rows`` (any of them, in this order); row b writes at
        ``positions[b]``.  Attention reads a gathered copy of those rows (the hf engine's decode of
        one weight version's sequences among several)."""
        self.row_ids = rows
        self.rows = (0, len(rows))
        self.positions = positions
        self.kv_len = int(positions.max()) + 1

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into slot ``dst`` (all layers)."""
        self.move_many([src], [dst], length)

    def move_many(self, src: Sequence[int], dst: Sequence[int], length: int) -> None:
        """Copy the first ``length`` positions of slots ``src[i]`` into slots ``dst[i]``, every layer, as
        one gather and one scatter.  No slot may be both a source and a destination."""
        if not src or length <= 0:
            return
        index = device_ints([*src, *dst], self.storage.device)  # one host-to-device copy
        source, target = index[: len(src)], index[len(src) :]
        window = self.storage[:, :, :, :, :length]
        window[:, :, target] = window[:, :, source]
