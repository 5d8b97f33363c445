"""Turning kernel errors and odd file types into clear :class:`ServiceError`\\ s.

Every refusal the file service makes reaches a client (a trainer, an agent
harness) as a gRPC status plus an ``ErrorReason`` name. The messages name the
sandbox path the client asked for, never a host path: the host layout is none
of the client's business and would only confuse them.
"""

from __future__ import annotations

import errno
import stat

import grpc

from orchard.common.errors import ServiceError, invalid, not_found, precondition

# The ErrorReason names used here (protos/orchard/v1/common.proto).
PATH_ESCAPE = "PATH_ESCAPE"
PATH_NOT_FOUND = "PATH_NOT_FOUND"
NOT_A_DIRECTORY = "NOT_A_DIRECTORY"
IS_A_DIRECTORY = "IS_A_DIRECTORY"
UNSUPPORTED_FILE_TYPE = "UNSUPPORTED_FILE_TYPE"
FILE_EXISTS = "FILE_EXISTS"
INVALID_FIELD = "INVALID_FIELD"
QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
USER_NOT_FOUND = "USER_NOT_FOUND"
UNSPECIFIED = "ERROR_REASON_UNSPECIFIED"


def escape(message: str) -> ServiceError:
    """INVALID_ARGUMENT / PATH_ESCAPE: the request tried to leave its confinement."""
    return invalid(message, PATH_ESCAPE)


def file_type_name(mode: int) -> str:
    """A human name for the file type in ``st_mode`` ("a fifo", "a socket"...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISFIFO(mode):
        return "a fifo"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "an unknown file type"


def unsupported_type(what: str, mode: int) -> ServiceError:
    """FAILED_PRECONDITION / UNSUPPORTED_FILE_TYPE for anything but files and dirs."""
    return precondition(
        f"{what} is {file_type_name(mode)}; only regular files can be transferred",
        UNSUPPORTED_FILE_TYPE,
    )


def fs_error(err: OSError, what: str) -> ServiceError:
    """Map an OSError raised while working on ``what`` (a sandbox path) to a ServiceError.

    EXDEV and ELOOP come from the openat2 RESOLVE_* flags: the kernel refused to
    let the lookup leave the root, cross a mount or follow a forbidden link,
    which is an escape attempt from the client's point of view.
    """
    code = err.errno
    if code == errno.ENOENT:
        return not_found(f"{what} does not exist", PATH_NOT_FOUND)
    if code == errno.ENOTDIR:
        return precondition(f"{what}: a component of the path is not a directory", NOT_A_DIRECTORY)
    if code == errno.EISDIR:
        return precondition(f"{what} is a directory", IS_A_DIRECTORY)
    if code == errno.EEXIST or code == errno.ENOTEMPTY:
        return precondition(f"{what} already exists", FILE_EXISTS)
    if code == errno.EXDEV:
        return escape(f"{what} resolves outside the allowed tree (or across a mount point)")
    if code == errno.ELOOP:
        return escape(
            f"{what}: refused to follow a symbolic link here (or too many levels of links)"
        )
    if code == errno.ENAMETOOLONG:
        return invalid(f"{what}: file name too long", INVALID_FIELD)
    if code in (errno.ENOSPC, errno.EDQUOT):
        return ServiceError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            QUOTA_EXCEEDED,
            f"{what}: no space left on the sandbox's disk",
            fault="task",
        )
    if code in (errno.EACCES, errno.EPERM):
        return ServiceError(
            grpc.StatusCode.PERMISSION_DENIED, UNSPECIFIED, f"{what}: operation not permitted"
        )
    if code == errno.EROFS:
        return precondition(f"{what} is on a read-only file system", UNSPECIFIED)
    if code == errno.EMLINK:
        return precondition(f"{what}: too many links", UNSPECIFIED)
    return ServiceError(
        grpc.StatusCode.INTERNAL,
        UNSPECIFIED,
        f"{what}: {err.strerror or 'I/O error'} (errno {code})",
        fault="infrastructure",
    )
