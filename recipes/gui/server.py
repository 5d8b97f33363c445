"""The browser server that runs INSIDE a browser sandbox (stdlib + Playwright, Python 3.11).

The driver (``browser.BrowserEnv``) uploads this file and starts it as a background
process; it is not imported on the driver side (no Playwright there). It:

- launches Debian's ``/usr/bin/chromium`` through Playwright's ``executable_path`` with
  ``--headless --no-sandbox --disable-gpu --disable-background-networking
  --disable-component-update --disable-sync --no-first-run --disable-dev-shm-usage``.
  Playwright gives every launch a fresh temporary ``--user-data-dir`` (it refuses one in
  ``args``), and every ``/reset`` opens a new browser context, so no cookies, storage or
  history leak from one episode to the next;
- serves the MiniWoB++ HTML folder on ``127.0.0.1:<static port>`` (stdlib static server in
  a thread; the sandbox has no network, everything is local);
- answers JSON over HTTP/1.1 (keep-alive) on ``127.0.0.1:<port>``, one request at a time on
  the main thread (Playwright's sync API is not thread-safe):

  ``POST /reset`` ``{"miniwob": name | null, "url": url | null, "utterance": str,
  "seed": int | null, "episode_seconds": float | null, "width": int, "height": int,
  "scale": float, "axtree": bool}``; ``POST /step`` ``{"name": tool, "arguments": {...}}``;
  ``POST /observe`` ``{}``; ``POST /close`` ``{}`` (then the process exits); ``GET /health``.

  200: an observation ``{"png": base64, "url", "utterance", "elements": [...], "task":
  {"done", "reward", "raw_reward", "reason", "episode"} | null, "axtree", "action_error"}``.
  400 ``{"error": "bad_request" | "bad_action", "message"}``: the request or the action is
  wrong (a key Playwright does not know, ...). 503 ``{"error": "browser_crashed",
  "message"}``: the browser or the episode's page is gone (Chromium disconnected; the page
  crashed, i.e. its renderer process died, killed or out of the sandbox's memory, while the
  browser process lives on); the driver aborts the rollout. This is latched: once seen,
  every later request (a ``/reset`` too) answers the same 503, because a fresh context
  would hide a fault that the sandbox (its memory cap) may cause again, and the episode it
  hit cannot be scored.

MiniWoB's ground truth is read the way the ``miniwob`` package reads it
(``selenium_instance.py``): ``WOB_DONE_GLOBAL``, ``WOB_RAW_REWARD_GLOBAL``,
``WOB_REWARD_REASON`` after ``core.startEpisodeReal()``. The first finished episode after a
reset is latched: MiniWoB shows its START cover again when an episode ends, and a click on
it would start a new episode and overwrite the globals.
"""

from __future__ import annotations

import argparse
import base64
import functools
import http.server
import json
import re
import sys
import threading
import time
from typing import Any

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]
MAX_BODY = 1 << 20
MAX_ELEMENTS = 400
NAVIGATION_RETRIES = 5
PROBE_SECONDS = 2.0
PAGE_CRASHED = (
    "the page crashed: Chromium's renderer process for it died (killed, or out of the "
    "sandbox's memory); the browser lives on but the episode cannot"
)
DISCONNECTED = "chromium is not running (the browser disconnected)"
# Playwright's words for a call on a crashed page ("Mouse.click: Target crashed",
# "Page.goto: Navigation failed because page crashed!"), for when the error comes before the
# event. Anchored after the API name, so an error a page throws into our own evaluations
# ("Page.evaluate: Error: page crashed") does not pass for one.
CRASH_WORDS = re.compile(
    r"^(?:[\w.]+: )?(?:Target crashed|Page crashed|Navigation failed because page crashed)"
)

ELEMENTS_JS = r"""
(maxElements) => {
  const W = window.innerWidth, H = window.innerHeight, out = [];
  const clamp = (v, hi) => Math.min(Math.max(v, 0), hi);
  const TAGS = ['a','button','input','textarea','select','option','label'];
  for (const el of document.querySelectorAll('body *')) {
    if (out.length >= maxElements) break;
    const r = el.getBoundingClientRect();
    if (r.width <= 0 || r.height <= 0) continue;
    if (r.right <= 0 || r.bottom <= 0 || r.left >= W || r.top >= H) continue;
    const st = getComputedStyle(el);
    if (st.visibility === 'hidden' || st.display === 'none' || parseFloat(st.opacity) === 0)
      continue;
    const tag = el.tagName.toLowerCase();
    const interactive = TAGS.includes(tag) || el.hasAttribute('onclick') ||
      el.hasAttribute('role') || el.hasAttribute('tabindex');
    let own = '';
    for (const n of el.childNodes) if (n.nodeType === 3) own += n.textContent;
    own = own.replace(/\s+/g, ' ').trim();
    if (!interactive && !own) continue;
    const cx = clamp((r.left + r.right) / 2, W - 1), cy = clamp((r.top + r.bottom) / 2, H - 1);
    const hit = document.elementFromPoint(cx, cy);
    if (hit !== null && hit !== el && !el.contains(hit) && !hit.contains(el)) continue;
    let text = own;
    if (interactive) {
      text = (el.innerText || '').replace(/\s+/g, ' ').trim();
      if (!text && el.labels && el.labels.length) text = el.labels[0].innerText.trim();
      if (!text && (tag === 'input' || tag === 'textarea')) text = el.placeholder || '';
      if (!text && el.parentElement && el.parentElement.tagName.toLowerCase() === 'label')
        text = el.parentElement.innerText.trim();
    }
    out.push({
      tag: tag, id: el.id || '', type: (el.getAttribute('type') || '').toLowerCase(),
      text: text.slice(0, 200), interactive: interactive,
      value: ('value' in el && typeof el.value === 'string') ? el.value.slice(0, 200) : null,
      checked: ('checked' in el && (tag === 'input')) ? !!el.checked : null,
      box: [clamp(r.left, W) / W, clamp(r.top, H) / H, clamp(r.right, W) / W,
            clamp(r.bottom, H) / H],
    });
  }
  return out;
}
"""

TASK_STATE_JS = """() => (typeof WOB_DONE_GLOBAL === 'undefined') ? null : {
  done: WOB_DONE_GLOBAL, reward: WOB_REWARD_GLOBAL, raw_reward: WOB_RAW_REWARD_GLOBAL,
  reason: (WOB_REWARD_REASON === null || WOB_REWARD_REASON === undefined) ? null : String(WOB_REWARD_REASON),
  episode: WOB_EPISODE_ID }"""


def _target_closed(err: PlaywrightError) -> bool:
    """A ``TargetClosedError`` (the page, context or browser closed under the call; also the
    Playwright driver gone). Matched by name: Playwright 1.65's ``sync_api`` does not export it."""
    return any(cls.__name__ == "TargetClosedError" for cls in type(err).__mro__)


class BadRequest(Exception):
    """The request (or the action in it) is malformed: HTTP 400."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error


class Crashed(Exception):
    """The browser or the episode's page is gone: HTTP 503 (``Browser.lost`` says why)."""


class Browser:
    """One Chromium, one context and page per episode."""

    def __init__(self, chromium: str, static_origin: str) -> None:
        self.static_origin = static_origin
        self.pw = sync_playwright().start()
        self.browser = self.pw.chromium.launch(
            executable_path=chromium, args=CHROMIUM_FLAGS, headless=True
        )
        self.context: Any = None
        self.page: Any = None
        self.viewport = (160, 210)
        self.utterance = ""
        self.axtree = False
        self.latched: dict[str, Any] | None = None
        self.start_episode = 0
        self.miniwob = False
        # Why no episode can be served any more; once set, every request answers 503 with it.
        self.lost: str | None = None
        self.browser.on("disconnected", lambda _: self._lose(DISCONNECTED))

    def _lose(self, reason: str) -> None:
        """Latch the first fault (the events run on the main thread, inside a Playwright call)."""
        if self.lost is None:
            self.lost = reason

    def check_alive(self) -> None:
        if self.lost is None and not self.browser.is_connected():
            self._lose(DISCONNECTED)
        if self.lost is not None:
            raise Crashed(self.lost)

    def lost_by(self, err: PlaywrightError) -> str | None:
        """Why ``err`` means the browser or the page is gone (latched), or None if it does not.

        The page's "crash" event usually arrives with the error (Playwright delivers events in
        order, during the call that failed); the error's type and words cover the rest: a call
        on a crashed or closed page fails with ``TargetClosedError`` or "Target crashed".
        """
        if self.lost is None and not self.browser.is_connected():
            self._lose(DISCONNECTED)
        first = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
        if self.lost is None and CRASH_WORDS.search(first):
            self._lose(PAGE_CRASHED)
        if self.lost is None and _target_closed(err):
            self._lose(f"the page, its context or the browser was closed ({first})")
        return self.lost

    def reset(self, req: dict[str, Any]) -> dict[str, Any]:
        width, height = int(req.get("width", 160)), int(req.get("height", 210))
        scale = float(req.get("scale", 1.0))
        if not (50 <= width <= 4000 and 50 <= height <= 4000 and 0.5 <= scale <= 4):
            raise BadRequest("bad_request", "viewport out of range")
        self.check_alive()
        if self.context is not None:
            self.probe_page()
            old, self.context, self.page = self.context, None, None
            old.close()
            self.check_alive()
        self.viewport = (width, height)
        self.context = self.browser.new_context(
            viewport={"width": width, "height": height}, device_scale_factor=scale
        )
        self.page = self.context.new_page()
        self.page.on("crash", lambda _: self._lose(PAGE_CRASHED))
        self.axtree = bool(req.get("axtree", False))
        self.latched = None
        name, url = req.get("miniwob"), req.get("url")
        if isinstance(name, str) and url is None:
            self.miniwob = True
            self.page.goto(f"{self.static_origin}/miniwob/{name}.html")
            self.page.wait_for_selector("#sync-task-cover", state="visible", timeout=10_000)
            seed = req.get("seed")
            if seed is not None:
                self.page.evaluate("(s) => Math.seedrandom(s)", seed)
            seconds = req.get("episode_seconds")
            if seconds is not None:
                self.page.evaluate("(ms) => { core.EPISODE_MAX_TIME = ms; }", float(seconds) * 1000)
            self.page.evaluate("() => core.startEpisodeReal()")
            self.page.wait_for_function("() => WOB_TASK_READY === true", timeout=10_000)
            self.start_episode = int(self.page.evaluate("() => WOB_EPISODE_ID"))
            self.utterance = str(self.page.evaluate("() => core.getUtterance()"))
        elif isinstance(url, str) and name is None:
            self.miniwob = False
            self.page.goto(url)
            self.utterance = str(req.get("utterance", ""))
        else:
            raise BadRequest("bad_request", "reset needs exactly one of miniwob or url")
        return self.observe()

    def probe_page(self) -> None:
        """Ask the episode's page one question before a reset closes it, so that a renderer
        that died since the last request is reported (Crashed), not hidden under the new
        context: closing the context first drops the page's crash event when Chromium has
        not reported it yet (seen). A page too busy to answer within ``PROBE_SECONDS`` (a
        script in an endless loop) is closed as before."""
        try:
            self.page.wait_for_function("() => true", timeout=PROBE_SECONDS * 1000)
        except PlaywrightError as err:
            lost = self.lost_by(err)
            if lost is not None:
                raise Crashed(lost) from None

    def task_state(self) -> dict[str, Any] | None:
        if not self.miniwob:
            return None
        if self.latched is not None:
            self.hide_cover()  # a task may have shown it again since
            return self.latched
        state = self.page.evaluate(TASK_STATE_JS)
        if state is None:
            return None
        if state["done"] or int(state["episode"]) > self.start_episode:
            self.latched = state | {"done": True}
            self.hide_cover()
        return self.latched or state

    def hide_cover(self) -> None:
        """Hide the START cover MiniWoB shows when an episode ends: the screenshot then
        shows the page as the agent left it (what a judge must see), and a click can not
        start a new episode behind the latch."""
        self.page.evaluate(
            "() => { if (typeof core !== 'undefined' && core.cover_div) "
            "core.cover_div.style.display = 'none'; }"
        )

    def observe(self, action_error: str | None = None) -> dict[str, Any]:
        self.check_alive()
        if self.page is None:
            raise BadRequest("bad_request", "no episode: call /reset first")
        for attempt in range(NAVIGATION_RETRIES):
            try:
                task = self.task_state()  # before the screenshot: the latch sees the end first
                elements = self.page.evaluate(ELEMENTS_JS, MAX_ELEMENTS)
                png = self.page.screenshot(type="png")
                axtree = self.page.locator("body").aria_snapshot() if self.axtree else None
                break
            except PlaywrightError as err:
                # A navigation (a link, a failed load's error page committing late) replaced
                # the page under the evaluation: wait for the new one, then look again.
                lost = self.lost_by(err)
                if lost is not None:
                    raise Crashed(lost) from None
                if "context was destroyed" not in str(err) or attempt == NAVIGATION_RETRIES - 1:
                    raise
                self.page.wait_for_load_state("domcontentloaded", timeout=10_000)
        return {
            "png": base64.b64encode(png).decode(),
            "url": self.page.url,
            "utterance": self.utterance,
            "elements": elements,
            "task": task,
            "axtree": axtree,
            "action_error": action_error,
        }

    def step(self, req: dict[str, Any]) -> dict[str, Any]:
        self.check_alive()
        if self.page is None:
            raise BadRequest("bad_request", "no episode: call /reset first")
        name, args = req.get("name"), req.get("arguments") or {}
        if not isinstance(args, dict):
            raise BadRequest("bad_action", "arguments must be an object")
        w, h = self.viewport
        mouse, keyboard = self.page.mouse, self.page.keyboard
        error = None
        try:
            if name == "click":
                mouse.click(float(args["x"]) * w, float(args["y"]) * h)
            elif name == "type":
                if args.get("x") is not None:
                    mouse.click(float(args["x"]) * w, float(args["y"]) * h)
                keyboard.type(str(args["text"]))
            elif name == "scroll":
                amount = float(args.get("amount", 0.5))
                dx = {"left": -1, "right": 1}.get(str(args["direction"]), 0) * amount * w
                dy = {"up": -1, "down": 1}.get(str(args["direction"]), 0) * amount * h
                mouse.move(w / 2, h / 2)
                mouse.wheel(dx, dy)
            elif name == "key":
                keyboard.press(str(args["key"]))
            elif name == "navigate":
                try:
                    self.page.goto(str(args["url"]), timeout=15_000)
                except PlaywrightError as err:
                    lost = self.lost_by(err)  # "navigation failed because page crashed"
                    if lost is not None:
                        raise Crashed(lost) from None
                    error = f"navigation failed: {str(err).splitlines()[0][:300]}"
            elif name == "back":
                self.page.go_back(timeout=15_000)
            elif name == "wait":
                self.page.wait_for_timeout(min(float(args["seconds"]), 10.0) * 1000)
            elif name == "done":
                pass
            else:
                raise BadRequest("bad_action", f"unknown action {name!r}")
        except (KeyError, TypeError, ValueError) as err:
            raise BadRequest("bad_action", f"{name}: malformed arguments ({err})") from None
        except PlaywrightError as err:
            # A crashed page refuses every input ("Target crashed"): that is the browser's
            # fault, not the action's, so it must not come back as a bad action.
            lost = self.lost_by(err)
            if lost is not None:
                raise Crashed(lost) from None
            raise BadRequest("bad_action", f"{name}: {str(err).splitlines()[0][:300]}") from None
        # Let event handlers and a repaint run before the screenshot.
        self.page.wait_for_timeout(30)
        return self.observe(error)

    def close(self) -> None:
        try:
            self.browser.close()
        finally:
            self.pw.stop()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    browser: Browser

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, {"ok": True, "browser": self.browser.browser.is_connected(),
                             "lost": self.browser.lost})  # fmt: skip
        else:
            self._send(404, {"error": "bad_request", "message": f"no route {self.path}"})

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length", "0"))
            if not 0 <= length <= MAX_BODY:
                raise BadRequest("bad_request", "body too large")
            try:
                req = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                raise BadRequest("bad_request", "body is not JSON") from None
            if not isinstance(req, dict):
                raise BadRequest("bad_request", "body must be a JSON object")
            if self.path == "/reset":
                self._send(200, self.browser.reset(req))
            elif self.path == "/step":
                self._send(200, self.browser.step(req))
            elif self.path == "/observe":
                self._send(200, self.browser.observe())
            elif self.path == "/close":
                self._send(200, {"ok": True})
                threading.Thread(target=self.server.shutdown, daemon=True).start()
            else:
                raise BadRequest("bad_request", f"no route {self.path}")
        except BadRequest as err:
            self._send(400, {"error": err.error, "message": str(err)})
        except Crashed as err:
            self._send(503, {"error": "browser_crashed", "message": str(err)})
        except PlaywrightError as err:
            lost = self.browser.lost_by(err)
            if lost is not None:
                self._send(503, {"error": "browser_crashed", "message": lost})
            else:
                message = str(err).splitlines()[0][:500] if str(err) else type(err).__name__
                self._send(500, {"error": "server_error", "message": message})


def _static_server(directory: str) -> http.server.ThreadingHTTPServer:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=directory)
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--miniwob-dir", default="/opt/orchard-gui/miniwob")
    args = parser.parse_args()
    started = time.monotonic()
    static = _static_server(args.miniwob_dir)
    Handler.browser = Browser(args.chromium, f"http://127.0.0.1:{static.server_address[1]}")
    server = http.server.HTTPServer(("127.0.0.1", args.port), Handler)
    print(f"ready in {time.monotonic() - started:.2f}s on {args.port}", flush=True)
    try:
        server.serve_forever()
    finally:
        Handler.browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
