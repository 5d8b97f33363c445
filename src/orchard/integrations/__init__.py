"""Adapters that let other projects' harnesses and trainers use Orchard sandboxes."""
