"""Does vLLM generate anything while paused with ``mode="keep"``?  The premise of exact version stamps.

The in-process ``vllm`` engine stamps in-flight updates from vLLM's ``weight_versions`` spans, which
are exact only if no step runs between ``pause_generation(mode="keep")`` returning and
``resume_generation()``.  This starts the engine on a random ``tiny32`` checkpoint, lets two long
requests decode, pauses, and reads the engine's own generated-token counter (vLLM's stat logger)
and the requests' output count across a hold; then resumes and lets them finish.  Measured.

    python benchmarks/vllm_pause_check.py --hold-s 2

vLLM spawns its engine core: this script keeps its ``__main__`` guard.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any


async def check(checkpoint: str, hold_s: float) -> dict[str, Any]:
    from april_bench.engines.protocol import GenerateRequest, SamplingParams
    from april_bench.engines.vllm.engine import VLLMEngine

    engine = VLLMEngine.Config(model_path=checkpoint, max_num_seqs=2, max_model_len=1024).build()
    await engine.start()
    try:
        requests = [
            GenerateRequest(f"r{i}", 4, 600, SamplingParams(seed=i), input_ids=(5, 6, 7, 8), replay_len=600)
            for i in range(2)
        ]
        stream = engine.generate(requests)
        while engine.metrics()["generation_tokens"] < 20:
            await asyncio.sleep(0.01)
        llm = engine._llm  # the check is of vLLM itself, below the adapter
        await llm.pause_generation(mode="keep", clear_cache=False)
        paused = await llm.is_paused()
        at_pause = engine.metrics()["generation_tokens"]
        await asyncio.sleep(hold_s)
        after_hold = engine.metrics()["generation_tokens"]
        await llm.resume_generation()
        done = [c async for c in stream]
        return {
            "paused": paused,
            "hold_s": hold_s,
            "generation_tokens_at_pause": at_pause,
            "generation_tokens_after_hold": after_hold,
            "generated_while_paused": after_hold - at_pause,
            "tokens_per_request": sorted(c.num_tokens for c in done),
            "generation_tokens_at_end": engine.metrics()["generation_tokens"],
        }
    finally:
        await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold-s", type=float, default=2.0, help="seconds to stay paused")
    args = parser.parse_args()
    from april_bench.models.checkpoint import save_state_dict
    from april_bench.models.zoo import build_model

    with tempfile.TemporaryDirectory() as tmp:
        path = save_state_dict(build_model("tiny32", vocab_size=64, seed=0), Path(tmp) / "tiny32")
        print(json.dumps(asyncio.run(check(str(path), args.hold_s)), indent=1))


if __name__ == "__main__":
    main()
