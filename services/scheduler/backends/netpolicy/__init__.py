"""Network policy for sandboxes: the policy model, the local enforcement
(bridge, veth, nftables, egress proxy) and the Kubernetes compiler.

``policy`` is pure (shared with the scheduler's validation); ``local`` is what
the local backend drives; ``k8s`` turns a policy into NetworkPolicy manifests.
"""
