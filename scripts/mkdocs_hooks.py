"""mkdocs hook: the Sphinx roles of our docstrings as links in the SDK reference.

The SDK's docstrings name other objects the Sphinx way (``:class:`TLS```,
``:meth:`Sandboxes.create```), which mkdocstrings renders as the role's text
followed by the code. This turns each ``:role:<code>Name</code>`` of a page into
a link to that object's entry on the same page (mkdocstrings gives every
documented object the id ``orchard.<Name>``), or into the bare code when the
page has no such entry (a private module, a builtin). Kept as a hook rather
than rewriting the docstrings, which read well as they are in an editor and in
``help()``.
"""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:class|meth|attr|func|data|exc|mod|obj):<code>~?([^<]+)</code>")
ANCHOR = re.compile(r'id="(orchard\.[A-Za-z0-9_.]+)"')


def on_page_content(html: str, **_: Any) -> str:
    anchors = set(ANCHOR.findall(html))

    def link(match: re.Match[str]) -> str:
        name = match.group(1).removeprefix("orchard.").removeprefix("client.")
        target = f"orchard.{name}"
        if target in anchors:
            return f'<a href="#{target}"><code>{name}</code></a>'
        return f"<code>{name}</code>"

    return ROLE.sub(link, html)
