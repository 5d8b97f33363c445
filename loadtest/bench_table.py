"""Render ``make bench``'s JSON as the headline table of docs/benchmarks.md.

    flock /tmp/orchard-heavy.lock .venv/bin/python loadtest/bench.py > bench.json
    .venv/bin/python loadtest/bench_table.py bench.json

So the table in the docs is the run's own numbers, not retyped ones.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _ms(d: dict[str, Any] | None, key: str = "p50_ms") -> str:
    return "-" if not d or key not in d else f"{d[key]:.3f} ms"


def _row(name: str, d: dict[str, Any] | None, target: str = "") -> str:
    return f"| {name} | {_ms(d)} | {_ms(d, 'p90_ms')} | {_ms(d, 'p99_ms')} | {target} |"


def _met(result: dict[str, Any], name: str) -> str:
    t = result.get("targets", {}).get(name)
    if t is None:
        return ""
    return f"{t['target']}: {'met' if t['met'] else '**missed**'}"


_UNITS = {
    "upload_MBps": ("file up", "MB/s"),
    "download_MBps": ("file down", "MB/s"),
    "upload_files_per_s": ("tree up", "files/s"),
    "download_files_per_s": ("tree down", "files/s"),
}


def _figure(key: str, value: float) -> str:
    what, unit = _UNITS[key]
    return f"{what} {value} {unit}"


def render(result: dict[str, Any]) -> str:
    orch = result.get("orchard", {})
    sw = result.get("swerex", {})
    dk = result.get("docker", {})
    proxy = orch.get("proxy", {})
    lines = [
        "| path (command `true`, warm connection) | p50 | p90 | p99 | target |",
        "|---|---|---|---|---|",
        _row('floor: `subprocess.run(["/bin/true"])`', result.get("floor_subprocess_true")),
        _row(
            '**Orchard `sb.exec(["true"])`** (SDK -> node executor -> runc sandbox)',
            orch.get("exec"),
            f"{_met(result, 'exec_p50_ms')}; p99 {_met(result, 'exec_p99_ms')}",
        ),
        _row("SWE-ReX `execute`", sw.get("execute")),
        _row("`docker exec`", dk.get("exec")),
        _row(
            '**Orchard session `sh.run("true")`**',
            orch.get("session"),
            _met(result, "session_p50_ms"),
        ),
        _row("SWE-ReX bash session `run_in_session`", sw.get("session")),
        _row(
            "Orchard exec direct (A/B rounds, proxy section)",
            proxy.get("direct"),
        ),
        _row(
            "Orchard exec **through the gateway proxy** (same rounds)",
            proxy.get("proxy"),
            f"overhead {proxy.get('overhead_p50_ms', '-')} ms, "
            f"{_met(result, 'proxy_overhead_p50_ms')}",
        ),
        _row(
            "Orchard cold create (returns READY)",
            orch.get("create"),
            _met(result, "cold_create_p50_ms"),
        ),
        _row(
            "Orchard warm claim (`create(template=...)`, pool)",
            orch.get("warm_claim"),
            _met(result, "warm_claim_p50_ms"),
        ),
    ]
    out = ["\n".join(lines), ""]
    t1, t2 = orch.get("throughput", {}), orch.get("throughput_2proc", {})
    if t1:
        out.append(
            f"- 64 concurrent streams into one sandbox: **{t1['exec_per_s']} exec/s** from one "
            f"client process, **{t2.get('exec_per_s', '-')} exec/s** from 2 processes of 32 "
            f"({_met(result, 'exec_per_s_64_streams')}); failures "
            f"{t1['failures']} / {t2.get('failures', '-')}."
        )
    files = orch.get("files")
    if files:
        out.append(
            f"- Files through the SDK ({files['file_mib']} MiB file; {files['tree_files']}-file "
            f"tree; medians of {files['repeat']}): write **{files['write_MBps']['median']} MB/s**, "
            f"read **{files['read_MBps']['median']} MB/s**, upload "
            f"**{files['upload_files_per_s']['median']} files/s**, download "
            f"**{files['download_files_per_s']['median']} files/s** (targets 300 MB/s and "
            "20,000 files/s each way)."
        )
    peer_files = [
        f"{name}: " + ", ".join(_figure(k, v) for k, v in figures.items() if k in _UNITS)
        for name, figures in (("SWE-ReX `upload`", sw.get("files")), ("`docker cp`", dk.get("cp")))
        if figures
    ]
    if peer_files:
        out.append("- Peers' files, same run: " + "; ".join(peer_files) + ".")
    ratios = result.get("ratios", {})
    if ratios:
        out.append(
            "- Ratios in this run: "
            + ", ".join(f"{k.replace('_', ' ')} = **{v}x**" for k, v in ratios.items())
            + "."
        )
    out.append(
        f"- Load average before / after Orchard's figures: {result.get('loadavg_before')} / "
        f"{result.get('loadavg_after')} (2 cores)."
    )
    return "\n".join(out)


def main() -> None:
    with open(sys.argv[1]) as f:
        print(render(json.load(f)))


if __name__ == "__main__":
    main()
