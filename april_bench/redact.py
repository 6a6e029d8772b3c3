"""Secrets never leave memory: what every message, file and tracker gets instead of a credential.

Two kinds of secret reach april-bench: credentials inside a URL (``http://user:password@host``, a
token as the user part) and settings whose name says they hold one (``api_key``, ``hf_token``,
``password``, ...).  :func:`redact` rewrites a JSON-like value (config, provenance, status, what a
tracker gets), :func:`redact_text` a message or a command line; both leave everything else as it is,
so token counts (``max_tokens``) and field names (``reward_key``) are kept.  :func:`is_secret_env`
is the environment filter of the provenance: it matches by pattern (``*PASS*``, ``*PWD*``,
``*SECRET*``, ``*TOKEN*``, ``*KEY*``, ``*CREDENTIAL*``, ``*AUTH*``), so names no list foresaw
(``DB_PASSWD``, ``MY_PWD``) are never recorded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["REDACTED", "is_secret_env", "is_secret_setting", "redact", "redact_text", "redacted_fields"]

#: What a secret is replaced with.
REDACTED = "***"

_SECRET_ENV = re.compile(r"PASS|PWD|SECRET|TOKEN|KEY|CREDENTIAL|AUTH", re.IGNORECASE)

#: Setting names that hold a credential: ``api_key``, ``hf_token``, ``db_password``, ``secret``,
#: ``credentials``, ``authorization`` ...  Not ``max_tokens`` or ``t_first_token`` (counts and times
#: of tokens) nor ``reward_key``: a ``*_token`` or ``*_key`` is a credential only with a known prefix.
_SECRET_SETTING = re.compile(
    r"^(?:token|auth|bearer|authorization)$"
    r"|(?:^|[_\-.])(?:api|access|secret|private|client|ssh|signing|encryption)[_\-]?key$"
    r"|(?:^|[_\-.])(?:api|access|auth|hf|huggingface|bearer|refresh|id|session|oauth|github|gh|gitlab|wandb"
    r"|mlflow|personal|secret)[_\-]?token$"
    r"|(?:^|[_\-.])pass(?:$|[_\-.])|password|passwd|passphrase|pwd|secret|credential|authorization",
    re.IGNORECASE,
)

#: ``scheme://user:password@`` or ``scheme://token@``: the user info of a URL.
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<info>[^/@\s'\"?#]+)@")

#: ``api_key=VALUE``, ``'api_key': 'VALUE'`` in free text.
_ASSIGNMENT = re.compile(
    r"(?P<name>[A-Za-z_][A-Za-z0-9_\-.]*)(?P<sep>['\"]?\s*[=:]\s*['\"]?)(?P<value>[^\s'\",}\])]+)"
)
#: ``--api-key VALUE`` in a command line.
_FLAG = re.compile(r"(?P<name>--[A-Za-z][A-Za-z0-9_\-]*)(?P<sep>\s+)(?P<value>(?!--)\S+)")


def is_secret_env(name: str) -> bool:
    """An environment variable whose value is never recorded (matched by pattern, any case)."""
    return _SECRET_ENV.search(name) is not None


def is_secret_setting(name: str) -> bool:
    """A setting (config key, ``--*-arg`` option, command-line flag) that holds a credential."""
    return _SECRET_SETTING.search(name.lstrip("-")) is not None


def _redact_url(match: re.Match[str]) -> str:
    info = match["info"]
    user, colon, _ = info.partition(":")
    return f"{match['scheme']}{user}:{REDACTED}@" if colon else f"{match['scheme']}{REDACTED}@"


def _redact_assignment(match: re.Match[str]) -> str:
    if not is_secret_setting(match["name"]) or match["value"] == REDACTED:
        return match[0]
    return f"{match['name']}{match['sep']}{REDACTED}"


def redact_text(text: str) -> str:
    """``text`` with URL credentials and ``secret_setting=VALUE`` values replaced by :data:`REDACTED`."""
    if not text:
        return text
    text = _URL_USERINFO.sub(_redact_url, text)
    text = _FLAG.sub(_redact_assignment, text)
    return _ASSIGNMENT.sub(_redact_assignment, text)


def redact(value: Any) -> Any:
    """A copy of a JSON-like ``value`` with every secret replaced: a mapping's secret settings (set
    ones: ``None`` and ``""`` stay, so an unset key still reads unset), URL credentials and
    ``name=VALUE`` secrets in strings, and the value after a ``--secret-flag`` in a list (a command
    line).  Other values are returned as they are."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {
            k: (
                REDACTED if _is_secret_value(v) and isinstance(k, str) and is_secret_setting(k) else redact(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        out: list[Any] = []
        after_flag = False
        for item in value:
            if after_flag and isinstance(item, str):
                out.append(REDACTED)
            else:
                out.append(redact(item))
            after_flag = isinstance(item, str) and item.startswith("--") and "=" not in item
            after_flag = after_flag and is_secret_setting(item)
        return out if isinstance(value, list) else tuple(out)
    return value


def redacted_fields(value: Any, where: str = "") -> list[str]:
    """The dotted names of the redacted values in ``value`` (a config read back from a run)."""
    if isinstance(value, str):
        marks = (f":{REDACTED}@", f"/{REDACTED}@", f"={REDACTED}")
        return [where or "value"] if value == REDACTED or any(m in value for m in marks) else []
    if isinstance(value, Mapping):
        return [n for k, v in value.items() for n in redacted_fields(v, f"{where}.{k}" if where else str(k))]
    if isinstance(value, list | tuple):
        return [n for i, v in enumerate(value) for n in redacted_fields(v, f"{where}[{i}]")]
    return []


def _is_secret_value(value: Any) -> bool:
    """A value a credential can be: set text or a container of it (a number under ``token`` is not)."""
    if isinstance(value, str):
        return value != ""
    return isinstance(value, list | tuple | Mapping) and len(value) > 0
