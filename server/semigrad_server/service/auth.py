"""Bearer-token authentication: who is calling (which tenant), from the `authorization` metadata.

Tokens come from a file (`semigrad serve --tokens FILE`, env SEMIGRAD_TOKENS_FILE: one
`TENANT TOKEN` pair a line, `#` comments at the start of a line or after a space, so a token may
hold '#') and/or the environment (SEMIGRAD_TOKENS: `TENANT=TOKEN` pairs separated by commas or
whitespace). A source that is given must hold a token (load_tokens). Several tokens may map to one tenant (rotation). With
no tokens at all, authentication is off and every caller is the anonymous tenant: the
zero-configuration default on loopback. Only SHA-256 digests of the tokens are kept, and a
presented token is looked up by its digest, so lookup time says nothing about the tokens."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..tenancy import ANONYMOUS
from ..errors import Unauthenticated

TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 4096  # a longer authorization header is refused unread
ENV_TOKENS = "SEMIGRAD_TOKENS"
ENV_TOKENS_FILE = "SEMIGRAD_TOKENS_FILE"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass
class Tokens:
    """Token digests to tenants. Empty: authentication is off."""

    tenants: dict[bytes, str] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return bool(self.tenants)

    def add(self, tenant: str, token: str, where: str) -> None:
        if not TENANT_NAME.fullmatch(tenant):
            raise ValueError(f"{where}: tenant name {tenant[:80]!r} must be 1-64 letters, digits, '_', '.' or '-'")
        if len(token) < MIN_TOKEN_CHARS or len(token) > MAX_TOKEN_CHARS or not token.isprintable() or " " in token:
            raise ValueError(f"{where}: the token of tenant '{tenant}' must be {MIN_TOKEN_CHARS}-{MAX_TOKEN_CHARS} "
                             "printable characters without spaces")
        digest = _digest(token)
        if self.tenants.get(digest, tenant) != tenant:
            raise ValueError(f"{where}: one token is given to tenants '{self.tenants[digest]}' and '{tenant}'")
        self.tenants[digest] = tenant

    def tenant_of(self, metadata) -> str:
        """The tenant of a call's invocation metadata; UNAUTHENTICATED without a valid token."""
        if not self.enabled:
            return ANONYMOUS
        values = [value for key, value in metadata or () if key == "authorization"]
        if not values:
            raise Unauthenticated("authentication required: send the metadata 'authorization: Bearer <token>'")
        if len(values) > 1:
            raise Unauthenticated("more than one 'authorization' metadata entry")
        value = values[0] if isinstance(values[0], str) else values[0].decode("latin-1")
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("the 'authorization' metadata must be 'Bearer <token>'")
        if len(token) > MAX_TOKEN_CHARS:
            raise Unauthenticated("invalid token")
        tenant = self.tenants.get(_digest(token.strip()))
        if tenant is None:
            raise Unauthenticated("invalid token")
        return tenant


COMMENT = re.compile(r"(?:^|\s)#")  # a comment starts a line or follows a space: a token may hold '#'


def load_tokens(path: str | os.PathLike | None = None, environ=None) -> Tokens:
    """The tokens of `path` (default: $SEMIGRAD_TOKENS_FILE) and of $SEMIGRAD_TOKENS. Raises
    ValueError naming the file and line of a bad entry, and when a source that was given holds no
    token at all (an empty path, an empty or all-comment file, a $SEMIGRAD_TOKENS of blanks): the
    operator asked for authentication, and serving without it (every caller one anonymous tenant)
    would be the opposite. With no source given, authentication is off."""
    environ = os.environ if environ is None else environ
    tokens = Tokens()
    where = "--tokens"
    if path is None and ENV_TOKENS_FILE in environ:
        path, where = environ[ENV_TOKENS_FILE], f"${ENV_TOKENS_FILE}"
    if path is not None:
        if not str(path).strip():
            raise ValueError(f"{where} names no file (an empty path): give the token file, or leave it out "
                             "to serve without authentication")
        for number, line in enumerate(Path(path).read_text().splitlines(), 1):
            line = COMMENT.split(line, 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ValueError(f"{path}:{number}: expected 'TENANT TOKEN'")
            tokens.add(parts[0], parts[1], f"{path}:{number}")
        if not tokens.enabled:
            raise ValueError(f"{path} ({where}) holds no 'TENANT TOKEN' line: with no token authentication would "
                             "be off; give the tokens, or leave the option out to serve without authentication")
    if ENV_TOKENS in environ:
        items = [item for item in re.split(r"[,\s]+", environ[ENV_TOKENS].strip()) if item]
        if not items:
            raise ValueError(f"${ENV_TOKENS} is set but holds no TENANT=TOKEN pair: with no token authentication "
                             "would be off; give the pairs, or unset it to serve without authentication")
        for item in items:
            tenant, sep, token = item.partition("=")
            if not sep:
                raise ValueError(f"${ENV_TOKENS}: expected TENANT=TOKEN pairs")
            tokens.add(tenant, token, f"${ENV_TOKENS}")
    return tokens
