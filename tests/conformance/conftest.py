"""One engine per kind for the whole conformance module (real engines start slowly)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conformance_engines import KINDS, EngineHost, make_checkpoints

#: Real engines behind a marker: skipped (by the root conftest) where their package is missing.
PARAMS = [
    pytest.param("fake"),
    pytest.param("hf"),
    pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.slow]),
    pytest.param("vllm-server", marks=[pytest.mark.vllm, pytest.mark.slow]),
    pytest.param("sglang-fake"),
    pytest.param("sglang", marks=[pytest.mark.sglang, pytest.mark.gpu, pytest.mark.slow]),
]


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return make_checkpoints(Path(tmp_path_factory.mktemp("conformance-checkpoints")))


@pytest.fixture(scope="module", params=PARAMS)
def host(request: pytest.FixtureRequest, checkpoints: tuple[str, str]) -> Iterator[EngineHost]:
    engine_host = EngineHost(KINDS[request.param], checkpoints)
    try:
        yield engine_host
    finally:
        engine_host.stop()
