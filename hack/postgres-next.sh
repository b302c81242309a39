#!/usr/bin/env bash
# Makes a newer PostgreSQL major (MAJOR, default 17) runnable on this machine for the
# real-PostgreSQL tests of major version upgrades (test/pg), which run it beside
# Debian's PostgreSQL 15: builds its image (hack/images/postgres.sh, Debian's package
# of that major), unpacks it, and carries its programs out with `agent carry ROOT DIR`,
# which brings the image's own loader and libraries along (the image is a newer
# Debian release than this machine may be). Prints the carried programs' directory.
#
#   bash hack/postgres-next.sh [MAJOR]
#
# Cached in $PGPILOT_CACHE/postgres-carried/<image>-<recipe>: done once per image and
# version of the carrying code.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
major=${1:-17}
CACHE=${PGPILOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pgpilot}
tar=$(bash hack/images/postgres.sh "$major" | sed -n 1p)
# Carried again when the carrying code changes.
recipe=$(cat internal/instance/carry/carry.go "${BASH_SOURCE[0]}" | sha256sum | cut -c1-8)
dest=$CACHE/postgres-carried/$(basename "$tar" .tar)-$recipe
if [[ ! -s $dest/carried.json ]]; then
  echo "postgres-next: carrying PostgreSQL $major out of $tar" >&2
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/image" "$work/root"
  tar -xf "$tar" -C "$work/image"
  for layer in "$work"/image/*.tar.gz; do
    tar -xzf "$layer" -C "$work/root" --no-same-owner
  done
  rm -rf "$dest"
  mkdir -p "$(dirname "$dest")"
  go run ./cmd/agent carry "$work/root" "$dest" >&2
  # The tests run postgres as the postgres user: it reads the programs.
  chmod -R a+rX "$dest"
fi
printf "%s\n" "$(sed -n 's/.*"binDir": *"\([^"]*\)".*/\1/p' "$dest/carried.json")"
