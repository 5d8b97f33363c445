"""The rewards suite. ``corpus/`` holds test data (projects run inside sandboxes to
produce logs), not tests of this project: never collect it."""

collect_ignore_glob = ["corpus/*"]
