"""Orchard Env: isolated sandboxes for training and evaluating AI agents."""
