"""Progress printers for ``orchard image pull``: a redrawn table on a terminal, one line per
event otherwise (logs, CI), JSON Lines with ``--json`` (the :class:`.pull.PullEvent` fields)."""

from __future__ import annotations

import dataclasses
import json
from typing import TextIO

from .pull import PullEvent


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


def _short(digest: str) -> str:
    return digest.partition(":")[2][:12]


def describe(event: PullEvent) -> str:
    """The one-line text of an event."""
    where = f"layer {event.layer}/{event.layers} {_short(event.digest)}"
    if event.event == "resolved":
        return (
            f"{event.ref}: manifest {event.digest} ({event.extra.get('platform', '')}), "
            f"{event.layers} layers, {human_bytes(event.size)} -> {event.name}"
        )
    if event.event == "layer":
        if event.status == "resume":
            return f"{where}: resuming at {human_bytes(event.done)} of {human_bytes(event.size)}"
        if event.status == "cached":
            return f"{where}: already unpacked ({human_bytes(event.size)})"
        if event.status == "downloaded":
            return f"{where}: blob already downloaded ({human_bytes(event.size)})"
        return f"{where}: downloading {human_bytes(event.size)}"
    if event.event == "bytes":
        return f"{where}: {human_bytes(event.done)} / {human_bytes(event.size)}"
    if event.event == "layer-done":
        return f"{where}: {human_bytes(event.size)} verified"
    if event.event == "unpacked":
        return f"{where}: unpacked in {event.seconds:.2f} s"
    if event.event == "done":
        return f"{event.name}: pulled in {event.seconds:.1f} s ({human_bytes(event.size)} unpacked)"
    return f"{event.event}: {event.ref}"


class LinePrinter:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, event: PullEvent) -> None:
        print(describe(event), file=self.out, flush=True)


class JsonPrinter:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, event: PullEvent) -> None:
        print(json.dumps(dataclasses.asdict(event)), file=self.out, flush=True)


class TerminalPrinter:
    """One line per layer, rewritten in place (ANSI cursor-up) as bytes arrive."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.rows: dict[int, str] = {}
        self.drawn = 0

    def __call__(self, event: PullEvent) -> None:
        if event.layer == 0:
            self._redraw()
            print(describe(event), file=self.out, flush=True)
            self.drawn = 0
            return
        text = describe(event)
        if event.event == "bytes" and event.size:
            filled = int(20 * event.done / event.size)
            text += f" [{'#' * filled}{'.' * (20 - filled)}]"
        self.rows[event.layer] = text
        self._redraw()

    def _redraw(self) -> None:
        if self.drawn:
            self.out.write(f"\x1b[{self.drawn}F")
        for layer in sorted(self.rows):
            self.out.write(f"\x1b[2K{self.rows[layer]}\n")
        self.drawn = len(self.rows)
        if self.drawn == 0:
            return
        self.out.flush()


def printer_for(out: TextIO, *, as_json: bool) -> LinePrinter | JsonPrinter | TerminalPrinter:
    if as_json:
        return JsonPrinter(out)
    return TerminalPrinter(out) if out.isatty() else LinePrinter(out)
