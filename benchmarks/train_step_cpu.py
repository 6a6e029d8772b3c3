"""The embedded default's training step on this CPU: CPU time per train call and lane tokens, in four
settings alternated in one process: each group's prompt packed with every sample (``share_prompts``
off), shared, and shared with the rows of advantage 0 run forward only or not computed
(``zero_advantage=forward`` and ``skip``, the default; the first two settings train them).

The batches are the synthetic task's own worked answers (16 groups x 8 samples, the embedded
default's shape; each sample a worked answer to its group's prompt, a few tokens longer or shorter),
so the lengths are the task's heavy-tailed ones.  Rewards: a group is unsolved (all 0, advantage 0)
with probability ``--unsolved`` (0.5: in the main job's sync arm 49% of the groups had rewards all
equal), else each sample is right with probability 0.3.  One trainer per setting, all from the same
weights; each round trains every setting on the same batch, in a rotating order
(``time.process_time``: the process's own CPU, which the machine's load moves far less than wall
time).  ``lanes`` counts the tokens the model computes with grad (packed lanes x width), ``real``
the rows' own tokens.

    python benchmarks/train_step_cpu.py [--rounds 8] [--unsolved 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from typing import Any

import torch

from april_bench.models.packing import pack_rows, pack_shared
from april_bench.models.zoo import build_model
from april_bench.tasks.synthetic import SyntheticTask
from april_bench.trainers.torch_trainer import TorchTrainer
from april_bench.types import FinishReason, Group, Prompt, Segment


def batch(
    task: SyntheticTask, seed: int, groups: int = 16, samples: int = 8, unsolved: float = 0.5
) -> list[Group]:
    rng = random.Random(seed)
    batch = []
    for uid in range(groups):
        problem = task.draw("rl", rng.randrange(1 << 30))
        prompt_ids, answer = tuple(task.prompt_ids(problem)), task.solution_ids(problem)
        group = Group.fresh(
            Prompt(uid=uid, source_id=f"p{uid}", length=len(prompt_ids), token_ids=prompt_ids), samples
        )
        solve = 0.0 if unsolved and rng.random() < unsolved else 0.3  # --unsolved 0: the batches of old
        for sample in group.samples:
            ids = tuple(answer[: max(1, len(answer) + rng.randint(-3, 3))])
            sample.append(
                Segment(f"r{uid}", 0, len(ids), FinishReason.STOP, 0, ids, tuple(-1.0 for _ in ids))
            )
            sample.reward = float(rng.random() < solve)
        batch.append(group)
    return batch


#: The settings compared: name -> the trainer's options.
ARMS: dict[str, dict[str, Any]] = {
    "share_prompts=false": {"share_prompts": False, "zero_advantage": "train"},
    "share_prompts=true": {"share_prompts": True, "zero_advantage": "train"},
    "+zero_advantage=forward": {"share_prompts": True, "zero_advantage": "forward"},
    "+zero_advantage=skip": {"share_prompts": True, "zero_advantage": "skip"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--unsolved", type=float, default=0.5, help="share of groups with rewards all 0")
    args = parser.parse_args()
    torch.set_num_threads(1)
    task = SyntheticTask.Config().build()
    trainers = {}
    for name, options in ARMS.items():
        torch.manual_seed(0)
        model = build_model("tiny", vocab_size=task.tokenizer.vocab_size)
        trainers[name] = TorchTrainer.Config(**options).build(module=model)
    names = list(ARMS)
    times: dict[str, list[float]] = {name: [] for name in names}
    lanes = dict.fromkeys(names, 0)
    real = 0
    for step in range(args.rounds + 1):
        groups = batch(task, step, unsolved=args.unsolved)
        rows = trainers[names[0]]._rows(groups)
        ids = rows.ids[:, : max(rows.lengths)]
        real += sum(rows.lengths) if step else 0
        for k in range(len(names)):  # rotate which goes first
            name = names[(step + k) % len(names)]
            start = time.process_time()
            asyncio.run(trainers[name].train(groups, step=step, policy_version=step))
            if not step:  # round 0 warms every setting up (the AdamW state, the first allocations)
                continue
            times[name].append(time.process_time() - start)
            options = ARMS[name]
            keep = [
                i
                for i in range(len(rows.lengths))
                if options["zero_advantage"] == "train" or float(rows.advantages[i]) != 0
            ]
            if not keep:
                continue
            lengths = [rows.lengths[i] for i in keep]
            if options["share_prompts"]:
                prompts, owners = [rows.prompts[i] for i in keep], [rows.groups[i] for i in keep]
                lanes[name] += pack_shared(ids[keep], lengths, prompts, owners, pad_id=0).ids.numel()
            else:
                lanes[name] += pack_rows(ids[keep], lengths, pad_id=0).ids.numel()
    print(
        f"load average {os.getloadavg()[0]:.1f}; {args.rounds} batches of 16 x 8 "
        f"({args.unsolved:.0%} of groups unsolved); real tokens {real}"
    )
    for name in names:
        ms = [1000 * t for t in times[name]]
        print(
            f"{name:30} median {statistics.median(ms):6.1f} ms CPU a train call "
            f"(range {min(ms):.1f}-{max(ms):.1f}), lane tokens with grad {lanes[name]}"
        )


if __name__ == "__main__":
    main()
