#!/usr/bin/env bash
# The device tool copies the working tree to the GPU machine (tracked files, and untracked ones git
# does not ignore, plus the paths carried) and refuses a tree over 64 MiB; the committed results
# have grown past that. No device command reads these, so they wait in .aside/ (ignored) during a call:
#   bash benchmarks/device_tree.sh aside     # before the device call; prints the tree's size
#   bash benchmarks/device_tree.sh back      # after it
set -euo pipefail
cd "$(dirname "$0")/.."
AWAY="results/continuous-repeats results/validation results/calibration-large results/calibration-served
      results/calibration-offsteps results/calibration-heat2 results/calibration-cotenant results/calibration-heat3 results/calibration-heat4
      results/continuous-closed-cold
      results/continuous/azure-cap-*"  # (patterns: each expands against the tree, or against .aside/ going back)
case "${1:-}" in
  aside)
    for p in $AWAY; do
      if [ -e "$p" ]; then mkdir -p ".aside/$(dirname "$p")"; mv "$p" ".aside/$p"; fi
    done ;;
  back)
    for p in $(cd .aside 2>/dev/null && echo $AWAY); do
      if [ -e ".aside/$p" ]; then
        [ -e "$p" ] && { echo "error: $p is back already; .aside/$p left where it is" >&2; exit 1; }
        mv ".aside/$p" "$p"
      fi
    done ;;
  *) echo "usage: bash benchmarks/device_tree.sh aside|back" >&2; exit 2 ;;
esac
# what the device tool would copy: tracked files still in the tree, and untracked ones not ignored
{ git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 du -cb 2>/dev/null | tail -1 |
  awk '{printf "working tree: %.1f MB (the device tool takes at most 67.1 MB, carried paths included)\n", $1 / 1e6}'
