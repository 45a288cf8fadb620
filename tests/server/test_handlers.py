"""The server extension over HTTP, in a real Jupyter Server with real kernels (pytest-jupyter's
``jp_fetch``), against the simulated NVIDIA driver (``tests/nvml_sim``): each kernel's GPU
memory comes from NVML's process lists by its PID tree, as it would on a GPU machine."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.driver_scenarios import GiB, MiB, SIM_DIR, gpu, machine

pytestmark = pytest.mark.slow


async def start_kernel(jp_fetch, jp_serverapp):
    """A python3 kernel started through the REST API, and a client connected to it."""
    r = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))
    kid = json.loads(r.body)["id"]
    km = jp_serverapp.kernel_manager.get_kernel(kid)
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=90)
    return kid, km, kc


async def run(kc, code: str) -> str:
    """Run ``code`` in the kernel; what it printed (an error fails the test)."""
    out: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    reply = await kc.execute_interactive(code, timeout=90, output_hook=hook)
    assert reply["content"]["status"] == "ok", "".join(out)
    return "".join(out)


async def reading(jp_fetch, **params):
    r = await jp_fetch("vramlab", "kernels", params=params)
    assert r.code == 200
    assert r.headers["Content-Type"].startswith("application/json")
    return json.loads(r.body)


def rows(data):
    return {k["id"]: k for k in data["kernels"]}


CHILD = "import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\nprint(p.pid)"


async def test_two_kernels_one_holding_gpu_memory_through_a_child(jp_fetch, jp_serverapp, nvml_sim):
    a, _, kca = await start_kernel(jp_fetch, jp_serverapp)
    b, kmb, kcb = await start_kernel(jp_fetch, jp_serverapp)
    try:
        child = int((await run(kcb, CHILD)).strip())
        assert psutil.Process(child).ppid() == kmb.provisioner.pid
        scenario = machine(gpu(0, procs=[{"pid": child, "mem": 768 * MiB}, {"pid": "hidden", "mem": 2 * GiB}],
                               used=3 * GiB), gpu(1, used=0))
        nvml_sim(scenario)
        data = await reading(jp_fetch)
        k = rows(data)
        assert set(k) == {a, b}
        assert k[b]["state"] == k[a]["state"] == "running"
        assert k[b]["pid"] == kmb.provisioner.pid and child in k[b]["pids"]
        assert k[b]["gpu"] == [768 * MiB, 0] and k[b]["gpu_used"] == 768 * MiB
        assert k[a]["gpu"] == [0, 0] and k[a]["gpu_used"] == 0
        assert all(k[x]["rss"] > 10 * MiB for x in (a, b))
        assert [d["total"] for d in data["gpu"]["devices"]] == [80 * GiB, 80 * GiB]
        assert data["unattributed"] == [{"device": 0, "pids": 1, "used": 2 * GiB}]
        assert any("cannot see" in n and "container" in n for n in data["notes"])
        assert data["host"]["limit"] > 0 and data["interval"] > 0

        # the same reading inside the kernel, through the probes %vram uses; the server's reading
        # after it is a fresh one (no cache), so that the two are a moment apart
        jp_serverapp.web_app.settings["vramlab_service"].min_interval = 0.0
        sim_env = json.dumps(scenario)
        got = json.loads((await run(kcb, f"""
import os, sys, json
sys.path.insert(0, {str(SIM_DIR)!r}); os.environ["VRAMLAB_NVML_SIM"] = {sim_env!r}
import vramlab
s = vramlab.snapshot()
d = s.devices[0]
print(json.dumps({{"rss": s.host.process_rss + s.host.children_rss, "gpu": (d.process_used or 0) + (d.children_used or 0),
                  "kids": list(s.host.children_pids)}}))
""")).strip().splitlines()[-1])
        after = rows(await reading(jp_fetch))[b]
        assert got["gpu"] == after["gpu_used"] == 768 * MiB
        assert child in got["kids"] and sorted(got["kids"]) == sorted(p for p in after["pids"] if p != after["pid"])
        assert abs(after["rss"] - got["rss"]) <= max(8 * MiB, 0.05 * got["rss"]), (after["rss"], got["rss"])
    finally:
        for kc in (kca, kcb):
            kc.stop_channels()


async def test_an_unauthenticated_request_is_refused(jp_fetch):
    r = await jp_fetch("vramlab", "kernels", headers={"Authorization": ""}, raise_error=False)
    assert r.code == 403
    assert b"kernels" not in r.body
    r = await jp_fetch("vramlab", "kernels", headers={"Authorization": "token not-the-token"}, raise_error=False)
    assert r.code == 403


async def test_a_kernel_that_dies_between_listing_and_reading(jp_fetch, jp_serverapp, monkeypatch):
    from vramlab.server import handlers

    a, kma, kca = await start_kernel(jp_fetch, jp_serverapp)
    b, _, kcb = await start_kernel(jp_fetch, jp_serverapp)
    listed = handlers.kernel_refs
    doomed = kma.provisioner.pid

    async def listing_then_death(*args):
        refs = await listed(*args)
        os.kill(doomed, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until the kernel's process is a zombie or reaped
            try:
                if psutil.Process(doomed).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            await asyncio.sleep(0.02)
        return refs

    monkeypatch.setattr(handlers, "kernel_refs", listing_then_death)
    try:
        k = rows(await reading(jp_fetch))
        assert k[a]["state"] == "gone" and k[a]["rss"] is None and "ended" in k[a]["note"]
        assert k[b]["state"] == "running" and k[b]["rss"] > 0
    finally:
        for kc in (kca, kcb):
            kc.stop_channels()


async def test_many_requests_cost_one_reading(jp_fetch, jp_serverapp):
    service = jp_serverapp.web_app.settings["vramlab_service"]
    service.min_interval = 60.0  # every request below falls within one interval
    before = service.readings
    answers = await asyncio.gather(*(reading(jp_fetch) for _ in range(10)))
    assert service.readings - before == 1
    assert len({a["time"] for a in answers}) == 1
    await reading(jp_fetch, uss="1")  # USS asks for a new reading, once
    await reading(jp_fetch, uss="1")
    assert service.readings - before == 2


async def test_the_route_lives_under_the_base_url(jp_fetch, jp_base_url, http_server_client):
    assert jp_base_url != "/"
    r = await http_server_client.fetch("/vramlab/kernels", raise_error=False, follow_redirects=False)
    assert r.code != 200  # Jupyter's catch-all redirects it to the base URL; the API is not there
    await reading(jp_fetch)


def test_the_wheel_config_enables_the_server_extension():
    conf = json.loads((Path(__file__).resolve().parents[2] / "jupyter-config" / "server-config" / "vramlab.json").read_text())
    assert conf == {"ServerApp": {"jpserver_extensions": {"vramlab.server": True}}}
    import vramlab.server

    assert vramlab.server._jupyter_server_extension_points() == [{"module": "vramlab.server"}]


class _Manager:
    """A kernel manager as a gateway or a remote provisioner presents it: kernels listed, no local process."""

    def __init__(self, kernels, provisioners):
        self.kernels, self.provisioners = kernels, provisioners

    def list_kernels(self):
        return [{"id": k, "name": "python3", "execution_state": "idle"} for k in self.kernels]

    def get_kernel(self, kid):
        if kid not in self.provisioners:
            raise KeyError(kid)  # shut down between the listing and the lookup
        return type("KM", (), {"provisioner": self.provisioners[kid]})()


class _Sessions:
    async def list_sessions(self):
        return [{"path": "gw.ipynb", "kernel": {"id": "gw"}}]


async def test_gateway_and_remote_kernels_are_listed_without_a_local_pid():
    from vramlab.server.handlers import kernel_refs

    class GatewayMappingKernelManager(_Manager):  # jupyter_server.gateway's, as far as the name goes
        pass

    remote = type("RemoteProvisioner", (), {"pid": os.getpid()})()  # a PID of another host: not trusted
    refs = await kernel_refs(GatewayMappingKernelManager(["gw"], {"gw": None}), _Sessions())
    refs += await kernel_refs(_Manager(["rp", "shut", "new"], {"rp": remote, "new": None}), None)
    assert [(r.id, r.pid, r.path) for r in refs] == [("gw", None, "gw.ipynb"), ("rp", None, None), ("new", None, None)]
    from vramlab.server.readings import read_kernels

    rows = read_kernels(refs)["kernels"]
    assert [r["state"] for r in rows] == ["remote", "remote", "starting"]


async def test_a_failing_session_manager_leaves_the_paths_empty():
    from jupyter_client.provisioning import LocalProvisioner

    from vramlab.server.handlers import kernel_refs

    class Broken:
        async def list_sessions(self):
            raise RuntimeError("database is locked")

    local = LocalProvisioner.__new__(LocalProvisioner)
    local.pid = os.getpid()
    refs = await kernel_refs(_Manager(["k"], {"k": local}), Broken())
    assert [(r.id, r.pid, r.path) for r in refs] == [("k", os.getpid(), None)]


async def test_a_hung_reading_serves_the_last_one_marked_stale(jp_fetch, jp_serverapp, monkeypatch):
    import threading

    from vramlab.server import readings

    await reading(jp_fetch)  # a first reading, to fall back on
    service = jp_serverapp.web_app.settings["vramlab_service"]
    service.min_interval = 0.0
    release = threading.Event()
    real = readings.read_kernels

    def hung(kernels, uss=False):
        release.wait(30)
        return real(kernels, uss)

    monkeypatch.setattr(readings, "read_kernels", hung)
    jp_serverapp.web_app.settings["vramlab_settings"].read_timeout = 0.5
    try:
        data = await reading(jp_fetch)
        assert data["stale"] is True and any("stale" in n for n in data["notes"])
    finally:
        release.set()


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit, MemoryError, RecursionError])
async def test_any_exception_in_the_reading_leaves_the_server_serving(jp_fetch, jp_serverapp, monkeypatch, raised):
    """A KeyboardInterrupt or SystemExit raised in the reading thread used to leave asyncio's
    event loop at the handler's await and stop the whole server (hardening, finding 5)."""
    from vramlab.server import readings

    await reading(jp_fetch)  # a first reading, to fall back on
    jp_serverapp.web_app.settings["vramlab_service"].min_interval = 0.0

    def broken(kernels, uss=False):
        raise raised()

    monkeypatch.setattr(readings, "read_kernels", broken)
    if raised in (KeyboardInterrupt, SystemExit):
        data = await reading(jp_fetch)
        assert data["stale"] is True and any(raised.__name__ in n for n in data["notes"])
    else:
        from tornado.httpclient import HTTPClientError

        with pytest.raises(HTTPClientError) as e:  # an ordinary error: a 500 for this request only
            await reading(jp_fetch)
        assert e.value.code == 500
    monkeypatch.undo()
    r = await jp_fetch("api", "status")
    assert r.code == 200  # the server lives
    assert "stale" not in await reading(jp_fetch)
