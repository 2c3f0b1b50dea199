"""Transport set-up shared by the gRPC and HTTP listeners: exposure rules and TLS.

A server reachable from the network must authenticate: any listener off loopback without `auth.tokens` is a
configuration error, found before anything starts. TLS (and mTLS) settings apply to both listeners.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from typing import Optional

import grpc
import uvicorn

from ..config import LOOPBACK_HOSTS, HttpSettings, ServerSettings, Settings
from ..errors import ConfigurationError

log = logging.getLogger("thinkserve.http")


def check_exposure(settings: Settings) -> None:
    exposed = [
        f"{name} = {host!r}"
        for name, host, on in (("server.host", settings.server.host, True), ("http.host", settings.http.host, settings.http.enabled))
        if on and host not in LOOPBACK_HOSTS
    ]
    if exposed and not settings.auth.enabled:
        raise ConfigurationError(
            f"{', '.join(exposed)} is reachable from the network but no auth.tokens are configured: "
            "add tokens (`thinkserve token` makes one) or listen on 127.0.0.1"
        )


def _read(path, setting: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise ConfigurationError(f"cannot read {setting} ({path}): {error.strerror}") from None


def server_credentials(server: ServerSettings) -> Optional[grpc.ServerCredentials]:
    """gRPC TLS credentials, requiring client certificates when a client CA is configured; None: plaintext."""
    if server.tls_cert_file is None:
        return None
    key, cert = _read(server.tls_key_file, "server.tls_key_file"), _read(server.tls_cert_file, "server.tls_cert_file")
    ca = _read(server.tls_client_ca_file, "server.tls_client_ca_file") if server.tls_client_ca_file else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


class HttpServer:
    """uvicorn in the orchestrator's event loop (no second process, the same gateway and metrics)."""

    def __init__(self, http: HttpSettings, server: ServerSettings, app):
        options = {}
        if server.tls_cert_file is not None:
            options = {"ssl_certfile": str(server.tls_cert_file), "ssl_keyfile": str(server.tls_key_file)}
            if server.tls_client_ca_file is not None:
                options |= {"ssl_ca_certs": str(server.tls_client_ca_file), "ssl_cert_reqs": ssl.CERT_REQUIRED}
        self.scheme = "https" if options else "http"
        config = uvicorn.Config(
            app, host=http.host, port=http.port, log_level="warning", access_log=False, lifespan="off",
            timeout_graceful_shutdown=None, **options,
        )
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # `serve` owns the signals
        self._task: Optional[asyncio.Task] = None
        self.host, self.port = http.host, http.port

    async def start(self) -> str:
        """Listen; returns the base URL (the real port when the configured one is 0). The socket is bound here,
        so a taken port is a clear error (uvicorn would exit the process)."""
        family = socket.AF_INET6 if ":" in self.host.strip("[]") else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host.strip("[]"), self.port))
        except OSError as error:
            sock.close()
            raise ConfigurationError(f"cannot listen on {self.host}:{self.port} (http.port): {error.strerror}") from None
        sock.set_inheritable(True)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="thinkserve-http")
        while not self._server.started:
            if self._task.done():
                raise ConfigurationError(f"the HTTP endpoint did not start: {self._task.exception()}")
            await asyncio.sleep(0.01)
        return f"{self.scheme}://{self.host}:{sock.getsockname()[1]}"

    async def stop(self, grace_s: float) -> None:
        """Stop accepting, let running responses finish for up to `grace_s`, then close."""
        if self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), grace_s + 1.0)
        except asyncio.TimeoutError:
            self._server.force_exit = True
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._task, 2.0)
        self._task = None
