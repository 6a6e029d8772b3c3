"""The ``sglang-fake`` engine: the sglang adapter over april-bench's fake SGLang server, in this
process: SGLang's HTTP behaviour (abort, retraction, weight versions) on a CPU, with modelled decode
time.  Its options are the adapter's and, given flat beside them, the fake server's
(``decode_step_s``, ``max_running_requests`` ...); a name both have is the server's."""

from __future__ import annotations

import dataclasses

from april_bench.config import param
from april_bench.engines.protocol import EngineSettings
from april_bench.engines.sglang.engine import SGLangEngine
from april_bench.engines.sglang.fake_server import FakeSGLangServer

__all__ = ["FakeServedConfig", "serve_fake"]


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class FakeServedConfig(SGLangEngine.Config):
    """The adapter's Config with the fake server's as a section (its fields given flat)."""

    server: FakeSGLangServer.Config = param(
        help="the fake SGLang server's options", default_factory=FakeSGLangServer.Config
    )


def serve_fake(config: FakeServedConfig, settings: EngineSettings) -> SGLangEngine:
    """The adapter, started and stopped with an in-process fake server built from ``config.server``."""
    adapter = {item.name: getattr(config, item.name) for item in dataclasses.fields(SGLangEngine.Config)}
    engine: SGLangEngine = SGLangEngine.Config(**adapter).build(server=config.server.build())
    return engine
