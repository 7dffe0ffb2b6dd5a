#!/usr/bin/env bash
# towerpack: generate the API reference from the public headers with Doxygen.
# Any Doxygen warning fails the run (the Doxyfile sets FAIL_ON_WARNINGS).
#
#   bash scripts/api-docs.sh [OUTDIR]     default OUTDIR: build/api
# Open OUTDIR/html/index.html.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/api}
command -v doxygen >/dev/null || { echo "api-docs: doxygen is not installed (apt-get install doxygen)" >&2; exit 1; }
mkdir -p "$out"
# The Doxyfile's settings, with the output directory given here.
{ cat docs/api/Doxyfile; echo "OUTPUT_DIRECTORY = $out"; } | doxygen -
echo "api-docs: $out/html/index.html"
