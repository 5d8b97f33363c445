"""The process reward model: a seven-rubric LLM judgement of a whole trajectory, and the
anti-reward-hacking gate that zeroes the reward of rollouts that game the tests."""
