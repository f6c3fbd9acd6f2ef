"""Log records as JSON lines (`semigrad serve --log-format json`), each with the request id and
tenant of the call that wrote it (from context variables the service sets per call)."""

from __future__ import annotations

import contextvars
import json
import logging
import time

from . import tenancy

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("semigrad_request_id", default="")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(process)d %(name)s %(message)s%(request)s"


class CallFields(logging.Filter):
    """Adds `request_id` and `tenant` (and `request`: " request=ID" or "", ending text lines)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        record.tenant = tenancy.current()
        record.request = f" request={record.request_id}" if record.request_id else ""
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
                 "level": record.levelname, "logger": record.name, "pid": record.process,
                 "message": record.getMessage()}
        for name in ("request_id", "tenant"):
            value = getattr(record, name, "")
            if value:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str | int = "INFO", fmt: str = "text") -> None:
    """The root logger: one stderr handler, text or JSON lines, with the call fields."""
    handler = logging.StreamHandler()
    handler.addFilter(CallFields())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level if isinstance(level, int) else level.upper())
