"""The local backend: real OCI containers run by runc on this machine.

Modules, one job each:

- ``settings``      :class:`LocalSettings`
- ``images``        the image store and the default Debian image build
- ``image_import``  import of ``docker save`` tarballs, OCI layouts and rootfs folders
- ``layer_tar``     safe extraction of one layer tar with OCI -> overlayfs whiteouts
- ``syscalls``      ctypes wrappers (mount, umount2) so the hot path spawns nothing
- ``overlay``       the per-sandbox overlayfs root
- ``oci_config``    the container's OCI ``config.json``
- ``seccomp``       its seccomp filter (no user namespaces, mounts, bpf, keyrings...)
- ``init_socket``   the listening socket handed to orchard-init as fd 3
- ``runc``          running the runc CLI and reading its state dir
- ``cgroups``       where runc puts a sandbox's cgroups, and removing leftovers
- ``backend``       :class:`LocalBackend`, the ``Backend`` implementation
"""
