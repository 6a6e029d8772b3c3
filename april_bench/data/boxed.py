"""The last ``\\boxed{...}`` of a text: how answers are read from reference solutions (the loaders) and from
responses (the graders, which sit above the data layer and import it from here)."""

from __future__ import annotations

__all__ = ["last_boxed"]


def last_boxed(text: str, *, fbox: bool = True) -> str | None:
    """Content of the last ``\\boxed{…}`` (brace-counted), or None (deepscaler ``last_boxed_only_string``
    followed by ``remove_boxed``).

    The last ``\\boxed`` wins; only when the text has no ``\\boxed`` at all is the last ``\\fbox{…}`` used
    (``fbox=False`` reproduces deepscaler's grader, which locates an ``\\fbox`` but then fails to unwrap it
    and so treats it as no answer). ``\\boxed 5`` without braces, or an unclosed brace, gives None.
    """
    for command in ("\\boxed", "\\fbox") if fbox else ("\\boxed",):
        start = text.rfind(command)
        if start >= 0:
            break
    else:
        return None
    open_at = start + len(command)
    if open_at >= len(text) or text[open_at] != "{":
        return None
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None
