"""The rewards service: graders that turn a rollout into a reward.

- ``orchard.rewards.swe``: the SWE-bench-style test runner (patch in a fresh
  sandbox, eval script, log parsers, grading identical to ``swebench`` 5.x).
- ``orchard.rewards.judge``: an LLM judge over any OpenAI-compatible endpoint.
- ``orchard.rewards.prm``: the seven-rubric process reward model and the
  anti-reward-hacking gate.
- ``orchard.rewards.rerank``: the value-model reranker (store, train, rank, evaluate).

Every scorer is a plain function usable in-process; ``python -m orchard.rewards``
serves them as the gRPC ``RewardService``.
"""
