"""Rows packed end to end (models/packing.py) give the padded batch's numbers: the warm start's loss,
the trainer's log-probs and gradients, and the on-policy step that takes the old log-probs from its own
forward; a group's prompt computed once for all its responses gives them too."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from april_bench.models.packing import SharedPacked, pack_lanes, pack_rows, pack_shared
from april_bench.models.zoo import build_model
from april_bench.tasks.synthetic import CharTokenizer, SyntheticTask
from april_bench.tasks.warmstart import WarmStart
from april_bench.trainers.logprobs import packed_token_logprobs, token_logprobs
from april_bench.trainers.torch_trainer import TorchTrainer
from april_bench.types import FinishReason, Group, Prompt, Segment

VOCAB = 17


def test_lanes_take_the_longest_first_and_fill_the_first_lane_with_room() -> None:
    assert pack_lanes([3, 9, 4, 9, 2, 6], 9) == [[1], [3], [5, 0], [2, 4]]
    with pytest.raises(ValueError, match="longer than the lane width"):
        pack_lanes([3, 10], 9)


def test_packed_rows_restart_positions_and_point_at_each_rows_tokens() -> None:
    packed = pack_rows([[5, 6, 7], [8, 9], [4]], [3, 2, 1], pad_id=0)
    assert packed.ids.tolist() == [[5, 6, 7], [8, 9, 4]]
    assert packed.positions.tolist() == [[0, 1, 2], [0, 1, 0]]
    assert packed.start.tolist() == [0, 3, 5]
    flat = packed.ids.view(-1)
    assert flat[packed.flat_index(2)[1]].tolist() == [8, 9]
    tail = pack_rows(torch.tensor([[5, 6, 7], [8, 0, 0]]), [3, 1], pad_id=0)
    assert tail.positions.tolist() == [[0, 1, 2], [0, 0, 1]]  # the unused tail restarts too


def test_a_packed_batch_has_the_padded_batchs_logits() -> None:
    model = build_model("tiny", vocab_size=VOCAB)
    rows = [[1, 5, 6, 7, 8, 9, 10], [1, 11, 12], [1, 5, 13, 14, 2], [1, 9]]
    lengths = [len(r) for r in rows]
    padded = torch.zeros(len(rows), max(lengths), dtype=torch.long)
    for i, r in enumerate(rows):
        padded[i, : len(r)] = torch.tensor(r)
    packed = pack_rows(rows, lengths, pad_id=0)
    assert packed.ids.shape[0] < len(rows)  # rows do share a lane
    with torch.no_grad():
        plain = model(input_ids=padded).logits
        logits = model(input_ids=packed.ids, position_ids=packed.positions, use_cache=False).logits
    flat = logits.reshape(-1, VOCAB)
    for i, n in enumerate(lengths):
        torch.testing.assert_close(
            flat[packed.start[i] : packed.start[i] + n], plain[i, :n], rtol=1e-5, atol=1e-5
        )


def test_the_warm_starts_packed_batch_has_the_padded_batchs_loss() -> None:
    task = SyntheticTask.Config().build()
    warm = WarmStart.Config(batch_size=16).build(task=task)
    ids, positions, targets = warm._batch(random.Random(3))
    rng = random.Random(3)  # the same draws, padded by hand
    rows = []
    for _ in range(16):
        p = task.draw("sft", rng.randrange(1 << 30))
        rows.append((task.prompt_ids(p), task.solution_ids(p)))
    width = max(len(a) + len(b) for a, b in rows)
    padded = torch.full((16, width), CharTokenizer.PAD)
    padded_targets = torch.full((16, width - 1), -100)
    for i, (prompt, solution) in enumerate(rows):
        padded[i, : len(prompt) + len(solution)] = torch.tensor(prompt + solution)
        padded_targets[i, len(prompt) - 1 : len(prompt) + len(solution) - 1] = torch.tensor(solution)
    assert int((targets != -100).sum()) == int((padded_targets != -100).sum())
    assert ids.numel() < padded.numel()
    model = build_model("tiny", vocab_size=task.tokenizer.vocab_size)

    def loss(logits: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1))

    with torch.no_grad():
        plain = loss(model(input_ids=padded).logits[:, :-1], padded_targets)
        packed = loss(model(input_ids=ids, position_ids=positions, use_cache=False).logits[:, :-1], targets)
    assert float(packed) == pytest.approx(float(plain), rel=1e-5)


def test_packed_log_probs_and_their_gradients_are_the_padded_ones() -> None:
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=VOCAB).train()
    ids = torch.tensor([[1, 5, 6, 7, 8, 9], [1, 5, 6, 7, 2, 0], [1, 11, 0, 0, 0, 0]])
    lengths = [6, 5, 2]
    attention = (torch.arange(6)[None, :] < torch.tensor(lengths)[:, None]).long()
    select = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 0], [1, 0, 0, 0, 0]]) != 0
    results = []
    for packed in (False, True):
        model.zero_grad()
        if packed:
            logp, entropy = packed_token_logprobs(
                model, ids, lengths, select, pad_token_id=0, with_entropy=True
            )
        else:
            logp, entropy = token_logprobs(model, ids, attention, with_entropy=True, positions=select)
        (logp * torch.arange(1.0, 6.0)).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logp.detach(), entropy, grads))
    (plain, plain_entropy, plain_grads), (packed, packed_entropy, packed_grads) = results
    torch.testing.assert_close(packed, plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(packed_entropy, plain_entropy, rtol=1e-5, atol=1e-6)
    assert (packed[~select] == 0).all()
    assert packed_grads.keys() == plain_grads.keys()
    for name, grad in plain_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-4, atol=1e-6)


#: Two groups sharing a 3-token prompt (one needs two lane segments), one row sharing nothing.
SHARED_ROWS = [
    [1, 5, 6, 7, 8],
    [1, 5, 6, 9, 10, 11, 12],
    [1, 5, 6, 2],
    [1, 7, 7, 3, 4, 5],
    [1, 7, 7, 8],
    [1, 9] + [9] * 6,
]
SHARED_PREFIXES = [3, 3, 3, 3, 3, 0]
SHARED_GROUPS = [0, 0, 0, 1, 1, 2]


def _padded(rows: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
    lengths = [len(r) for r in rows]
    ids = torch.zeros(len(rows), max(lengths), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    return ids, lengths


def test_a_shared_prompt_is_packed_once_per_segment_and_each_response_sees_only_it_and_itself() -> None:
    ids, lengths = _padded(SHARED_ROWS)
    shared = pack_shared(ids, lengths, SHARED_PREFIXES, SHARED_GROUPS, pad_id=0)
    # longest suffix first, into the first lane with room (for the suffix alone beside its group's
    # prompt): group 0's suffixes 4 and 1 share a lane, its 2 gets a lane and a prompt of its own
    assert shared.ids.tolist() == [
        [1, 9, 9, 9, 9, 9, 9, 9],
        [1, 5, 6, 9, 10, 11, 12, 2],
        [1, 7, 7, 3, 4, 5, 8, 0],
        [1, 5, 6, 7, 8, 0, 0, 0],
    ]
    assert shared.positions[2].tolist() == [0, 1, 2, 3, 4, 5, 3, 0]  # each response continues the prompt
    flat = shared.ids.view(-1)
    for r, row in enumerate(SHARED_ROWS):
        assert flat[shared.index[r, : len(row)]].tolist() == row
    mask = shared.mask[2, 0]  # lane 2: prompt 0-2, response [3, 4, 5] at 3-5, response [8] at 6, a pad
    assert mask[5].tolist() == [True] * 6 + [False] * 2
    assert mask[6].tolist() == [True, True, True, False, False, False, True, False]  # not its sibling
    assert mask[7].tolist() == [False] * 7 + [True]  # a pad sees itself only (no empty softmax)
    other = ids.clone()
    other[1, 2] = 4  # group 0's rows are not one prompt after all: packed whole, each with its own
    apart = pack_shared(other, lengths, SHARED_PREFIXES, SHARED_GROUPS, pad_id=0)
    flat = apart.ids.view(-1)
    for r, n in enumerate(lengths):
        assert flat[apart.index[r, :n]].tolist() == other[r, :n].tolist()
    group0 = {tuple(apart.index[r, :3].tolist()) for r in (0, 1, 2)}
    assert len(group0) == 3  # no prompt shared within group 0
    assert shared.index[1, :3].tolist() == shared.index[2, :3].tolist()  # one copy while the prompts agreed


def test_shared_prompt_log_probs_and_gradients_are_the_padded_ones() -> None:
    """The shared prompt's gradient is the sum of what each row's own copy gets: the same numbers."""
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=VOCAB).train()
    ids, lengths = _padded(SHARED_ROWS)
    attention = (torch.arange(ids.shape[1])[None, :] < torch.tensor(lengths)[:, None]).long()
    select = torch.zeros(len(lengths), ids.shape[1] - 1, dtype=torch.bool)
    for r, (n, prefix) in enumerate(zip(lengths, SHARED_PREFIXES, strict=True)):
        select[r, max(prefix - 1, 0) : n - 1] = True  # the responses' targets, as the trainer's mask
    results = []
    for shared in (False, True):
        model.zero_grad()
        if shared:
            logp, entropy = packed_token_logprobs(
                model,
                ids,
                lengths,
                select,
                pad_token_id=0,
                with_entropy=True,
                prefixes=SHARED_PREFIXES,
                groups=SHARED_GROUPS,
            )
        else:
            logp, entropy = token_logprobs(model, ids, attention, with_entropy=True, positions=select)
        (logp * torch.arange(1.0, ids.shape[1])).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logp.detach(), entropy, grads))
    (plain, plain_entropy, plain_grads), (shared_logp, shared_entropy, shared_grads) = results
    torch.testing.assert_close(shared_logp, plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shared_entropy, plain_entropy, rtol=1e-5, atol=1e-6)
    assert shared_grads.keys() == plain_grads.keys()
    for name, grad in plain_grads.items():  # float32 sums in another order: 1e-5 of the largest entry
        scale = float(grad.abs().max())
        torch.testing.assert_close(shared_grads[name], grad, rtol=1e-4, atol=1e-5 * scale)


def _batch() -> list[Group]:
    groups = []
    for uid, (responses, rewards) in enumerate(
        [([[7, 8, 9, 10, 11, 12, 13], [7, 2]], [1.0, 0.0]), ([[9, 9], [10, 11, 12]], [0.0, 1.0])]
    ):
        prompt = Prompt(uid=uid, source_id=f"p{uid}", length=3, token_ids=(1, 5, 6))
        group = Group.fresh(prompt, len(responses))
        for sample, ids, reward in zip(group.samples, responses, rewards, strict=True):
            sample.append(
                Segment(f"r{uid}", 0, len(ids), FinishReason.STOP, 0, tuple(ids), tuple(-2.0 for _ in ids))
            )
            sample.reward = reward
        groups.append(group)
    return groups


@pytest.mark.parametrize("mini_batches", [1, 2])
@pytest.mark.parametrize("share_prompts", [False, True])
def test_a_packed_step_has_the_padded_steps_gradients(
    mini_batches: int, share_prompts: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One optimizer step (old log-probs from the training forward) and two (a separate old-policy
    pass): packing, with or without each group's prompt computed once, changes neither the gradients
    of a step nor its metrics.  (The gradients, not the weights after AdamW: its first step divides
    each gradient by its own size.)"""
    import april_bench.models.packing as packing

    shared_calls: list[int] = []
    monkeypatch.setattr(
        packing, "pack_shared", lambda *a, **k: shared_calls.append(1) or pack_shared(*a, **k)
    )
    grads: list[list[dict[str, torch.Tensor]]] = [[], []]
    metrics = []
    for pack in (False, True):
        torch.manual_seed(0)
        trainer = TorchTrainer.Config(
            pack=pack, share_prompts=share_prompts, mini_batches=mini_batches
        ).build(module=build_model("tiny", vocab_size=VOCAB))
        params = dict(trainer.model.named_parameters())

        def record(pack: bool = pack, params: dict[str, torch.nn.Parameter] = params) -> None:
            grads[pack].append({n: p.grad.clone() for n, p in params.items() if p.grad is not None})

        trainer.optimizer.step = record  # type: ignore[method-assign]
        metrics.append(asyncio.run(trainer.train(_batch(), step=0, policy_version=0)).metrics)
    assert len(grads[0]) == len(grads[1]) == mini_batches
    assert len(shared_calls) == (
        mini_batches + (mini_batches > 1) if share_prompts else 0
    )  # + old-policy pass
    for plain, packed in zip(grads[0], grads[1], strict=True):
        assert packed.keys() == plain.keys()
        for name, grad in plain.items():
            torch.testing.assert_close(packed[name], grad, rtol=1e-4, atol=1e-6 * float(grad.abs().max()))
    assert metrics[1].keys() == metrics[0].keys()
    for key, value in metrics[0].items():
        assert metrics[1][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert metrics[0]["engine_logprob_tokens"] == 14  # every response token, from either path


def test_an_on_policy_step_takes_the_old_log_probs_from_its_own_forward() -> None:
    """One mini-batch and one epoch: no separate old-policy pass (the ratio is exactly 1), and the
    engine gap is measured on the same tokens as with the separate pass."""
    torch.manual_seed(0)
    trainer = TorchTrainer.Config(lr=1e-2).build(module=build_model("tiny", vocab_size=VOCAB))
    calls: list[object] = []
    recompute = trainer._recompute
    trainer._recompute = lambda *a: calls.append(a) or recompute(*a)  # type: ignore[method-assign]
    rows = trainer._rows(_batch())
    expected = recompute(trainer.model, rows)
    result = asyncio.run(trainer.train(_batch(), step=0, policy_version=0))
    assert calls == []
    assert result.metrics["clipfrac"] == 0.0
    gap = (expected - rows.behaviour).abs()[rows.mask > 0]
    assert result.metrics["engine_logprob_gap_mean"] == pytest.approx(float(gap.mean()), rel=1e-5)
    assert result.metrics["engine_logprob_gap_max"] == pytest.approx(float(gap.max()), rel=1e-5)


def _loop_pack_shared(
    rows: torch.Tensor, lengths: list[int], prefixes: list[int], groups: list[int], *, pad_id: int
) -> SharedPacked:
    """pack_shared as it was written first, one tensor write per row (33bdf37): the reference the
    vectorized one must reproduce exactly."""
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
        head = table[rs[0], :prefix]
        if any(not torch.equal(table[r, :prefix], head) for r in rs[1:]):
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
    ids = torch.full((len(lanes), width), pad_id, dtype=torch.long)
    positions = torch.zeros((len(lanes), width), dtype=torch.long)
    # tokens attend within one segment (seg) and, past the prefix, within one branch (0: the prefix)
    seg = torch.empty((len(lanes), width), dtype=torch.long)
    branch = torch.ones((len(lanes), width), dtype=torch.long)
    index = torch.zeros((count, width), dtype=torch.long)
    label = 0
    for lane, segments in enumerate(lanes):
        offset = 0
        flat = lane * width
        for rs in segments.values():
            prefix = share[rs[0]]
            size = prefix + sum(lengths[r] - prefix for r in rs)
            seg[lane, offset : offset + size] = label
            label += 1
            if prefix:
                ids[lane, offset : offset + prefix] = table[rs[0], :prefix]
                positions[lane, offset : offset + prefix] = torch.arange(prefix)
                branch[lane, offset : offset + prefix] = 0
                index[rs, :prefix] = flat + offset + torch.arange(prefix)
                offset += prefix
            for b, r in enumerate(rs):
                n = lengths[r] - prefix
                ids[lane, offset : offset + n] = table[r, prefix : lengths[r]]
                positions[lane, offset : offset + n] = torch.arange(prefix, lengths[r])
                branch[lane, offset : offset + n] = b + 1 if prefix else 0
                index[r, prefix : lengths[r]] = flat + offset + torch.arange(n)
                offset += n
        tail = width - offset  # unused: each pad token a segment of its own (it attends to itself)
        seg[lane, offset:] = torch.arange(label, label + tail)
        label += tail
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    same = seg[:, :, None] == seg[:, None, :]
    kin = (branch[:, None, :] == 0) | (branch[:, :, None] == branch[:, None, :])
    mask = (same & kin & causal)[:, None]
    device = rows.device
    return SharedPacked(ids.to(device), positions.to(device), mask.to(device), index.to(device))


@pytest.mark.parametrize("seed", range(6))
def test_the_vectorized_shared_packing_is_the_row_by_row_one(seed: int) -> None:
    """Random groups (shared prompts, a group whose prompts differ, rows without a prompt, single
    rows, a row that is its prompt): the same ids, positions, mask and read-back index, element by
    element."""
    rng = random.Random(seed)
    rows: list[list[int]] = []
    prefixes: list[int] = []
    groups: list[int] = []
    for group in range(rng.randint(1, 9)):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(0, 6))]
        differ = rng.random() < 0.2
        for _ in range(rng.randint(1, 5)):
            head = list(prompt)
            if differ and head:
                head[rng.randrange(len(head))] = rng.randrange(1, VOCAB)
            rows.append(head + [rng.randrange(1, VOCAB) for _ in range(rng.choice([0, 1, 3, 9, 20]))] or [1])
            prefixes.append(len(prompt))
            groups.append(group)
    ids, lengths = _padded(rows)
    got = pack_shared(ids, lengths, prefixes, groups, pad_id=0)
    want = _loop_pack_shared(ids, lengths, prefixes, groups, pad_id=0)
    for name in ("ids", "positions", "mask", "index"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


def _loop_rows(trainer: TorchTrainer, batch: list[Group]) -> tuple[torch.Tensor, ...]:
    """The trainer's row tensors as its _rows wrote them first, one row at a time (33bdf37)."""
    samples = [s for g in batch for s in g.samples]
    width = max(s.prompt.length + s.response_len for s in samples)
    size = (len(samples), width)
    ids = torch.full(size, trainer.config.pad_token_id, dtype=torch.long)
    attention = torch.zeros(size, dtype=torch.long)
    mask = torch.zeros(len(samples), width - 1)
    behaviour = torch.zeros(len(samples), width - 1)
    versions = torch.full((len(samples), width - 1), -1, dtype=torch.long)
    for row, s in enumerate(samples):
        assert s.prompt.token_ids is not None
        prompt, response = s.prompt.length, s.response_len
        ids[row, : prompt + response] = torch.tensor([*s.prompt.token_ids, *s.response_ids()])
        attention[row, : prompt + response] = 1
        span = slice(prompt - 1, prompt - 1 + response)
        mask[row, span] = 1.0 if s.loss_mask is None else torch.tensor(s.loss_mask, dtype=torch.float)
        if response:
            behaviour[row, span] = torch.tensor(s.response_logprobs())
            versions[row, span] = torch.tensor(s.token_versions())
    return ids, attention, mask, behaviour, versions


@pytest.mark.parametrize("seed", range(4))
def test_the_trainers_rows_are_built_as_row_by_row(seed: int) -> None:
    """Rows of several groups: responses of several policy versions, an empty response, an
    episode's loss mask with observation tokens: the same tensors, element by element."""
    rng = random.Random(seed)
    trainer = TorchTrainer.Config(pad_token_id=0).build(module=build_model("tiny", vocab_size=VOCAB))
    batch = []
    for uid in range(rng.randint(1, 5)):
        prompt_ids = tuple(rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 7)))
        group = Group.fresh(
            Prompt(uid=uid, source_id=f"p{uid}", length=len(prompt_ids), token_ids=prompt_ids),
            rng.randint(1, 4),
        )
        for sample in group.samples:
            for version in range(rng.randint(1, 3)):
                n = rng.choice([0, 1, 4, 12])
                ids = tuple(rng.randrange(1, VOCAB) for _ in range(n))
                observation = rng.random() < 0.2
                sample.append(
                    Segment(
                        f"r{uid}",
                        version,
                        n,
                        FinishReason.STOP,
                        0,
                        ids,
                        tuple(-rng.random() for _ in ids),
                        observation=observation,
                    )
                )
            sample.reward = float(rng.random() < 0.5)
        batch.append(group)
    rows = trainer._rows(batch)
    want = _loop_rows(trainer, batch)
    for name, tensor in zip(("ids", "attention", "mask", "behaviour", "versions"), want, strict=True):
        assert torch.equal(getattr(rows, name), tensor), name
    samples = [s for g in batch for s in g.samples]
    assert rows.lengths == [s.prompt.length + s.response_len for s in samples]
    assert rows.prompts == [s.prompt.length for s in samples]
