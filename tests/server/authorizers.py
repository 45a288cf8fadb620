"""An authorizer for the server tests: it denies what ``DENY`` lists (``"sessions"``, or
``"sessions:read"``), as a read-only or collaborator role built on jupyter_server's Authorizer does."""

from __future__ import annotations

from jupyter_server.auth.authorizer import Authorizer

#: what the next requests are denied: resource names, or ``"resource:action"``
DENY: set[str] = set()


class DenyListed(Authorizer):
    def is_authorized(self, handler, user, action, resource) -> bool:  # type: ignore[no-untyped-def]
        return resource not in DENY and f"{resource}:{action}" not in DENY
