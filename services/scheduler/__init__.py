"""The scheduler: owns sandbox lifecycle on a node (internal; reached via the gateway).

It validates create requests, keeps every sandbox's state in SQLite so a restart
loses nothing, drives the backend (``backends/``) to make and remove
containers, deletes sandboxes whose TTL ran out, and hands out the executor's
address with a per-sandbox data-plane token. Modules:

- ``settings``   :class:`SchedulerSettings` and :class:`CreateLimits`
- ``validation`` create-request checks -> :class:`ValidatedCreate`
- ``store``      :class:`SandboxStore`, the SQLite state
- ``lifecycle``  :class:`SandboxLifecycle`, the state machine over store + backend
- ``reaper``     :class:`TtlReaper`
- ``recovery``   :func:`reconcile` the store with the backend on start
- ``service``    the ``SandboxService`` gRPC servicer
- ``server``     wiring, serve, graceful shutdown
"""
