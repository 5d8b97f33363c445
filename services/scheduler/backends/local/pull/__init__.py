"""``orchard image pull``: images from OCI / Docker registries into the node's image store.

- :mod:`.ref`: image references and the local name of a pulled image;
- :mod:`.auth`: the registry's ``WWW-Authenticate`` challenge, bearer tokens, credentials;
- :mod:`.client`: the distribution API over aiohttp (manifests, blobs with ``Range``);
- :mod:`.manifests`: media types, index platform selection, manifest and config parsing;
- :mod:`.blobs`: the blob store and the shared unpacked layers, both keyed by digest;
- :mod:`.pull`: one pull from reference to a committed image, with progress events;
- :mod:`.progress`: the progress printers (terminal, one line per event, JSON).
"""
