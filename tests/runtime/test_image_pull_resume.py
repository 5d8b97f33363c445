"""A pull killed half-way through a layer resumes it with ``Range`` (and keeps the layers it
had verified); the CLI's progress output in its three forms.

The pull runs as ``orchard image pull`` in a subprocess killed with SIGKILL once
it reports bytes of the big layer; a throttling TCP proxy in front of the real
registry (:class:`.registry_server.ThrottledProxy`) makes that moment last, and
counts the bytes the second pull is sent.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from orchard.scheduler.backends.local.images import ImageStore

from .image_inputs import Entry, layer_tar
from .oci_images import ImageSpec, random_file_layer, write_layout
from .registry_server import ThrottledProxy, have_tools, running_registry

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or have_tools() is not None, reason=have_tools() or "needs root"
)
ORCHARD = [sys.executable, "-m", "orchard.cli"]
BIG = 24 << 20
RATE = 8 << 20


def cli_pull(store: Path, ref: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*ORCHARD, "image", "pull", ref, "--plain-http", "--images-dir", str(store), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_REGISTRY")},
    )


def events_of(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_a_killed_pull_resumes_its_partial_layer(tmp_path: Path) -> None:
    small = layer_tar([Entry("etc", "dir", mode=0o755), Entry("etc/small", data=b"small\n")])
    big = random_file_layer("blob.bin", BIG, seed=7)
    layout = write_layout(tmp_path / "layout", "1", [ImageSpec([small, big], gzip_layers=False)])
    store = tmp_path / "images"
    with running_registry(tmp_path / "reg") as registry:
        registry.push(layout, "1", "big")
        proxy = ThrottledProxy(registry.host, RATE)
        try:
            ref = f"{proxy.host}/big:1"
            first = cli_pull(store, ref, "--json")
            assert first.stdout is not None
            seen: list[dict[str, Any]] = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                line = first.stdout.readline()
                assert line, f"pull ended early: {first.stderr.read() if first.stderr else ''}"
                seen.append(json.loads(line))
                if seen[-1]["event"] == "bytes" and seen[-1]["layer"] == 2:
                    break
            first.kill()  # SIGKILL, mid-layer: no cleanup of any kind runs
            first.communicate()
            big_digest = seen[-1]["digest"]
            partials = list((store / ".blobs/sha256").glob("*.partial"))
            assert [p.name for p in partials] == [big_digest.partition(":")[2] + ".partial"]
            kept = partials[0].stat().st_size
            assert 0 < kept < BIG
            # The small layer had been verified (and unpacked) before the kill: kept.
            small_done = [e for e in seen if e["event"] == "layer-done" and e["layer"] == 1]
            assert small_done and (store / ".blobs/sha256" / small_done[0]["digest"][7:]).is_file()

            sent_before = proxy.sent
            second = cli_pull(store, ref, "--json")
            out, err = second.communicate(timeout=120)
            assert second.returncode == 0, err
            events = events_of(out)
            layer_events = {e["layer"]: e for e in events if e["event"] == "layer"}
            assert layer_events[1]["status"] == "cached"
            assert layer_events[2]["status"] == "resume"
            assert layer_events[2]["done"] >= kept - (1 << 20)  # resumed where it stopped
            # Only the rest of the big layer crossed the wire again (plus headers, manifests).
            assert proxy.sent - sent_before < BIG - kept + (256 << 10)
        finally:
            proxy.close()
    image = ImageStore(store).get("big:1")
    on_disk = (image.layer_paths[1] / "big/blob.bin").read_bytes()
    assert len(on_disk) == BIG
    assert not list((store / ".blobs/sha256").glob("*.partial"))


def test_progress_output_forms(tmp_path: Path) -> None:
    layout = write_layout(
        tmp_path / "layout", "3", [ImageSpec([layer_tar([Entry("f", data=b"x")])])]
    )
    store = tmp_path / "images"
    with running_registry(tmp_path / "reg") as registry:
        registry.push(layout, "3", "forms")
        ref = f"{registry.host}/forms:3"
        lines = cli_pull(store, ref)
        out, err = lines.communicate(timeout=60)
        assert lines.returncode == 0 and out == "forms:3\n"
        # Not a terminal: one plain line per event, no cursor movement.
        assert "\x1b[" not in err
        assert "layer 1/1" in err and "verified" in err and "forms:3: pulled in" in err
        as_json = cli_pull(store, ref, "--json", "--name", "forms-json:3")
        out, err = as_json.communicate(timeout=60)
        events = events_of(out)
        assert [e["event"] for e in events] == ["resolved", "layer", "done"]
        assert events[-1]["name"] == "forms-json:3"
        bad = cli_pull(store, f"{registry.host}/forms:missing")
        out, err = bad.communicate(timeout=60)
        assert bad.returncode != 0 and "Traceback" not in err
        assert "MANIFEST_UNKNOWN" in err or "not found" in err


@pytest.mark.parametrize("ranges", [True, False], ids=["range", "registry-ignores-range"])
def test_a_dropped_connection_is_resumed_within_the_pull(tmp_path: Path, ranges: bool) -> None:
    big = random_file_layer("blob.bin", 8 << 20, seed=11)
    layout = write_layout(tmp_path / "layout", "1", [ImageSpec([big], gzip_layers=False)])
    store = tmp_path / "images"
    with running_registry(tmp_path / "reg") as registry:
        registry.push(layout, "1", "drop")
        proxy = ThrottledProxy(registry.host, 0, cut_after=3 << 20, strip_range=not ranges)
        try:
            done = cli_pull(store, f"{proxy.host}/drop:1", "--json")
            out, err = done.communicate(timeout=120)
        finally:
            proxy.close()
    assert done.returncode == 0, err
    assert proxy.cuts == 1
    starts = [e for e in events_of(out) if e["event"] == "layer"]
    assert [s["status"] for s in starts] == ["download", "resume"]
    assert starts[1]["extra"]["attempt"] == 2 and starts[1]["done"] > 0
    image = ImageStore(store).get("drop:1")
    expected = random.Random(11).randbytes(8 << 20)  # what random_file_layer wrote
    assert (image.layer_paths[0] / "big/blob.bin").read_bytes() == expected
    # With ranges only the rest is sent again; without, the whole blob (started over).
    blob_size = starts[0]["size"]
    resent = proxy.sent - (3 << 20)
    assert resent < blob_size if ranges else resent >= blob_size
