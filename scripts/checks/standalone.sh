#!/usr/bin/env bash
# Users clone this repository alone: nothing in it may read files beside it (the developers'
# shared folder next to the clone in particular). Fails, naming the places, if anything
# refers there.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
# Spelled in parts, so that this script does not name the folder itself.
folder=shared
pattern="\\.\\./${folder}"
# Tracked files where this is a git clone; otherwise every file outside the build trees.
list_files() {
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z
  else
    find . -path ./.git -prune -o -path './build*' -prune -o -type f -printf '%P\0'
  fi
}
if found=$(list_files | xargs -0 grep -In -e "$pattern" -- 2>/dev/null); then
  echo "these refer to the folder beside the clone, which a user's clone does not have:"
  echo "$found"
  exit 1
fi
[ -f data/openb/openb_node_list_gpu_node.csv ] || { echo "data/openb is missing"; exit 1; }
(cd data/openb && sha256sum --quiet -c SHA256SUMS) || { echo "data/openb does not match SHA256SUMS"; exit 1; }
echo "the repository stands alone"
