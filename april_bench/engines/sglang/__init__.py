"""SGLang behind the engine protocol, and a fake SGLang server that answers like one.

* :class:`SGLangEngine` - the adapter: launches ``sglang.launch_server`` on
  loopback (or attaches to a URL) and drives its native HTTP API;
* :class:`FakeSGLangServer` - SGLang 0.5.23's endpoints over a deterministic
  token rule, in-process or as ``python -m april_bench.engines.sglang.fake_server``.

Both are imported on first use (the fake server module must not be imported by
its own package when it runs as ``__main__``).  Neither needs a third-party
package: the adapter speaks HTTP with :mod:`.http`, the fake serves it with
:mod:`.fake_http`, and ``sglang`` itself is only ever a separate server process.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["FakeSGLangServer", "SGLangEngine"]

_HOMES = {
    "SGLangEngine": "april_bench.engines.sglang.engine",
    "FakeSGLangServer": "april_bench.engines.sglang.fake_server",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
