"""The value-model reranker: store scored rollouts, train P(resolved | task, trajectory,
patch), rank N candidates per task, evaluate best-of-N on held-out tasks."""
