"""The server extension's HTTP handlers (tornado, through Jupyter Server's ``APIHandler``).

``GET <base_url>/vramlab/kernels[?uss=1]``: every running kernel's memory, as
:func:`vramlab.server.readings.read_kernels` describes it, plus the refresh ``interval`` (seconds)
the frontend polls at. Authenticated and authorized as reading the ``kernels`` resource, as
Jupyter's own kernel API is; each kernel's notebook path is given only to a user the server's
authorizer also lets read ``sessions`` and ``contents`` (as ``/api/sessions`` gives it), else it
is ``null``. The reading runs on a worker thread, so a slow ``/proc`` or a
hung NVML call never blocks the server's event loop, and it is cached for
``VramlabLab.min_interval`` seconds, so that many tabs cost one reading.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from . import ENDPOINT
from .config import VramlabLab
from .readings import KernelMemoryService, KernelRef

__all__ = ["KernelsMemoryHandler", "setup_handlers", "kernel_refs", "reply", "without_paths"]

# one thread for the readings: they are serialised by the service anyway, and a hung one ties up
# this thread, not the server's shared executor
_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vramlab-reading")


def _kernel_pid(km: Any) -> Optional[int]:
    """The PID of the kernel's local process, or ``None`` when this server does not run it: a
    gateway's kernel (Enterprise Gateway) has no provisioner here, and a remote provisioner's
    PID (a container's, another host's) names no process of this machine, so only jupyter_client's
    ``LocalProvisioner`` (and its subclasses) is trusted."""
    from jupyter_client.provisioning import LocalProvisioner

    prov = getattr(km, "provisioner", None)
    if not isinstance(prov, LocalProvisioner):
        return None
    pid = getattr(prov, "pid", None)
    if pid is None:
        pid = getattr(getattr(prov, "process", None), "pid", None)
    return int(pid) if isinstance(pid, int) else None


async def kernel_refs(kernel_manager: Any, session_manager: Any) -> list[KernelRef]:
    """The server's running kernels, each with its PID and its session's notebook path.

    A kernel that is shut down between the listing and the lookup is left out; a session
    manager that fails leaves the paths empty. Never raises."""
    try:
        listed = list(kernel_manager.list_kernels())
    except Exception:
        return []
    paths: dict[str, str] = {}
    if session_manager is not None:
        try:
            for s in await session_manager.list_sessions():
                kid = (s.get("kernel") or {}).get("id")
                if kid and s.get("path"):
                    paths[kid] = s["path"]
        except Exception:
            pass
    gateway = type(kernel_manager).__name__.startswith("Gateway")  # jupyter_server.gateway's managers
    refs = []
    for k in listed:
        kid = k.get("id")
        if not kid:
            continue
        try:
            km = kernel_manager.get_kernel(kid)
        except Exception:  # KeyError: shut down meanwhile
            continue
        prov = getattr(km, "provisioner", None)
        # no provisioner yet on a local server: the kernel is starting; any other provisioner runs it elsewhere
        remote = gateway or prov is not None
        pid = _kernel_pid(km)
        refs.append(KernelRef(id=kid, pid=pid, name=str(k.get("name") or ""), path=paths.get(kid),
                              execution_state=str(k.get("execution_state") or "unknown"),
                              remote=remote if pid is None else False))
    return refs



def reply(data: dict[str, Any], settings: Any, stale: bool = False, why: str = "") -> dict[str, Any]:
    """What ``GET <base_url>/vramlab/kernels`` answers (``IReading`` in ``src/wire.ts``, which
    ``tests/server/test_wire.py`` holds to this): a reading (:func:`~vramlab.server.readings.read_kernels`)
    with the refresh ``interval`` (seconds) and ``warn_fraction`` from ``settings``; ``stale``
    marks a reading served again because the latest took over ``settings.read_timeout`` seconds
    (or, ``why``, did not finish for another reason)."""
    if stale:
        why = why or f"the latest one took over {settings.read_timeout:g} s"
        data = {**data, "stale": True, "notes": list(data["notes"]) + [f"this reading is stale: {why}"]}
    return {**data, "interval": settings.refresh_interval, "warn_fraction": settings.warn_fraction}

class ReadingInterrupted(RuntimeError):
    """A ``BaseException`` that is not an ordinary error (``KeyboardInterrupt``, ``SystemExit``)
    raised inside the reading thread, carried to the request as an ordinary error: re-raised at
    the handler's ``await``, it would leave asyncio's event loop and stop the whole server."""


def guarded_read(service: KernelMemoryService, refs: list[KernelRef], uss: bool) -> dict[str, Any]:
    """``service.read(refs, uss)`` on the reading thread; a ``BaseException`` other than an
    ``Exception`` comes out as :class:`ReadingInterrupted` (the server's own shutdown does not
    pass through this thread: it stops the event loop, which waits for no reading)."""
    try:
        return service.read(refs, uss)
    except Exception:
        raise
    except BaseException as e:
        raise ReadingInterrupted(f"was interrupted by {type(e).__name__}") from None


def without_paths(out: dict[str, Any]) -> dict[str, Any]:
    """``out`` with every kernel's notebook path left out (``null``): for a user who may read
    kernels but not sessions or contents, to whom Jupyter's own API shows no path either."""
    return {**out, "kernels": [{**row, "path": None} for row in out["kernels"]]}


class KernelsMemoryHandler(APIHandler):
    """``GET``: each kernel's memory (JSON, sizes in bytes, times in seconds)."""

    auth_resource = "kernels"

    def initialize(self, service: KernelMemoryService, settings: VramlabLab) -> None:
        self.service = service
        self.lab_settings = settings

    async def _may(self, action: str, resource: str) -> bool:
        """Whether the server's authorizer lets this request's user do ``action`` on ``resource``
        (an authorizer that fails says no)."""
        try:
            allowed = self.authorizer.is_authorized(self, self.current_user, action, resource)
            if inspect.isawaitable(allowed):
                allowed = await allowed
            return bool(allowed)
        except Exception:
            return False

    @web.authenticated
    @authorized
    async def get(self) -> None:
        uss = self.get_argument("uss", "0").lower() in ("1", "true", "yes")
        refs = await kernel_refs(self.kernel_manager, self.settings.get("session_manager"))
        future = _EXECUTOR.submit(guarded_read, self.service, refs, uss)
        try:
            data = await asyncio.wait_for(asyncio.wrap_future(future), timeout=self.lab_settings.read_timeout)
        except (asyncio.TimeoutError, ReadingInterrupted) as e:
            # a hung read (NVML, /proc) never blocks the server, and an interrupted one never stops
            # it: serve the last reading, marked stale
            last = self.service.last
            if last is None:
                raise web.HTTPError(503, "vramlab: the first reading has not finished") from None
            out = reply(last, self.lab_settings, stale=True,
                        why=f"the latest one {e}" if isinstance(e, ReadingInterrupted) else "")
        else:
            out = reply(data, self.lab_settings)
        if not (await self._may("read", "sessions") and await self._may("read", "contents")):
            out = without_paths(out)
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(out))


def setup_handlers(server_app: Any) -> KernelMemoryService:
    """Add the handlers under the server's base URL; returns the service they share."""
    settings = VramlabLab(parent=server_app)
    service = KernelMemoryService(min_interval=settings.min_interval, history_seconds=settings.history_seconds)
    web_app = server_app.web_app
    base_url = web_app.settings["base_url"]
    route = url_path_join(base_url, ENDPOINT, "kernels")
    web_app.add_handlers(".*$", [(route, KernelsMemoryHandler, {"service": service, "settings": settings})])
    web_app.settings["vramlab_service"] = service
    web_app.settings["vramlab_settings"] = settings
    server_app.log.info("vramlab: each kernel's memory at %s", route)
    return service
