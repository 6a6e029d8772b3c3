"""The embedded default's training step on this CPU: CPU time per train call and lane tokens, with
each group's prompt shared (``share_prompts``) and without, alternated in one process.

The batches are the synthetic task's own worked answers (16 groups x 8 samples, the embedded
default's shape; each sample a worked answer to its group's prompt, a few tokens longer or shorter),
so the lengths are the task's heavy-tailed ones.  One trainer per setting, both from the same
weights; each round trains every setting on the same batch (``time.process_time``: the process's own
CPU, which the machine's load moves far less than wall time).  ``lanes`` counts the tokens the model
computes (packed lanes x width), ``real`` the rows' own tokens.

    python benchmarks/train_step_cpu.py [--rounds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time

import torch

from april_bench.models.packing import pack_rows, pack_shared
from april_bench.models.zoo import build_model
from april_bench.tasks.synthetic import SyntheticTask
from april_bench.trainers.torch_trainer import TorchTrainer
from april_bench.types import FinishReason, Group, Prompt, Segment


def batch(task: SyntheticTask, seed: int, groups: int = 16, samples: int = 8) -> list[Group]:
    rng = random.Random(seed)
    batch = []
    for uid in range(groups):
        problem = task.draw("rl", rng.randrange(1 << 30))
        prompt_ids, answer = tuple(task.prompt_ids(problem)), task.solution_ids(problem)
        group = Group.fresh(
            Prompt(uid=uid, source_id=f"p{uid}", length=len(prompt_ids), token_ids=prompt_ids), samples
        )
        for sample in group.samples:
            ids = tuple(answer[: max(1, len(answer) + rng.randint(-3, 3))])
            sample.append(
                Segment(f"r{uid}", 0, len(ids), FinishReason.STOP, 0, ids, tuple(-1.0 for _ in ids))
            )
            sample.reward = float(rng.random() < 0.3)
        batch.append(group)
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    task = SyntheticTask.Config().build()
    trainers = {}
    for share in (False, True):
        torch.manual_seed(0)
        model = build_model("tiny", vocab_size=task.tokenizer.vocab_size)
        trainers[share] = TorchTrainer.Config(share_prompts=share).build(module=model)
    times: dict[bool, list[float]] = {False: [], True: []}
    lanes = {False: 0, True: 0}
    real = 0
    for step in range(args.rounds + 1):
        groups = batch(task, step)
        rows = trainers[True]._rows(groups)
        ids = rows.ids[:, : max(rows.lengths)]
        real += sum(rows.lengths) if step else 0
        for share in (step % 2 == 0, step % 2 == 1):  # alternate which goes first
            start = time.process_time()
            asyncio.run(trainers[share].train(groups, step=step, policy_version=step))
            if step:  # round 0 warms both up (the AdamW state, the first allocations)
                times[share].append(time.process_time() - start)
                packed = (
                    pack_shared(ids, rows.lengths, rows.prompts, rows.groups, pad_id=0) if share else None
                )
                lanes[share] += (packed.ids if packed else pack_rows(ids, rows.lengths, pad_id=0).ids).numel()
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} batches of 16 x 8; real tokens {real}")
    for share in (False, True):
        ms = [1000 * t for t in times[share]]
        print(
            f"share_prompts={str(share).lower():5}  median {statistics.median(ms):6.1f} ms CPU a train call "
            f"(range {min(ms):.1f}-{max(ms):.1f}), lane tokens {lanes[share]}"
        )


if __name__ == "__main__":
    main()
