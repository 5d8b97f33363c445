"""SWE-bench-style test-runner reward: parse, grade, run in a sandbox."""
