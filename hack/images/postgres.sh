#!/usr/bin/env bash
# Builds a PostgreSQL image from Debian's packages without Docker or a registry:
# `debootstrap --variant=minbase` of the Debian release that has the major version, the
# release's updates, and postgresql-<major>, trimmed as Debian's slim images are (no
# documentation, man pages or translations; only the C.UTF-8 locale), packed by
# hack/images/mkimage (hack/images/debian-lib.sh, shared with pgbouncer.sh).
#
#   bash hack/images/postgres.sh [MAJOR]     MAJOR: 15 (bookworm, the default), 17
#                                            (trixie) or 18 (sid); 14 and 16 are in no
#                                            Debian release
#
# The image is what the postgresql chart's pods need from the official postgres image:
# the server programs in /usr/lib/postgresql/<major>/bin, first on PATH; PG_MAJOR; a
# postgres user and group 999 (the pods run as 999 with fsGroup 999); /run/postgresql
# and /var/lib/postgresql/data; /bin/sh for archive_command; time zone data. Its command
# is `postgres`, which needs a data directory: in the chart the agent is the command
# and runs initdb itself.
#
# Writes $PGPILOT_CACHE/images/pgpilot-postgres-<major>-<Debian version>-<recipe>.tar
# and prints two lines: its path and the reference pgpilot-postgres:<major> (the
# tarball also tags pgpilot-postgres:<upstream version>, e.g. 15.14). A tarball is built
# once per package version and version of this script; later runs look the version up
# in Debian's package index (a few seconds) and return the cached tarball, or, offline,
# the newest one built. Building needs root (debootstrap, chroot) and about a minute.
#
# The Debian mirror is the one this machine's apt sources use for its own release (its
# security mirror for the security suite); set DEBIAN_MIRROR and DEBIAN_SECURITY_MIRROR
# to choose others (DEBIAN_SECURITY_MIRROR=none leaves the security suite out).
set -euo pipefail
self=$(realpath "${BASH_SOURCE[0]}")
cd "$(dirname "$self")/../.."

major=${1:-15}
case $major in
  15) suite=bookworm ;;
  17) suite=trixie ;;
  18) suite=sid ;;
  *)
    echo "postgres-image: Debian has no PostgreSQL $major (15: bookworm, 17: trixie, 18: sid)" >&2
    exit 1
    ;;
esac
package="postgresql-$major"
# shellcheck source=debian-lib.sh
source hack/images/debian-lib.sh

debian_init "$self" pgpilot-postgres "$suite"
debian_resolve "$package" "pgpilot-postgres-$major"
if [[ -f $tarball ]]; then
  debian_finish "$tarball" "pgpilot-postgres:$major"
  exit 0
fi
upstream=$(debian_upstream "$version")

# Building.
debian_need_root "$major"
debian_bootstrap "$package=$version"
# shellcheck disable=SC2016 # expanded by the inner shell, not this one
debian_install "$package=$version" '
  # No cluster made at install: the agent runs initdb.
  $apt install postgresql-common
  sed -ri "s/#(create_main_cluster) .*$/\1 = false/" /etc/postgresql-common/createcluster.conf
  $apt install "$1"
  # The socket directory and the data directory, as the official image has them.
  mkdir -p /run/postgresql /var/lib/postgresql/data
  chown postgres:postgres /run/postgresql /var/lib/postgresql/data
  chmod 3777 /run/postgresql
  chmod 1777 /var/lib/postgresql/data
'
debian_trim

log "checking that postgres runs as 999 in the trimmed root"
# shellcheck disable=SC2016 # expanded by the inner shell, not this one
chroot --userspec=999:999 "$rootfs" /usr/bin/env -i HOME=/var/lib/postgresql LC_ALL=C.UTF-8 \
  PATH="/usr/lib/postgresql/$major/bin:/usr/bin:/bin" sh -euc '
  d=$(mktemp -d)
  initdb -D "$d/data" --encoding=UTF8 --locale=C -U postgres --auth=trust >/dev/null
  pg_ctl -D "$d/data" -o "-c listen_addresses= -k $d" -w start >/dev/null
  psql -h "$d" -U postgres -Atc "select version()"
  pg_ctl -D "$d/data" -m fast -w stop >/dev/null
  rm -rf "$d"
' >&2 || die "postgres does not run in the image's root file system"
debian_seal

bin="/usr/lib/postgresql/$major/bin"
debian_pack "pgpilot-postgres-$major" "$tarball" \
  -ref "pgpilot-postgres:$major" -ref "pgpilot-postgres:$upstream" \
  -env "PATH=$bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  -env "PG_MAJOR=$major" -env "PG_VERSION=$version" -env LANG=C.UTF-8 \
  -env PGDATA=/var/lib/postgresql/data \
  -user 999:999 -cmd '["postgres"]' -expose 5432 -stop-signal SIGINT \
  -label org.opencontainers.image.title=pgpilot-postgres \
  -label "org.opencontainers.image.description=PostgreSQL $major from Debian $suite's packages (hack/images/postgres.sh)" \
  -label "org.opencontainers.image.version=$version" \
  -label "org.opencontainers.image.base.name=debian:$suite"
debian_finish "$tarball" "pgpilot-postgres:$major"
