"""The executor bundle: a relocatable folder that runs the executor in any image.

An image may have neither Python nor a usable libc, so the bundle brings its
own: the interpreter, its shared libraries and the dynamic loader, the stdlib,
the executor's packages, orchard-init and orchard-entry. Nothing is taken from
the image; the loader is always named explicitly::

    <bundle>/lib/ld-linux-x86-64.so.2 --library-path <bundle>/lib <bundle>/bin/python3 ...

with ``PYTHONHOME=<bundle>`` and ``PYTHONPATH=<bundle>/site`` (orchard-entry
does this). Layout (see docs/architecture.md, "The executor bundle")::

    bundle.json              format, digest, python version, entry points
    bin/python3              the interpreter (ELF; only ever run through the loader)
    bin/orchard-entry        static: the sandbox's first process (starts the executor,
                             then execs orchard-init as pid 1)
    bin/orchard-init         static: pid 1, the command spawner
    lib/ld-linux-x86-64.so.2 the dynamic loader
    lib/*.so.*               libc, libm, libpython, libssl, libcrypto, libz, libffi, ...
    lib/python3.X/           the stdlib (and lib-dynload)
    site/                    orchard (executor, common, _proto), grpc, google.protobuf,
                             uvloop, structlog, typing_extensions

``python -m orchard.executor.bundle build [--out DIR] [--tarball FILE]``
builds it (cached by content hash under ``<home>/bundles/``).
"""

from __future__ import annotations

from .builder import (
    BundleBuildError,
    bundle_size,
    copy_bundle,
    ensure_bundle,
    write_tarball,
)

__all__ = ["BundleBuildError", "bundle_size", "copy_bundle", "ensure_bundle", "write_tarball"]
