"""The study tests' shared setting: one tokenizer cache per session (DEPTHPROBE_CACHE), not the user's."""

import pytest


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DEPTHPROBE_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
