"""Adapters that let other projects' harnesses run on Orchard sandboxes.

One subpackage per project, each behind its own extra (``pip install
'orchard-env[inspect]'`` ...), each built only on the public SDK (``import
orchard``; an import-linter contract in pyproject.toml keeps it so):

- ``orchard.integrations.inspect``: an Inspect AI ``SandboxEnvironment``
  (``sandbox="orchard"``, found through Inspect's entry point).
- ``orchard.integrations.minisweagent``: a mini-swe-agent ``Environment``.
- ``orchard.integrations.swerex``: a SWE-ReX deployment and runtime.

Importing this package imports none of them, so it needs none of the extras.
"""
