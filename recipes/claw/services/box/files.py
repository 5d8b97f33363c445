"""The files service: list, read, write, delete files under one folder of the sandbox.

Nothing outside the root is reachable through it, whatever the path or the links an agent
with a shell plants there: a path is relative (``a/b.txt``; a leading ``/`` is read as
the root's), has no ``..``, ``.``, empty part or NUL, and is walked one component at a
time from a descriptor of the root with ``O_NOFOLLOW`` (and ``O_DIRECTORY`` for folders),
so a symbolic link anywhere on the way (or as the target) is refused, not followed. The
root itself is opened the same way from ``/``. Sizes are bounded: one file read or written
at most :data:`MAX_FILE` bytes, the whole tree :data:`MAX_TOTAL` bytes and
:data:`MAX_ENTRIES` entries.

The state a grader reads is the tree as it is now (the agent's shell may have changed it
too): each regular file's size, sha256 and (UTF-8 text up to 64 KiB) content; links and
other kinds are reported as what they are, never followed.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import os
import shutil
import stat
from collections.abc import Iterator
from typing import Any

from .core import Call, Tool, ToolError, boolean, schema, string

MAX_FILE = 1 << 20
MAX_TOTAL = 64 << 20
MAX_ENTRIES = 5000
MAX_PATH = 1024
STATE_TEXT = 64 << 10
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def split(path: str) -> list[str]:
    """The components of an agent's path under the root ([] is the root itself)."""
    if not isinstance(path, str) or "\0" in path or len(path) > MAX_PATH:
        raise ToolError("invalid_arguments", "path: not a usable path")
    parts = [p for p in path.strip().lstrip("/").split("/")]
    if parts == [""] or parts == ["."]:
        return []
    if any(p in ("", ".", "..") for p in parts):
        raise ToolError(
            "forbidden", f"path {path[:200]!r}: '..', '.' and empty parts are not allowed"
        )
    if any(len(p.encode("utf-8", "surrogatepass")) > 255 for p in parts):
        raise ToolError("invalid_arguments", "path: a name is longer than 255 bytes")
    return parts


def _os_errors(method: Any) -> Any:
    """An operation whose OS error (a race with the agent's shell, a full disk) is told to
    the agent as a tool error, not a crash of the service."""

    def run(self: Files, call: Call) -> Any:
        try:
            return method(self, call)
        except OSError as err:
            raise ToolError("forbidden", f"{err.strerror or err}") from None

    run.__name__ = method.__name__
    return run


def _open_dir(parent: int, name: str, create: bool = False) -> int:
    try:
        return os.open(name, _DIR, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise ToolError("not_found", f"no folder {name!r}") from None
        os.mkdir(name, 0o755, dir_fd=parent)
        return os.open(name, _DIR, dir_fd=parent)
    except (NotADirectoryError, OSError) as err:
        if _is_link(parent, name):
            raise ToolError("forbidden", f"{name!r} is a symbolic link: not followed") from None
        if isinstance(err, NotADirectoryError):
            raise ToolError("conflict", f"{name!r} is not a folder") from None
        raise ToolError("forbidden", f"{name!r}: {err.strerror}") from None


def _is_link(parent: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False


class Files:
    service = "files"

    def __init__(self, fixture: dict[str, Any], now: dt.datetime) -> None:
        self.root = str(fixture.get("root") or "/workspace/files")
        self._make_root()
        self._empty_root()
        for f in fixture.get("files") or []:
            data = (
                f["text"].encode() if f.get("text") is not None else base64.b64decode(f["base64"])
            )
            self._write(split(f["path"]), data)

    # ---- the root ------------------------------------------------------------------

    def _make_root(self) -> None:
        fd = os.open("/", _DIR)
        try:
            for part in self.root.strip("/").split("/"):
                child = _open_dir(fd, part, create=True)
                os.close(fd)
                fd = child
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _root(self) -> Iterator[int]:
        fd = os.open("/", _DIR)
        try:
            for part in self.root.strip("/").split("/"):
                try:
                    child = _open_dir(fd, part)
                except ToolError as err:
                    raise ToolError(
                        "not_found", f"the files root {self.root} is gone: {err.message}"
                    ) from None
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    def _empty_root(self) -> None:
        with self._root() as fd:
            for name in os.listdir(fd):
                if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    shutil.rmtree(name, dir_fd=fd)  # fd-based: does not follow links
                else:
                    os.unlink(name, dir_fd=fd)

    @contextlib.contextmanager
    def _parent(self, parts: list[str], create: bool = False) -> Iterator[int]:
        """A descriptor of the folder holding ``parts[-1]``."""
        with self._root() as root:
            fd = os.dup(root)
            try:
                for part in parts[:-1]:
                    child = _open_dir(fd, part, create=create)
                    os.close(fd)
                    fd = child
                yield fd
            finally:
                os.close(fd)

    def _walk(
        self, fd: int, prefix: str, depth: int = 0
    ) -> Iterator[tuple[str, os.stat_result, int]]:
        """(relative path, lstat, parent fd) of every entry under ``fd``, folders first."""
        if depth > 32:
            return
        for name in sorted(os.listdir(fd)):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            path = f"{prefix}{name}"
            yield path, st, fd
            if stat.S_ISDIR(st.st_mode):
                child = os.open(name, _DIR, dir_fd=fd)
                try:
                    yield from self._walk(child, path + "/", depth + 1)
                finally:
                    os.close(child)

    def _usage(self) -> tuple[int, int]:
        total = count = 0
        with self._root() as fd:
            for _, st, _ in self._walk(fd, ""):
                count += 1
                total += st.st_size if stat.S_ISREG(st.st_mode) else 0
        return total, count

    def _write(self, parts: list[str], data: bytes) -> bool:
        """Write a file; True when it replaced one."""
        if not parts:
            raise ToolError("invalid_arguments", "path: name a file, not the root")
        with self._parent(parts, create=True) as fd:
            name = parts[-1]
            existed = False
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    raise ToolError(
                        "conflict", f"{'/'.join(parts)!r} exists and is not a regular file"
                    )
                existed = True
            except FileNotFoundError:
                pass
            temp = f".{name}.claw-tmp"
            out = os.open(
                temp,
                os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644,
                dir_fd=fd,
            )
            try:
                _write_all(out, data)
            finally:
                os.close(out)
            os.replace(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
            return existed

    # ---- operations -----------------------------------------------------------------

    @_os_errors
    def listing(self, call: Call) -> dict[str, Any]:
        parts = split(call.arguments.get("path", ""))
        recursive = call.arguments.get("recursive", False)
        with self._root() as root:
            fd = os.dup(root)
            try:
                for part in parts:
                    child = _open_dir(fd, part)
                    os.close(fd)
                    fd = child
                prefix = "/".join(parts) + "/" if parts else ""
                entries = []
                if recursive:
                    walked = self._walk(fd, prefix)
                else:
                    walked = ((f"{prefix}{n}", os.stat(n, dir_fd=fd, follow_symlinks=False), fd)
                              for n in sorted(os.listdir(fd)))  # fmt: skip
                for path, st, _ in walked:
                    entries.append({"path": path, "type": _kind(st.st_mode), "size": st.st_size})
                    if len(entries) >= 1000:
                        break
            finally:
                os.close(fd)
        return {
            "path": "/".join(parts) or ".",
            "entries": entries,
            "truncated": len(entries) >= 1000,
        }

    @_os_errors
    def read(self, call: Call) -> dict[str, Any]:
        parts = split(call.arguments["path"])
        if not parts:
            raise ToolError("invalid_arguments", "path: name a file, not the root")
        with self._parent(parts) as fd:
            try:
                handle = os.open(
                    parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd
                )
            except FileNotFoundError:
                raise ToolError("not_found", f"no file {'/'.join(parts)!r}") from None
            except OSError:
                kind = (
                    "a symbolic link: not followed" if _is_link(fd, parts[-1]) else "not readable"
                )
                raise ToolError("forbidden", f"{'/'.join(parts)!r} is {kind}") from None
            try:
                st = os.fstat(handle)
                if not stat.S_ISREG(st.st_mode):
                    raise ToolError(
                        "conflict", f"{'/'.join(parts)!r} is a {_kind(st.st_mode)}, not a file"
                    )
                if st.st_size > MAX_FILE:
                    raise ToolError(
                        "too_large",
                        f"{'/'.join(parts)!r} is {st.st_size} bytes (at most {MAX_FILE})",
                    )
                data = _read_all(handle, MAX_FILE + 1)[:MAX_FILE]
            finally:
                os.close(handle)
        try:
            return {"path": "/".join(parts), "size": len(data), "text": data.decode("utf-8")}
        except UnicodeDecodeError:
            return {
                "path": "/".join(parts),
                "size": len(data),
                "base64": base64.b64encode(data).decode(),
            }

    @_os_errors
    def write(self, call: Call) -> dict[str, Any]:
        parts = split(call.arguments["path"])
        data = call.arguments["content"].encode("utf-8")
        if len(data) > MAX_FILE:
            raise ToolError("too_large", f"content is {len(data)} bytes (at most {MAX_FILE})")
        total, count = self._usage()
        if total + len(data) > MAX_TOTAL or count + len(parts) > MAX_ENTRIES:
            raise ToolError(
                "too_large", f"the files folder is full ({MAX_TOTAL} bytes, {MAX_ENTRIES} entries)"
            )
        if call.arguments.get("append"):
            try:
                old = self.read(Call({"path": call.arguments["path"]}))
            except ToolError as err:
                if err.code != "not_found":
                    raise
                old = {"text": ""}
            if "text" not in old:
                raise ToolError("conflict", "append: the file is not UTF-8 text")
            data = old["text"].encode() + data
            if len(data) > MAX_FILE:
                raise ToolError(
                    "too_large", f"the file would be {len(data)} bytes (at most {MAX_FILE})"
                )
        replaced = self._write(parts, data)
        call.destructive = replaced and not call.arguments.get("append")
        return {"path": "/".join(parts), "size": len(data), "replaced": replaced}

    @_os_errors
    def delete(self, call: Call) -> dict[str, Any]:
        parts = split(call.arguments["path"])
        if not parts:
            raise ToolError("forbidden", "the root itself cannot be deleted")
        with self._parent(parts) as fd:
            try:
                st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                raise ToolError("not_found", f"no file {'/'.join(parts)!r}") from None
            if stat.S_ISDIR(st.st_mode):
                try:
                    os.rmdir(parts[-1], dir_fd=fd)
                except OSError:
                    raise ToolError(
                        "conflict", f"folder {'/'.join(parts)!r} is not empty"
                    ) from None
            else:
                os.unlink(parts[-1], dir_fd=fd)
        return {"path": "/".join(parts), "deleted": _kind(st.st_mode)}

    # ---- the service ----------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        files: dict[str, Any] = {}
        try:
            with self._root() as root:
                for path, st, parent in self._walk(root, ""):
                    name = path.rsplit("/", 1)[-1]
                    if stat.S_ISREG(st.st_mode):
                        files[path] = _describe_file(parent, name, st)
                    elif stat.S_ISLNK(st.st_mode):
                        files[path] = {
                            "type": "symlink",
                            "target": os.readlink(name, dir_fd=parent)[:MAX_PATH],
                        }
                    elif stat.S_ISDIR(st.st_mode):
                        files[path] = {"type": "folder"}
                    else:
                        files[path] = {"type": _kind(st.st_mode)}
                    if len(files) >= MAX_ENTRIES:
                        break
        except ToolError as err:
            return {"root": self.root, "error": err.message, "files": files}
        return {"root": self.root, "files": files}

    def tools(self) -> list[Tool]:
        path = string("Path relative to the files folder, e.g. reports/q1.txt.", MAX_PATH)
        return [
            Tool("files_list", self.service, "List a folder (default: the top), or all of it.",
                 schema({"path": path, "recursive": boolean("Everything below too.")}), self.listing),
            Tool("files_read", self.service, "Read a file (UTF-8 text, or base64 if binary).",
                 schema({"path": path}, ("path",)), self.read),
            Tool("files_write", self.service,
                 "Write a text file (folders are created; an existing file is replaced unless "
                 "append is true).",
                 schema({"path": path, "content": string("The text.", MAX_FILE),
                         "append": boolean("Add to the end instead of replacing.")},
                        ("path", "content")),
                 self.write, mutating=True),
            Tool("files_delete", self.service, "Delete a file (or an empty folder).",
                 schema({"path": path}, ("path",)), self.delete, mutating=True, destructive=True),
        ]  # fmt: skip


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_all(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit:
        chunk = os.read(fd, min(1 << 16, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _describe_file(parent: int, name: str, st: os.stat_result) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "file", "size": st.st_size}
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent
        )
    except OSError as err:
        entry["error"] = err.strerror
        return entry
    try:
        data = _read_all(fd, MAX_TOTAL)
    finally:
        os.close(fd)
    entry["sha256"] = hashlib.sha256(data).hexdigest()
    if len(data) <= STATE_TEXT:
        with contextlib.suppress(UnicodeDecodeError):
            entry["text"] = data.decode("utf-8")
    return entry
