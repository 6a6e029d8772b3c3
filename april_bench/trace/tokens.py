"""Token counts of decoded text: a local tokenizer when one is given, else a labelled estimate."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from april_bench.config import ConfigError

__all__ = ["CHARS_PER_TOKEN", "TokenCounter", "token_counter"]

#: The estimate's rule (the same one the data-set profiles use for prompt lengths): a rough figure for
#: English and math text under a BPE tokenizer, not for code or other languages.
CHARS_PER_TOKEN = 3.5


@dataclass(frozen=True, slots=True)
class TokenCounter:
    """Counts the tokens of a text; ``label`` says how (goes into the trace's header)."""

    label: str
    exact: bool
    _count: Callable[[str], int]

    def count(self, text: str) -> int:
        return self._count(text)


def token_counter(tokenizer: str | Path | None) -> TokenCounter:
    """A counter from a local tokenizer directory (``transformers.AutoTokenizer``), or the estimate."""
    if tokenizer is None:
        return TokenCounter(
            label=f"estimate: characters / {CHARS_PER_TOKEN} (no --tokenizer given)",
            exact=False,
            _count=lambda text: math.ceil(len(text) / CHARS_PER_TOKEN),
        )
    path = Path(tokenizer).expanduser()
    if not path.is_dir():
        raise ConfigError(f"--tokenizer {tokenizer}: not a local tokenizer directory (with tokenizer.json)")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--tokenizer {tokenizer}: cannot load a tokenizer there ({exc})") from None

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    return TokenCounter(
        label=f"re-tokenized with {path.name} (decoded text, special tokens not counted)",
        exact=True,
        _count=count,
    )
