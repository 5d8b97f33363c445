"""The prompt text that tells an agent with a shell how to call the services over HTTP."""

from __future__ import annotations

from typing import Any


def usage_text(base: str, tools: list[dict[str, Any]]) -> str:
    lines = [
        f"Your tools are served over HTTP at {base} (JSON in, JSON out):",
        f"  list them:  curl -s {base}/v1/tools",
        f"  call one:   curl -s -X POST {base}/v1/tools/<name> -H 'Content-Type: application/json' "
        "-d '<arguments as a JSON object>'",
        "Tools:",
    ]
    for tool in tools:
        fn = tool["function"]
        params = ", ".join(fn.get("parameters", {}).get("properties", {}))
        lines.append(f"  {fn['name']}({params}): {fn.get('description', '')}")
    return "\n".join(lines)
