"""Small rollout dumps in verl's and slime's formats, written by the tests (nothing vendored)."""

from __future__ import annotations

import json
from pathlib import Path


def verl_dump(root: Path) -> Path:
    """verl's rollout_data_dir: {step}.jsonl written by RayPPOTrainer._dump_generations (balanced batch
    order: a group's samples are not consecutive)."""
    root.mkdir()
    for step in (1, 2):
        entries = []
        for j in range(2):
            for g, problem in enumerate(("What is 2+2?", "Integrate x dx from 0 to 1.")):
                entries.append(
                    {
                        "input": f"user: {problem} assistant:",
                        "output": "x" * (35 * (g + 1) * (j + 1)) + (" y" * 200 if (g, j) == (1, 1) else ""),
                        "gts": "4",
                        "score": float(j),
                        "step": step,
                        "acc": bool(j),
                    }
                )
        (root / f"{step}.jsonl").write_text("\n".join(json.dumps(e) for e in entries[::-1]) + "\n")
    return root


def slime_sample(group: int, index: int, response: int, status: str, reward: object) -> dict[str, object]:
    """``Sample.to_dict()`` of slime (slime/utils/types.py): plain values only."""
    prompt = [1, 2, 3, 4, 5]
    return {
        "group_index": group,
        "index": index,
        "prompt": "What is 2+2?",
        "tokens": prompt + list(range(response)),
        "multimodal_inputs": None,
        "response": "four",
        "response_length": response,
        "label": "4",
        "reward": reward,
        "loss_mask": [1] * response,
        "weight_versions": ["1"],
        "rollout_log_probs": [-0.5] * response,
        "remove_sample": False,
        "status": status,
        "metadata": {"raw": "x"},
        "train_metadata": None,
        "session_id": None,
        "non_generation_time": 0.0,
        "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0},
        "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 5},
    }


def slime_dump(path: Path, rollout_id: int, *, reward: object = 1.0) -> Path:
    import torch

    samples = [
        slime_sample(g, 4 * g + j, 7 * (g + 1) + j, "truncated" if (g, j) == (1, 3) else "completed", reward)
        for g in range(2)
        for j in range(4)
    ]
    samples.append(slime_sample(2, 8, 3, "aborted", reward))
    torch.save({"rollout_id": rollout_id, "samples": samples}, path)
    return path


class Opaque:
    """Stands for any object a weights-only load must refuse."""
