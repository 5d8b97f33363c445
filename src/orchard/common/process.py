"""How every Orchard service process starts, in one place.

Each service's ``__main__`` parses its own flags, then calls
:func:`start_service` (JSON logs on stderr with the service's name, tracing if
configured, the uvloop event loop) and reports its bound address with
:func:`announce_address`: one line on stdout, which ``orchard up`` waits for.
"""

from __future__ import annotations

import uvloop

from .logging import configure_logging
from .tracing import configure_tracing


def start_service(service: str) -> None:
    """Logs, tracing and the event loop policy for the process ``service``."""
    configure_logging(service)
    configure_tracing(f"orchard-{service}")
    uvloop.install()


def announce_address(address: str) -> None:
    """Print the address the service listens on (stdout's first line), flushed."""
    print(address, flush=True)
