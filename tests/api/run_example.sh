#!/bin/bash
# Runs one example (arg 1) on a fresh directory (arg 2): the store examples refuse to create
# over an existing store, so a repeated test run starts clean.
set -eu
rm -rf "$2"
mkdir -p "$(dirname "$2")"
exec "$1" "$2"
