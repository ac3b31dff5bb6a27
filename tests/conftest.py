"""How `make test` splits the suite over pytest-xdist workers (`--dist loadgroup`).

A test file is one work unit, so its module fixtures (a vLLM server, the local SLURM cluster, a
trained tiny policy) start once, on one worker: two SLURM clusters on one machine would fight
over their ports and state. An end-to-end test (`integration`: a whole Snakemake run in its own
temp dir) that uses no such fixture is a unit of its own, so the long runs (the paper twins, the
workflow run) spread over the workers instead of queueing behind their neighbours. The
end-to-end units are handed out first: one of them started last would run alone at the end of
the suite while the other worker sits idle.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

# Snakemake imports every installed executor plugin when it starts, and the SLURM plugin (2.8)
# runs `scontrol show config` on import (its status-command help text). Where the SLURM client is
# installed and no controller answers (this machine; CI once test_slurm has installed SLURM),
# scontrol retries until the plugin's 10 s timeout: ~9 s of idle wall time in every Snakemake
# call of the suite (test_paper_configs + test_methods' dry runs: 80 s -> 32 s on 3 workers; the
# whole second stage of `make test` 26 min 5 s -> 24 min 21 s). A client config naming a closed
# port makes it fail at once. A SLURM_CONF of the user's is kept; tests/backends/test_slurm.py
# takes this one away for its own cluster (`without_stub_slurm_conf`).
STUB_SLURM_CONF = Path(__file__).with_name("slurm-none.conf")
# (xdist's workers inherit the stub from the process that starts them: it is not the user's)
_INHERITED = os.environ.get("SLURM_CONF")
USER_SLURM_CONF = None if _INHERITED == str(STUB_SLURM_CONF) else _INHERITED
os.environ.setdefault("SLURM_CONF", str(STUB_SLURM_CONF))


@pytest.fixture(scope="module")
def without_stub_slurm_conf():
    """The real SLURM configuration for the module's tests (and the processes they start)."""
    with pytest.MonkeyPatch.context() as mp:
        if USER_SLURM_CONF is None:
            mp.delenv("SLURM_CONF", raising=False)
        yield


def _shares_a_fixture(item: pytest.Item) -> bool:
    """True when the test uses a fixture of the test files that outlives one test."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return True  # cannot tell: keep it with its file
    # A baseid of "" is a plugin's fixture (tmp_path_factory...), shared by every test anyway.
    return any(defs[-1].scope != "function" and defs[-1].baseid for defs in info.name2fixturedefs.values())


def _group(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    if item.get_closest_marker("integration") is not None and not _shares_a_fixture(item):
        # xdist reads the group back from after the node id's last "@", and only past its last "]".
        return re.sub(r"[^\w./-]", "_", item.nodeid)
    return item.nodeid.split("::", 1)[0]


# Before xdist's own hook, which turns the xdist_group marks into the node ids it schedules by.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups = {item.nodeid: _group(item) for item in items}
    heavy = {groups[item.nodeid] for item in items if item.get_closest_marker("integration") is not None}
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    # A stable sort: otherwise pytest's order (every worker collects the same order; xdist checks).
    items.sort(key=lambda item: groups[item.nodeid] not in heavy)


def pytest_configure(config: pytest.Config) -> None:
    # xdist registers it too; this keeps a run without xdist (-p no:xdist) free of warnings.
    config.addinivalue_line("markers", "xdist_group(name): run these tests on one xdist worker")


@pytest.fixture
def chat_server():
    """A real OpenAI-compatible chat endpoint on 127.0.0.1 whose replies a test scripts:
    `state.reply(body) -> (status, payload)`; `state.url` ends in /v1, `state.seen` holds the bodies."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from ragrl.http_server import BackgroundServer

    state = SimpleNamespace(seen=[], reply=lambda body: (200, {}))
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(body: dict):
        state.seen.append(body)
        status, payload = state.reply(body)
        return JSONResponse(payload, status_code=status)

    with BackgroundServer(app) as server:
        state.url = server.url + "/v1"
        yield state
