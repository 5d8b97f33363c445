"""The web search service: search a fixed corpus of pages, fetch one by URL.

Ranking is TF-IDF over title (weighted x3) and text, on lower-cased word tokens: small,
deterministic and good enough for a corpus of tens of pages. Only corpus pages exist: any
other URL is ``not_found`` (the sandbox has no network; nothing is fetched for real).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections import Counter
from typing import Any

from .core import Call, Tool, ToolError, schema, string

WORD = re.compile(r"[a-z0-9]+")
SNIPPET = 240
MAX_FETCH = 50_000


def _words(text: str) -> list[str]:
    return WORD.findall(text.lower())


class Web:
    service = "web"

    def __init__(self, fixture: dict[str, Any], now: dt.datetime) -> None:
        self.pages = {p["url"]: {"url": p["url"], "title": p["title"], "text": p["text"]}
                      for p in fixture.get("pages") or []}  # fmt: skip
        self.counts = {
            url: Counter(_words(p["title"]) * 3 + _words(p["text"]))
            for url, p in self.pages.items()
        }
        df: Counter[str] = Counter()
        for counts in self.counts.values():
            df.update(counts.keys())
        n = max(1, len(self.pages))
        self.idf = {w: math.log(1 + n / c) for w, c in df.items()}
        self.fetched: list[str] = []
        self.searches: list[str] = []

    def _snippet(self, text: str, terms: list[str]) -> str:
        flat = " ".join(text.split())
        lower = flat.lower()
        at = min((i for i in (lower.find(t) for t in terms) if i >= 0), default=0)
        start = max(0, at - SNIPPET // 3)
        return ("..." if start else "") + flat[start : start + SNIPPET]

    def search(self, call: Call) -> dict[str, Any]:
        terms = _words(call.arguments["query"])
        if not terms:
            raise ToolError("invalid_arguments", "query: give at least one word")
        self.searches.append(call.arguments["query"])
        scored = []
        for url, counts in self.counts.items():
            total = sum(counts.values()) or 1
            score = sum(counts[t] / total * self.idf.get(t, 0.0) for t in terms)
            if score > 0:
                scored.append((score, url))
        scored.sort(key=lambda x: (-x[0], x[1]))
        results = [
            {"url": url, "title": self.pages[url]["title"],
             "snippet": self._snippet(self.pages[url]["text"], terms)}
            for _, url in scored[: call.arguments.get("limit", 5)]
        ]  # fmt: skip
        return {"query": call.arguments["query"], "results": results}

    def fetch(self, call: Call) -> dict[str, Any]:
        url = call.arguments["url"]
        page = self.pages.get(url) or self.pages.get(url.rstrip("/")) or self.pages.get(url + "/")
        if page is None:
            raise ToolError("not_found", f"no page at {url[:200]!r} (only search results exist)")
        self.fetched.append(page["url"])
        text = page["text"]
        more = len(text) > MAX_FETCH
        return {
            "url": page["url"],
            "title": page["title"],
            "text": text[:MAX_FETCH],
            "truncated": more,
        }

    def state(self) -> dict[str, Any]:
        return {
            "pages": len(self.pages),
            "searches": list(self.searches),
            "fetched": list(self.fetched),
        }

    def tools(self) -> list[Tool]:
        return [
            Tool("web_search", self.service, "Search the web; results with URL, title, snippet.",
                 schema({"query": string("Search terms.", 500, minLength=1),
                         "limit": {"type": "integer", "minimum": 1, "maximum": 20,
                                   "description": "At most this many (default 5)."}},
                        ("query",)),
                 self.search),
            Tool("web_fetch", self.service, "Fetch a page's text by its URL.",
                 schema({"url": string("The page's URL (from web_search).", 2000, minLength=1)},
                        ("url",)),
                 self.fetch),
        ]  # fmt: skip
