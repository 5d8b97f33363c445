"""Orchard Env's training recipes (SWE, GUI, Claw): libraries and CLIs on the public SDK."""
