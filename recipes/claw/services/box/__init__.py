"""The code that runs inside the sandbox: the Claw services' HTTP server and MCP server.

Stdlib only (the image's ``python3``), except :mod:`.mcp_server` (the PyPI ``mcp``
package, from the runtime's ``site`` folder). Relative imports only: the package is
copied into the sandbox as ``claw_box`` and started by :mod:`.launch`. The driver imports
:mod:`.wire` (the admin signatures) and nothing else from here.
"""
