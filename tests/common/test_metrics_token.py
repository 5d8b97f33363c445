"""The scrape token of ``/metrics`` (``orchard.common.metrics``): made once, 0600, and a
real HTTP server that serves the metrics to that token only."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from orchard.common.metrics import load_or_create_metrics_token, serve_metrics


def test_the_token_is_made_once_and_private(tmp_path: Path) -> None:
    path = tmp_path / "secrets" / "metrics-token"
    first = load_or_create_metrics_token(path)
    assert load_or_create_metrics_token(path) == first and len(first) >= 32
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700


def test_an_unusable_token_file_is_refused_not_replaced(tmp_path: Path) -> None:
    path = tmp_path / "metrics-token"
    path.write_text("short\n")
    with pytest.raises(ValueError, match="no usable token"):
        load_or_create_metrics_token(path)
    assert path.read_text() == "short\n"


def _get(address: str, authorization: str | None) -> tuple[int, str]:
    headers = {} if authorization is None else {"Authorization": authorization}
    request = urllib.request.Request(f"http://{address}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_only_the_token_scrapes(tmp_path: Path) -> None:
    token_file = tmp_path / "metrics-token"
    address = serve_metrics("127.0.0.1:0", token_file, tmp_path / "metrics.addr")
    assert (tmp_path / "metrics.addr").read_text().strip() == address
    token = token_file.read_text().strip()
    status, body = _get(address, f"Bearer {token}")
    assert status == 200 and "orchard_rpc_requests_total" in body
    for wrong in (None, "", "Bearer", f"Bearer {token}x", f"bearer {token[:-1]}", "Basic eDp5"):
        status, body = _get(address, wrong)
        assert status == 401, wrong
        assert "orchard_" not in body
