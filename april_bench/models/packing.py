"""Sequences packed end to end instead of padded to the longest: the same logits for a fraction of the work.

A batch of rows padded to its longest row computes every pad position: on the embedded default's
heavy-tailed lengths (a few long answers, most short) that is two thirds of a warm-start batch and
four fifths of a training batch.  Packing puts the rows one after another in lanes as wide as the
longest row (first fit, longest first) and restarts the position ids at each row.  A ``transformers``
model given ``position_ids`` and no attention mask (and no cache: ``use_cache=False``) reads the
restarts as sequence boundaries and attends only within each row (``masking_utils``'s packed-sequence
mask, transformers >= 4.56), and rotary embeddings see each row's own positions, so every row's logits
are those of the padded batch (``tests/test_packing.py`` compares them).  A lane's unused tail is one
more "row" of pad ids that nothing reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["Packed", "pack_lanes", "pack_rows"]


def pack_lanes(lengths: Sequence[int], width: int) -> list[list[int]]:
    """Row indices in lanes of at most ``width`` tokens: first fit, longest first (ties in input order)."""
    if any(n > width for n in lengths):
        raise ValueError(f"a row is longer than the lane width {width}")
    lanes: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        need = lengths[index]
        for lane, free in enumerate(room):
            if free >= need:
                lanes[lane].append(index)
                room[lane] -= need
                break
        else:
            lanes.append([index])
            room.append(width - need)
    return lanes


@dataclass(frozen=True, slots=True)
class Packed:
    """Packed rows: ``ids`` and ``positions`` ``[lanes, width]``; ``start[r]`` is the flat index (into
    ``ids.view(-1)``) of row ``r``'s first token, so row ``r``'s token ``j`` sits at ``start[r] + j``."""

    ids: torch.Tensor
    positions: torch.Tensor
    start: torch.Tensor

    def flat_index(self, width: int) -> torch.Tensor:
        """``[rows, width]`` flat indices of each row's first ``width`` tokens (where the row has them)."""
        steps = torch.arange(width, device=self.start.device)
        return self.start[:, None] + steps[None, :]


def pack_rows(rows: Sequence[Sequence[int]] | torch.Tensor, lengths: Sequence[int], *, pad_id: int) -> Packed:
    """Pack the first ``lengths[r]`` tokens of each row of ``rows`` (lists or a ``[rows, L]`` tensor)
    into lanes as wide as the longest row."""
    width = max(lengths, default=1)
    lanes = pack_lanes(lengths, width)
    ids = torch.full((len(lanes), width), pad_id, dtype=torch.long)
    positions = torch.empty((len(lanes), width), dtype=torch.long)
    start = torch.empty(len(lengths), dtype=torch.long)
    table = rows if isinstance(rows, torch.Tensor) else None
    if table is not None:
        table = table.cpu()
    for lane, members in enumerate(lanes):
        offset = 0
        for index in members:
            n = lengths[index]
            tokens = (
                table[index, :n] if table is not None else torch.as_tensor(rows[index][:n], dtype=torch.long)
            )
            ids[lane, offset : offset + n] = tokens
            positions[lane, offset : offset + n] = torch.arange(n)
            start[index] = lane * width + offset
            offset += n
        positions[lane, offset:] = torch.arange(width - offset)  # the tail: a pad "row" of its own
    device = rows.device if isinstance(rows, torch.Tensor) else torch.device("cpu")
    return Packed(ids=ids.to(device), positions=positions.to(device), start=start.to(device))
