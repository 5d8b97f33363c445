"""The prompt text that tells an agent with a shell how to call the services."""

from __future__ import annotations

from typing import Any


def usage_text(command: str, base: str, tools: list[dict[str, Any]]) -> str:
    lines = [
        "Your tools are mock services in this machine, called from the shell:",
        f"  {command} <tool> '<arguments as a JSON object>'   (prints the JSON answer)",
        f"  {command} tools                                    (lists them)",
        f"(or HTTP: POST {base}/v1/tools/<tool> with the arguments as a JSON body).",
        "Tools:",
    ]
    for tool in tools:
        fn = tool["function"]
        params = fn.get("parameters", {})
        required = set(params.get("required", []))
        names = [p if p in required else f"{p}?" for p in params.get("properties", {})]
        lines.append(f"  {fn['name']}({', '.join(names)}): {fn.get('description', '')}")
    return "\n".join(lines)
