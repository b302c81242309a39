#!/usr/bin/env bash
# Installs Debian's PostgreSQL 15 (the server the real-PostgreSQL tests run) when it is
# missing. Needs root (CI runs as root); prints what to run otherwise.
set -euo pipefail
if [[ -x /usr/lib/postgresql/15/bin/postgres ]] && id postgres >/dev/null 2>&1; then
  exit 0
fi
if [[ $(id -u) != 0 ]]; then
  echo "PostgreSQL 15 is missing: run 'sudo apt-get install postgresql-15'" >&2
  exit 1
fi
echo "install-postgres: installing postgresql-15 from Debian's packages" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends postgresql-15 postgresql-contrib >/dev/null
# The package starts a default cluster where it can; the tests run their own.
if command -v pg_ctlcluster >/dev/null; then
  pg_ctlcluster 15 main stop >/dev/null 2>&1 || true
fi
