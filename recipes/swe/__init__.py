"""Recipe SWE: tasks, images, rollouts, Balanced Adaptive Rollout, CA-SFT, dense rewards, evaluation."""
