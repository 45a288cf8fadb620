"""Who may read what through ``/vramlab/kernels`` (issue: hardening, finding 1): a user the
server's authorizer lets read kernels but not sessions or contents gets no notebook path, as
Jupyter's own ``/api/kernels`` gives none and ``/api/sessions`` refuses them."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

from tests.server import authorizers
from vramlab.server.handlers import without_paths

pytestmark = pytest.mark.slow

SECRET = "secret/plans/acquisition-target-X.ipynb"


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"vramlab.server": True}, "allow_unauthenticated_access": False,
                          "authorizer_class": "tests.server.authorizers.DenyListed"}}


@pytest.fixture(autouse=True)
def _deny_nothing_after():
    yield
    authorizers.DENY.clear()


async def _paths(jp_fetch) -> list:
    r = await jp_fetch("vramlab", "kernels")
    return [k["path"] for k in json.loads(r.body)["kernels"]]


@pytest.mark.parametrize("denied", [{"sessions"}, {"sessions:read"}, {"contents"}, {"sessions:read", "contents"}])
async def test_no_notebook_path_without_sessions_and_contents(jp_fetch, denied):
    r = await jp_fetch("api", "sessions", method="POST",
                       body=json.dumps({"path": SECRET, "type": "notebook", "kernel": {"name": "python3"}}))
    session = json.loads(r.body)
    try:
        assert await _paths(jp_fetch) == [SECRET]  # allowed everything: the path is there
        authorizers.DENY.update(denied)
        if "sessions" in denied or "sessions:read" in denied:
            with pytest.raises(HTTPClientError) as e:  # Jupyter's own API refuses the sessions
                await jp_fetch("api", "sessions")
            assert e.value.code == 403
        kernels = await jp_fetch("vramlab", "kernels")
        body = json.loads(kernels.body)
        assert [k["path"] for k in body["kernels"]] == [None]
        assert SECRET not in kernels.body.decode()
        assert body["kernels"][0]["id"] == session["kernel"]["id"]  # the kernel's memory is still given
    finally:
        authorizers.DENY.clear()
        await jp_fetch("api", "sessions", session["id"], method="DELETE")


async def test_without_kernels_nothing_is_given(jp_fetch):
    authorizers.DENY.add("kernels")
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("vramlab", "kernels")
    assert e.value.code == 403


def test_without_paths_leaves_the_rest():
    out = {"kernels": [{"id": "k", "path": SECRET, "pids": [1]}], "notes": []}
    assert without_paths(out) == {"kernels": [{"id": "k", "path": None, "pids": [1]}], "notes": []}
    assert out["kernels"][0]["path"] == SECRET  # the cached reading is not changed
