"""The SDK's everyday path, run by a test venv's own interpreter (``python -I``).

Against a real stack (``ORCHARD_HOME`` says where its endpoint and key are):
create, exec (sync and asyncio), write and read a file, delete, and wait for
the deletion to finish. It imports nothing but the installed SDK, so the venv
holding only ``orchard-env`` and its dependencies is what is tested. Prints one
JSON object (what ran, on what, and which top-level modules got imported) for
the test to check; any failure is a traceback and a non-zero exit.
"""

import asyncio
import json
import platform
import sys
import time

import google.protobuf
import grpc

import orchard
from orchard import AsyncOrchard, Sandbox

PAYLOAD = bytes(range(256)) * 257  # not a multiple of any chunk size


async def async_exec(sandbox_id: str) -> bytes:
    async with AsyncOrchard() as client:
        sb = await client.sandboxes.connect(sandbox_id)
        result = await sb.exec(["sh", "-c", "echo async; exit 4"], timeout=30)
        assert result.exit_code == 4, result
        return result.stdout


def main() -> None:
    with Sandbox.create(ttl=300) as sb:
        result = sb.exec(["python3", "-c", "print(6 * 7)"], timeout=30)
        written = sb.write_file("/work/smoke.bin", PAYLOAD)
        read_back = sb.read_file("/work/smoke.bin")
        async_stdout = asyncio.run(async_exec(sb.id))
    # The delete answers at "deleting"; the background teardown then makes it "deleted".
    deadline = time.monotonic() + 30
    state = Sandbox.connect(sb.id).last_info.state
    while state == "deleting" and time.monotonic() < deadline:
        time.sleep(0.05)
        state = Sandbox.connect(sb.id).last_info.state
    report = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "grpcio": grpc.__version__,
        "protobuf": google.protobuf.__version__,
        "orchard": orchard.__version__,
        "orchard_file": orchard.__file__,
        "exit_code": result.exit_code,
        "stdout": result.stdout.decode(),
        "written": written,
        "read_back_matches": read_back == PAYLOAD,
        "async_stdout": async_stdout.decode(),
        "final_state": state,
        "modules": sorted({name.split(".")[0] for name in sys.modules}),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
