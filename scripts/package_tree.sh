#!/usr/bin/env bash
# Lay out the `orchard` package as Python sees it once installed (src/orchard plus
# services/* mapped to orchard.*, as pyproject.toml's package-dir says) under
# build/pkgtree, with symlinks, for the tools that walk folders instead of
# importing: mypy and import-linter.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=build/pkgtree
rm -rf "$tree"
mkdir -p "$tree/orchard"
for entry in src/orchard/*; do
  ln -s "$PWD/$entry" "$tree/orchard/$(basename "$entry")"
done
for service in executor scheduler gateway rewards modelproxy; do
  ln -s "$PWD/services/$service" "$tree/orchard/$service"
done
ln -s "$PWD/recipes" "$tree/orchard/recipes"
echo "$tree"
