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

import re
from types import SimpleNamespace

import pytest


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
