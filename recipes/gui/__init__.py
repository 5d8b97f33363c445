"""Recipe GUI: a real browser in the sandbox, a screenshot agent loop, judged rewards, task filtering, a step curriculum."""
