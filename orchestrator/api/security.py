"""Who may call, and on which collections: bearer tokens scoped to collections (tenants).

The server keeps only SHA-256 digests of the tokens (settings `auth.tokens`); a call presents the token in
`authorization: Bearer <token>` (gRPC metadata or HTTP header). Digests are compared in constant time. With
no token configured the server is open, which `Deployment` allows on loopback only.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Iterable, Optional

from ..config import AuthSettings, TokenGrant
from ..errors import PermissionDeniedError, UnauthenticatedError

TOKEN_PREFIX = "ts_"


@dataclass(frozen=True)
class Principal:
    """The caller of one request."""

    name: str  # the grant's name ("anonymous" when auth is off)
    collections: frozenset[str]  # "*" = all
    write: bool
    max_concurrent: Optional[int]  # None: only the server-wide admission limits apply

    def may_read(self, collection: str) -> bool:
        return "*" in self.collections or collection in self.collections

    def visible(self, collections: Iterable[str]) -> list[str]:
        return [name for name in collections if self.may_read(name)]


ANONYMOUS = Principal("anonymous", frozenset({"*"}), True, None)


def new_token() -> tuple[str, str]:
    """A fresh random token and the digest to configure for it."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return token, token_digest(token)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def bearer_token(authorization: str) -> str:
    """The token of an `authorization` value ("Bearer <token>"); empty when there is none."""
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class TokenAuthority:
    def __init__(self, settings: AuthSettings):
        self.enabled = settings.enabled
        self._grants: tuple[tuple[bytes, TokenGrant], ...] = tuple(
            (bytes.fromhex(grant.sha256), grant) for grant in settings.tokens
        )

    def authenticate(self, authorization: str) -> Principal:
        """The principal of an `authorization` header value; UNAUTHENTICATED without a valid token."""
        if not self.enabled:
            return ANONYMOUS
        token = bearer_token(authorization)
        if not token:
            raise UnauthenticatedError("this server requires a bearer token (metadata 'authorization: Bearer <token>')")
        digest = hashlib.sha256(token.encode("utf-8")).digest()
        found = None
        for expected, grant in self._grants:  # no early exit: the time taken does not depend on the match
            if hmac.compare_digest(expected, digest):
                found = grant
        if found is None:
            raise UnauthenticatedError("the bearer token is not valid on this server")
        return Principal(found.name, frozenset(found.collections), found.write, found.max_concurrent)

    @staticmethod
    def authorize(principal: Principal, collection: str, write: bool = False) -> None:
        """PERMISSION_DENIED unless the principal may read (or write) the collection. The message never says
        whether the collection exists: a tenant learns nothing about another's."""
        if not principal.may_read(collection):
            raise PermissionDeniedError(f"token '{principal.name}' is not granted collection {collection!r}")
        if write and not principal.write:
            raise PermissionDeniedError(f"token '{principal.name}' may read but not change collection {collection!r}")
