"""A forced-length APRIL rollout on the hf engine, printed as JSON: run by
``tests/test_forced_schedule.py`` in fresh processes under different torch kernels
(``ATEN_CPU_CAPABILITY``) and thread counts, which must print the same schedule.

Between steps the weights move by seeded noise (a stand-in for training), so the sampled tokens
differ from step to step and between kernel choices; the schedule must not.  ``--free`` drops the
oracle: the model's own sampled lengths decide (the control).

Usage: ``python tests/forced_schedule_probe.py [--free] THREADS``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys

import torch

from april_bench.engines.hf import HFEngine
from april_bench.engines.protocol import WeightUpdate
from april_bench.results.recorder import RunRecorder
from april_bench.rollout.loop import RolloutConfig
from april_bench.sim.length_oracle import LengthOracle
from april_bench.tasks.forced import ForcedLengths
from april_bench.workload import ScriptedWorkload
from april_impl import AprilStrategy

VOCAB, LIMIT, STEPS = 64, 64, 3
#: The measured gate's profile (tox.ini): a tail that leaves groups unfinished at the stop.
PROFILE = (
    "synthetic[response_median=10,prompt_sigma=0.8,within_sigma=0.6,incorrect_factor=2,solve_rate=0.5,"
    "solve_concentration=2]"
)


def main(threads: int, free: bool) -> dict[str, object]:
    engine = HFEngine.Config(
        model="tiny", max_running_requests=64, max_context_len=96, eos_token_ids=(2,), threads=threads
    ).build(vocab_size=VOCAB)
    base = ScriptedWorkload(lambda uid, i: 1, prompt_len=6)
    oracle = LengthOracle(PROFILE, seed=0, n_samples_per_prompt=4, max_response_len=LIMIT)
    workload = base if free else ForcedLengths(base, oracle)
    config = RolloutConfig(
        rollout_batch_size=8,
        n_samples_per_prompt=4,
        over_sampling_batch_size=16,
        max_response_len=LIMIT,
        temperature=1.0,
        replay_lengths=not free,
    )
    recorder = RunRecorder()
    strategy = AprilStrategy.Config(over_sampling_batch_size=16).build()
    steps: list[dict[str, object]] = []
    tokens = hashlib.sha256()

    async def run() -> None:
        await engine.start()
        try:
            loop = config.build(
                arm="april", engine=engine, strategy=strategy, workload=workload,
                prompts=workload.prompt_stream(), recorder=recorder,
            )  # fmt: skip
            noise = torch.Generator().manual_seed(1)
            for step in range(STEPS):
                outcome = await loop.run_step(step, step)
                record = outcome.record
                for group in outcome.batch:
                    for sample in group.samples:
                        tokens.update(repr(sample.response_ids()).encode())
                steps.append(
                    {
                        k: getattr(record, k)
                        for k in (
                            "engine_iterations",
                            "decode_iterations",
                            "decode_tokens",
                            "prefill_tokens",
                            "reprefill_tokens",
                            "generated_tokens",
                        )
                    }
                )
                state = {
                    k: v + 0.05 * torch.randn(v.shape, generator=noise, dtype=v.dtype)
                    for k, v in engine.model.state_dict().items()
                }
                await engine.update_weights(WeightUpdate(step + 1, weights=state))
        finally:
            await engine.close()

    asyncio.run(run())
    requests = [
        [r.request_id, r.group_uid, r.sample_index, r.output_len, r.finish_reason]
        for r in recorder["requests"]
    ]
    return {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": threads,
        "steps": steps,
        "requests": requests,
        # the trained tokens: they may differ between kernels (the schedule must not)
        "tokens_sha256": tokens.hexdigest(),
    }


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--free"]
    print(json.dumps(main(int(args[0]) if args else 1, "--free" in sys.argv)))
