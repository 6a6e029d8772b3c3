"""benchmarks/checkpoint_cost.py counts what the torch trainer's ``save_state`` writes: checked against the
file the trainer writes for ``tiny`` after one optimizer step."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from april_bench.models.zoo import build_model
from april_bench.trainers.torch_trainer import TorchTrainer

ROOT = Path(__file__).resolve().parents[1]


def _benchmark() -> Any:
    path = ROOT / "benchmarks" / "checkpoint_cost.py"
    spec = importlib.util.spec_from_file_location("checkpoint_cost", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def test_the_counted_bytes_are_the_trainers_file_less_its_format_overhead(tmp_path: Path) -> None:
    bench = _benchmark()
    trainer = TorchTrainer(TorchTrainer.Config(device="cpu"), module=build_model("tiny", vocab_size=17))
    loss = sum(p.float().pow(2).sum() for p in trainer.model.parameters())
    loss.backward()  # type: ignore[union-attr]
    trainer.optimizer.step()  # AdamW's state exists after its first step
    trainer.save_state(str(tmp_path / "s.trainer.pt"))
    written = (tmp_path / "s.trainer.pt").stat().st_size
    counted = bench.checkpoint_cost("tiny", vocab_size=17)
    same_module = bench.checkpoint_cost("tiny", module=build_model("tiny", vocab_size=17))
    assert counted == same_module  # the meta-device build counts what a real one holds
    assert counted.parameters == sum(p.numel() for p in trainer.model.parameters())
    # the zip format adds a header, a name and alignment per tensor; the data is exactly the count
    assert 0 < written - counted.total_bytes <= 256 * counted.tensors + 16 * 1024, (written, counted)
    assert counted.optimizer_bytes == 2 * counted.weight_bytes + 4 * len(list(trainer.model.parameters()))


def test_the_recipes_shape_is_priced_on_the_meta_device() -> None:
    bench = _benchmark()
    cost = bench.checkpoint_cost("r1-distill-qwen-1.5b", vocab_size=bench.synthetic_vocab())
    assert 1.30e9 < cost.parameters < 1.32e9  # 28 layers of 1536 x 8960; the synthetic task's 17 tokens
    assert cost.total_bytes == 3 * cost.weight_bytes + 4 * (cost.tensors // 4)
