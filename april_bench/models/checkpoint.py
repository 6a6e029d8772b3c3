"""A tiny, complete Hugging Face checkpoint built offline: random weights plus a real tokenizer.

Nothing can be downloaded in CI, yet the checkpoint path of the ``hf`` engine
(``from_pretrained``, a tokenizer with a chat template, EOS handling) must be
exercised end to end.  :func:`make_tiny_checkpoint` writes a directory that
``transformers`` loads like any hub model: a character-level
``PreTrainedTokenizerFast`` (every printable ASCII character, plus ``<pad>``,
``<s>``, ``</s>``) with a ChatML-style chat template, and the ``tiny`` Qwen3
architecture with random weights sized to that vocabulary.  It answers math
problems at chance level; it is for plumbing, not for accuracy.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

__all__ = ["CHAT_TEMPLATE", "load_state_dict", "make_tiny_checkpoint", "save_state_dict"]

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tiny_checkpoint(path: str | Path, *, seed: int = 0) -> Path:
    """Write a loadable checkpoint (config, weights, tokenizer) to ``path`` and return it (through
    :func:`april_bench.fsio.replace_dir_atomic`, as every checkpoint: a reader never sees half of it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from april_bench.fsio import replace_dir_atomic
    from april_bench.models.zoo import build_model

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    chars = sorted(set(string.printable) - set("\x0b\x0c"))
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    core.decoder = decoders.Fuse()  # characters join back without spaces
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    model = build_model("tiny", vocab_size=len(vocab), seed=seed)
    model.config.pad_token_id = vocab["<pad>"]
    model.config.bos_token_id = vocab["<s>"]
    model.config.eos_token_id = vocab["</s>"]

    def fill(directory: Path) -> None:
        tokenizer.save_pretrained(directory)
        model.save_pretrained(directory)

    return replace_dir_atomic(path, fill)


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory's ``*.safetensors`` files (sharded or not), on the CPU."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors weights to load")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file), device="cpu"))
    return state


def save_state_dict(module: torch.nn.Module, path: str | Path) -> Path:
    """Save ``module`` as a Hugging Face checkpoint directory (config + safetensors) and return it.

    Written through :func:`april_bench.fsio.replace_dir_atomic`: into a temporary sibling, fsynced,
    then swapped in; an older checkpoint at ``path`` is removed only once the new one is in place, so
    a save that fails or is interrupted leaves it loadable.
    """
    from april_bench.fsio import replace_dir_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return replace_dir_atomic(path, module.save_pretrained)  # type: ignore[arg-type]
