"""Python the network tests run inside a sandbox, and the call that runs it."""

from __future__ import annotations

from orchard import Sandbox

# Prints "ok <address>" or "err <exception type>".
RESOLVE = """
import socket, sys
try:
    print("ok", socket.gethostbyname(sys.argv[1]))
except OSError as e:
    print("err", type(e).__name__)
"""
# urllib: through the proxy variables (``HTTP_PROXY``) or the proxy given as argv[2].
FETCH = """
import sys, urllib.request, urllib.error
proxies = {"http": sys.argv[2]} if len(sys.argv) > 2 else None
opener = urllib.request.build_opener(urllib.request.ProxyHandler(proxies))
try:
    print("ok", opener.open(sys.argv[1], timeout=5).read().decode())
except urllib.error.HTTPError as e:
    print("http", e.code, e.read().decode().strip())
except OSError as e:
    print("err", e)
"""


def py(sb: Sandbox, code: str, *args: str) -> str:
    """Run ``code`` with ``python3 -c`` in ``sb``; its stdout, stripped (exit code 0 asserted)."""
    result = sb.exec(["python3", "-c", code, *args], timeout=60)
    assert result.exit_code == 0, result.stderr_text
    return result.stdout_text.strip()
