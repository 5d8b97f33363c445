"""The recording model proxy: OpenAI Chat / Responses and Anthropic Messages in front of an
OpenAI-compatible inference server, one session per rollout, every call recorded and turned
into token-exact training samples (``docs/modelproxy.md``)."""
