#!/usr/bin/env bash
# Builds the PgBouncer image of the pooler (docs/pooler.md) from Debian's packages
# without Docker or a registry: `debootstrap --variant=minbase` of bookworm, its updates,
# and Debian's pgbouncer package with its dependencies (no recommended packages), trimmed
# as Debian's slim images are, packed by hack/images/mkimage; built as postgres.sh builds
# the PostgreSQL image (hack/images/debian-lib.sh).
#
#   bash hack/images/pgbouncer.sh
#
# The image is what the pooler's pods need: `pgbouncer` on PATH (/usr/sbin/pgbouncer,
# where the pooler agent also looks), the user and group postgres, 999 (the pods run as
# 999, with a read-only root file system: the agent writes pgbouncer.ini and the sockets
# elsewhere); its OpenSSL for TLS on both sides. In the pods the agent is the command
# (`/pgpilot/agent pooler`, copied in by an init container from the operator image); the
# image's own command runs Debian's example configuration.
#
# Writes $PGPILOT_CACHE/images/pgpilot-pgbouncer-<Debian version>-<recipe>.tar and prints
# two lines: its path and the reference pgpilot-pgbouncer:<upstream version> (1.18.0).
# A tarball is built once per package version and version of this script and its
# library; later runs look the version up in Debian's package index (a few seconds) and
# return the cached tarball, or, offline, the newest one built. Building needs root
# (debootstrap, chroot) and a minute or two. DEBIAN_MIRROR and DEBIAN_SECURITY_MIRROR
# choose the mirrors, as for postgres.sh.
set -euo pipefail
self=$(realpath "${BASH_SOURCE[0]}")
cd "$(dirname "$self")/../.."

suite=bookworm
package=pgbouncer
# shellcheck source=debian-lib.sh
source hack/images/debian-lib.sh

debian_init "$self" pgpilot-pgbouncer "$suite"
debian_resolve "$package" pgpilot-pgbouncer
upstream=$(debian_upstream "$version")
if [[ -f $tarball ]]; then
  debian_finish "$tarball" "pgpilot-pgbouncer:$upstream"
  exit 0
fi

# Building.
debian_need_root "$@"
debian_bootstrap "$package=$version"
# shellcheck disable=SC2016 # expanded by the inner shell, not this one
debian_install "$package=$version" '
  $apt install "$1"
  # The socket and log directories of Debian'"'"'s pgbouncer.ini, for the image'"'"'s own
  # command (the pods have their own, the root file system being read-only there).
  mkdir -p /run/postgresql /var/log/postgresql
  chown postgres:postgres /run/postgresql /var/log/postgresql
  chmod 2775 /run/postgresql
'
debian_trim

log "checking that pgbouncer runs as 999 in the trimmed root"
# pgbouncer --version, then a PgBouncer serving a Unix socket only, stopped once it is
# there: its libraries load and it starts as the pods' user.
# shellcheck disable=SC2016 # expanded by the inner shell, not this one
chroot --userspec=999:999 "$rootfs" /usr/bin/env -i HOME=/var/lib/postgresql LC_ALL=C.UTF-8 \
  PATH=/usr/sbin:/usr/bin:/sbin:/bin sh -euc '
  pgbouncer --version
  d=$(mktemp -d)
  printf "[databases]\n[pgbouncer]\nlisten_addr =\nunix_socket_dir = %s\npidfile = %s/pid\nauth_type = any\n" \
    "$d" "$d" >"$d/pgbouncer.ini"
  pgbouncer -q "$d/pgbouncer.ini" &
  pid=$!
  i=0
  until [ -S "$d/.s.PGSQL.6432" ]; do
    i=$((i + 1))
    [ "$i" -le 100 ] || { echo "no socket after 10 s" >&2; kill "$pid"; exit 1; }
    kill -0 "$pid" 2>/dev/null || { echo "pgbouncer exited" >&2; exit 1; }
    sleep 0.1
  done
  kill -TERM "$pid"
  wait "$pid" || true
  rm -rf "$d"
' >&2 || die "pgbouncer does not run in the image's root file system"
debian_seal

debian_pack pgpilot-pgbouncer "$tarball" -ref "pgpilot-pgbouncer:$upstream" \
  -env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  -env "PGBOUNCER_VERSION=$version" -env LANG=C.UTF-8 \
  -user 999:999 -cmd '["pgbouncer", "/etc/pgbouncer/pgbouncer.ini"]' -expose 6432 \
  -label org.opencontainers.image.title=pgpilot-pgbouncer \
  -label "org.opencontainers.image.description=PgBouncer from Debian $suite's packages (hack/images/pgbouncer.sh)" \
  -label "org.opencontainers.image.version=$version" \
  -label "org.opencontainers.image.base.name=debian:$suite"
debian_finish "$tarball" "pgpilot-pgbouncer:$upstream"
