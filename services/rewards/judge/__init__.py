"""An LLM judge over any OpenAI-compatible chat endpoint: versioned rubric templates,
schema-checked JSON verdicts (one repair attempt), retries with backoff and jitter,
a concurrency limit, a cache, and an explicit "no verdict" when it fails."""
