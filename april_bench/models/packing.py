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

__all__ = ["Packed", "SharedPacked", "pack_lanes", "pack_rows", "pack_shared"]


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


@dataclass(frozen=True, slots=True)
class SharedPacked:
    """Rows packed with each group's shared prefix computed once: ``ids``, ``positions`` ``[lanes,
    width]``, ``mask`` ``[lanes, 1, width, width]`` (bool, True: the query may attend to the key) and
    ``index`` ``[rows, width]``: the flat index (into ``ids.view(-1)``) of row ``r``'s token ``j``,
    which is the group's shared copy for ``j < prefix[r]`` (0 past the row's end)."""

    ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    index: torch.Tensor


def pack_shared(
    rows: torch.Tensor, lengths: Sequence[int], prefixes: Sequence[int], groups: Sequence[int], *, pad_id: int
) -> SharedPacked:
    """Pack the first ``lengths[r]`` tokens of each row of ``rows`` (``[rows, L]``), the rows of one
    ``groups`` key sharing their first ``prefixes[r]`` tokens (a GRPO group's prompt): a lane holds
    segments, each one copy of a prefix followed by some of its group's suffixes, each suffix's
    positions continuing from the prefix's; a suffix attends to the prefix and to itself (causally),
    never to its siblings, so every token sees exactly what it sees in its own row.

    Lanes are as wide as the longest row (attention costs lanes x width^2: a wider lane would share a
    prefix among more suffixes but cost more attention).  Suffixes are placed longest first, each in
    the first lane that has room: for the suffix alone where the lane already holds its group's prefix,
    else for a new copy of the prefix and the suffix (so a group spread over several lanes has a copy
    in each).  Rows whose prefix is 0 (or the whole row), or alone in their group, are packed whole,
    as are a group's rows whose prefixes differ in any token.
    """
    table = rows.cpu()
    count = len(lengths)
    width = max(lengths, default=1)
    members: dict[int, list[int]] = {}
    for r in range(count):
        members.setdefault(groups[r], []).append(r)
    share = [0] * count  # the prefix each row shares (0: packed whole)
    for rs in members.values():
        prefix = prefixes[rs[0]]
        if len(rs) == 1 or prefix <= 0 or any(prefixes[r] != prefix or lengths[r] <= prefix for r in rs):
            continue
        if not bool((table[rs, :prefix] == table[rs[0], :prefix]).all()):
            continue  # not one prompt after all: each row keeps its own
        for r in rs:
            share[r] = prefix
    # lanes: each a dict segment key -> rows (insertion ordered); a shared group's key is its group
    lanes: list[dict[tuple[int, int], list[int]]] = []
    room: list[int] = []
    for r in sorted(range(count), key=lambda i: -(lengths[i] - share[i])):
        key = (0, groups[r]) if share[r] else (1, r)
        for lane, free in enumerate(room):
            need = lengths[r] - share[r] if key in lanes[lane] else lengths[r]
            if free >= need:
                lanes[lane].setdefault(key, []).append(r)
                room[lane] -= need
                break
        else:
            lanes.append({key: [r]})
            room.append(width - lengths[r])
    # Each placed run of tokens (a piece: a prefix copy, or a row's own tokens) is one entry here, and
    # the token-level tensors are filled from them in a few vectorized steps (a loop of tensor writes
    # per row cost about as much as the model's forward on the embedded default).  A piece: its source
    # row and first column, its length, the flat index (into ids.view(-1)) of its first token, its
    # segment and its branch (tokens attend within one segment and, past the prefix, within one
    # branch; 0: the prefix).  ``reads``: where each row's tokens are read back, (row, first column,
    # length, flat index of the first).
    pieces: list[tuple[int, int, int, int, int, int]] = []
    reads: list[tuple[int, int, int, int]] = []
    segment = 0
    for lane, segments in enumerate(lanes):
        offset = lane * width
        for rs in segments.values():
            prefix = share[rs[0]]
            if prefix:
                pieces.append((rs[0], 0, prefix, offset, segment, 0))
                reads.extend((r, 0, prefix, offset) for r in rs)
                offset += prefix
            for b, r in enumerate(rs):
                n = lengths[r] - prefix
                pieces.append((r, prefix, n, offset, segment, b + 1 if prefix else 0))
                reads.append((r, prefix, n, offset))
                offset += n
            segment += 1
    src_row, src_col, size, dest, label, branch_of = torch.tensor(pieces, dtype=torch.long).view(-1, 6).T
    within = _within(size)
    at = dest.repeat_interleave(size) + within
    col = src_col.repeat_interleave(size) + within
    cells = len(lanes) * width
    ids = torch.full((cells,), pad_id, dtype=torch.long)
    ids[at] = table[src_row.repeat_interleave(size), col]
    positions = torch.zeros(cells, dtype=torch.long)
    positions[at] = col  # a suffix's positions continue its prefix's
    seg = -1 - torch.arange(cells)  # an unused cell: a pad token, a segment of its own (it sees itself)
    seg[at] = label.repeat_interleave(size)
    branch = torch.ones(cells, dtype=torch.long)
    branch[at] = branch_of.repeat_interleave(size)
    row, first, size, dest = torch.tensor(reads, dtype=torch.long).view(-1, 4).T
    within = _within(size)
    index = torch.zeros(count * width, dtype=torch.long)
    index[(row * width + first).repeat_interleave(size) + within] = dest.repeat_interleave(size) + within
    lanes_of = (len(lanes), width)
    ids, positions, seg, branch = (
        ids.view(lanes_of),
        positions.view(lanes_of),
        seg.view(lanes_of),
        branch.view(lanes_of),
    )
    index = index.view(count, width)
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    same = seg[:, :, None] == seg[:, None, :]
    kin = (branch[:, None, :] == 0) | (branch[:, :, None] == branch[:, None, :])
    mask = (same & kin & causal)[:, None]
    device = rows.device
    return SharedPacked(ids.to(device), positions.to(device), mask.to(device), index.to(device))


def _within(sizes: torch.Tensor) -> torch.Tensor:
    """``0 .. sizes[i] - 1`` for each ``i``, concatenated."""
    starts = sizes.cumsum(0) - sizes
    return torch.arange(int(sizes.sum())) - starts.repeat_interleave(sizes)
