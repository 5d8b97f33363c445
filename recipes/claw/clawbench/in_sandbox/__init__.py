"""Scripts written into a sandbox and run there by its own ``python3`` (the image's Python 3.11,
standard library only): they are read as text by :mod:`..layout`, never imported on the driver
except by their unit tests."""
