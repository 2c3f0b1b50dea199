"""Structured logs: every record written while a request runs carries its request id (also sent to the client
in the `x-request-id` response metadata / HTTP header), so one id finds a request's every line."""

from __future__ import annotations

import contextvars
import json
import logging
import time

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("thinkserve_request_id", default="")


class RequestIdFilter(logging.Filter):
    """Adds `request_id` to every record (empty outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request id, and the exception when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", "") or REQUEST_ID.get(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(log_format: str, level: int) -> None:
    """The process's log output (called by the CLI entry point; a library user configures their own)."""
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
