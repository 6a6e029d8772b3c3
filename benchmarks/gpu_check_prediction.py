"""The simulator's prediction for ``--recipe gpu-check``, written before the lease that measures it.

The preset exactly (``april_bench.recipes.gpu_check``: forced DeepScaleR-shaped lengths, the same seed,
steps, blocks and batch), turned into simcheck's prediction (``april_bench.simcheck``: the simulated
engine with one replica priced by a measured cost curve and that engine's limits, the simulated
trainer, no evaluations), run into a scratch directory; what is kept is small enough to commit: the
command, the commit, the config, the summary and table, and the step rows (gzip).

    python benchmarks/gpu_check_prediction.py \\
        --curve results/gpu/h100-2026-11-26/cost_curve_hf_r1-distill-qwen-1.5b.json \\
        --out results/gpu/prediction-gpu-check

The curve is the hf engine's measured on the first H100 lease (static decode path, batches 1-256):
the prediction is for that engine; a faster decode path (the fused one) changes the seconds, not the
counted schedule (iterations per step, aborts, re-prefill), which is what simcheck checks first.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import shlex
import shutil
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--curve", type=Path, required=True, help="a measured cost curve (cost_curve*.json)")
    parser.add_argument("--out", type=Path, required=True, help="where the prediction's files go")
    parser.add_argument("--hw", default="h100", help="the hardware of the lease (default h100)")
    args = parser.parse_args(argv)

    from april_bench.recipes import GPU_CHECK, recipe_for
    from april_bench.results.provenance import git_info
    from april_bench.runner import run_into
    from april_bench.simcheck import _prediction_config

    if not args.curve.is_file():
        print(f"error: --curve {args.curve}: no such file", file=sys.stderr)
        return 2
    preset = recipe_for(args.hw, GPU_CHECK)
    prediction = _prediction_config(preset, args.curve.resolve(), None)
    with tempfile.TemporaryDirectory(prefix="gpu-check-prediction-") as scratch:
        run = Path(scratch) / "run"
        outcome = run_into(prediction, run, progress=False, echo=None)
        if outcome.result is None:
            print(f"error: the prediction was interrupted ({outcome.interrupted_by})", file=sys.stderr)
            return 1
        args.out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(run / "table.md", args.out / "table.md")
        summary = json.loads((run / "summary.json").read_text())
        steps = (run / "steps.jsonl").read_bytes()
    with gzip.GzipFile(args.out / "steps.jsonl.gz", "wb", mtime=0) as f:
        f.write(steps)
    curve_bytes = args.curve.read_bytes()
    record = {
        "what": "SIMULATED prediction of `run --recipe gpu-check` (benchmarks/gpu_recipe.sh's run stage)",
        "command": "python benchmarks/gpu_check_prediction.py " + shlex.join(argv or sys.argv[1:]),
        "git": git_info(exclude=args.out.resolve()),  # its own output is not a change to the code
        "cost_curve": str(args.curve),
        "cost_curve_sha256": hashlib.sha256(curve_bytes).hexdigest(),
        "preset": preset.to_dict(),
        "prediction_config": prediction.to_dict(),
        "summary": summary,
    }
    (args.out / "prediction.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print((args.out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
