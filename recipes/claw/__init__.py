"""Recipe Claw: personal-assistant tasks over mock services, a task generator, pass^k / pass@k across harnesses."""
