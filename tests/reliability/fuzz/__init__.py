"""Generators of hostile input for the reliability suite (proto messages, raw bytes, fuzz targets)."""
