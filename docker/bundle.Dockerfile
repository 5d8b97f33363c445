# The executor bundle image: the relocatable executor bundle (interpreter with
# its own loader and libraries, the executor, orchard-init; see the section
# "The executor bundle" in docs/architecture.md) under /orchard-bundle, plus a
# static busybox for the init container's copy script. Sandbox pods run this
# image only as their init container; the task container keeps its own image.
#
# Build from the repository root, after building the bundle on a Linux x86-64
# machine like the target nodes:
#   python -m orchard.executor.bundle build --out build/bundle
#   docker build -f docker/bundle.Dockerfile -t orchard/executor-bundle:0.1.0 .
# (Not built in CI: these machines have no Docker daemon and no registry.)
FROM busybox:1.36-musl AS tools

FROM scratch
COPY --from=tools /bin/busybox /bin/busybox
# The init container runs: /bin/sh -c "cp -a /orchard-bundle/. /.orchard/; ..."
RUN ["/bin/busybox", "--install", "-s", "/bin"]
COPY build/bundle/ /orchard-bundle/
# No USER: the init container runs as the pod's user (root, or the template's
# run_as_user with fsGroup so it can read the token Secret).
ENTRYPOINT ["/bin/sh"]
