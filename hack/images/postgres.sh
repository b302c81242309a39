#!/usr/bin/env bash
# Builds a PostgreSQL image from Debian's packages without Docker or a registry:
# `debootstrap --variant=minbase` of the Debian release that has the major version, the
# release's updates, and postgresql-<major>, trimmed as Debian's slim images are (no
# documentation, man pages or translations; only the C.UTF-8 locale), packed by
# hack/images/mkimage.
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
CACHE=${PGPILOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pgpilot}
out="$CACHE/images"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
package="postgresql-$major"
recipe=$(sha256sum "$self" | cut -c1-8)
started=$SECONDS

log() { echo "postgres-image: [$((SECONDS - started))s] $*" >&2; }
die() {
  echo "postgres-image: $*" >&2
  exit 1
}

# The URI of this machine's apt source for suite $1 (deb822 .sources, then one-line lists).
host_mirror() {
  local suite=$1 f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    awk -v suite="$suite" '
      BEGIN { RS = ""; FS = "\n" }
      {
        uris = ""; suites = ""; types = ""; enabled = 1
        for (i = 1; i <= NF; i++) {
          line = $i
          if (line ~ /^#/) continue
          if (sub(/^URIs:[ \t]*/, "", line)) uris = line
          else if (sub(/^Suites:[ \t]*/, "", line)) suites = " " line " "
          else if (sub(/^Types:[ \t]*/, "", line)) types = " " line " "
          else if (line ~ /^Enabled:[ \t]*no/) enabled = 0
        }
        if (enabled && types ~ / deb / && index(suites, " " suite " ")) { split(uris, u, " "); print u[1]; exit }
      }' "$f"
  done
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk -v suite="$suite" '
    $1 == "deb" {
      i = 2
      if ($i ~ /^\[/) { while ($i !~ /\]$/ && i < NF) i++; i++ }
      if ($(i + 1) == suite) { print $i; exit }
    }' || true
}

host_codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
mirror=${DEBIAN_MIRROR:-}
if [[ -z $mirror && -n $host_codename ]]; then
  mirror=$(host_mirror "$host_codename")
  mirror=${mirror%%$'\n'*}
fi
[[ -n $mirror ]] || die "no Debian mirror in this machine's apt sources: set DEBIAN_MIRROR"
security=${DEBIAN_SECURITY_MIRROR:-}
if [[ -z $security && -n $host_codename ]]; then
  security=$(host_mirror "$host_codename-security")
  security=${security%%$'\n'*}
fi
[[ $security == none ]] && security=""
[[ -f $keyring ]] || die "$keyring is missing: install debian-archive-keyring"
arch=$(dpkg --print-architecture 2>/dev/null) || die "dpkg is missing: this builds on Debian or a derivative"

# The apt sources of the image, also used on this machine, through a private apt state,
# to find the package version and download the packages.
sources="deb [signed-by=$keyring] $mirror $suite main"
if [[ $suite != sid ]]; then
  sources+=$'\n'"deb [signed-by=$keyring] $mirror $suite-updates main"
  if [[ -n $security ]]; then
    sources+=$'\n'"deb [signed-by=$keyring] $security $suite-security main"
  fi
fi
aptdir="$out/apt-$suite"
mkdir -p "$aptdir/lists/partial" "$aptdir/cache/archives/partial" "$aptdir/sources.list.d" "$aptdir/preferences.d"
printf '%s\n' "$sources" >"$aptdir/sources.list"
[[ -f $aptdir/status ]] || : >"$aptdir/status"
apt_opts=(
  -o "Dir::Etc::SourceList=$aptdir/sources.list" -o "Dir::Etc::SourceParts=$aptdir/sources.list.d"
  -o "Dir::Etc::Preferences=$aptdir/preferences" -o "Dir::Etc::PreferencesParts=$aptdir/preferences.d"
  -o "Dir::State=$aptdir" -o "Dir::State::Lists=$aptdir/lists" -o "Dir::State::status=$aptdir/status"
  -o "Dir::Cache=$aptdir/cache" -o "APT::Architecture=$arch" -o "APT::Architectures=$arch"
  -o APT::Install-Recommends=false -o APT::Default-Release=
)
if [[ $(id -u) == 0 ]]; then
  apt_opts+=(-o APT::Sandbox::User=root)
fi

find_cached() { # the newest tarball this script built for the major version
  # shellcheck disable=SC2012 # our own file names, no odd characters; ls -t sorts them by time
  ls -1t "$out/pgpilot-postgres-$major-"*"-$recipe.tar" 2>/dev/null | head -n 1 || true
}
finish() { # prints the result, owned by the user sudo ran this for
  local tarball=$1
  if [[ -n ${SUDO_UID:-} ]]; then
    chown "$SUDO_UID:${SUDO_GID:-$SUDO_UID}" "$tarball" || true
    chown -R "$SUDO_UID:${SUDO_GID:-$SUDO_UID}" "$aptdir" || true
  fi
  echo "$tarball"
  echo "pgpilot-postgres:$major"
}

if ! apt-get "${apt_opts[@]}" -qq update >"$aptdir/update.log" 2>&1; then
  echo "postgres-image: cannot update Debian's package index, using what this machine has of it:" \
    "$(tail -n 1 "$aptdir/update.log")" >&2
fi
version=$(apt-cache "${apt_opts[@]}" policy "$package" 2>/dev/null | awk '/Candidate:/ { print $2 }')
if [[ -z $version || $version == "(none)" ]]; then
  cached=$(find_cached)
  [[ -n $cached ]] || die "found no $package in Debian $suite's package index"
  echo "postgres-image: using the newest image built: $cached" >&2
  finish "$cached"
  exit 0
fi
upstream=${version#*:}
upstream=${upstream%%-*}
upstream=${upstream%%~*}
tarball="$out/pgpilot-postgres-$major-${version//[^A-Za-z0-9.+~_-]/_}-$recipe.tar"
if [[ -f $tarball ]]; then
  finish "$tarball"
  exit 0
fi

# Building.
[[ $(id -u) == 0 ]] || die "building the image needs root once (debootstrap, chroot): run
  sudo env PATH=\"\$PATH\" PGPILOT_CACHE=\"$CACHE\" bash hack/images/postgres.sh $major"
log "building the image of $package $version from Debian $suite (about a minute, once per version)"
if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends debootstrap >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
fi

work=$(mktemp -d "$out/build.XXXXXX")
rootfs="$work/rootfs"
unmount_all() { # everything mounted under $work, innermost first
  awk -v w="$work/" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m"
  done
}
cleanup() {
  unmount_all
  if awk -v w="$work/" 'index($2, w) == 1 { found = 1 } END { exit !found }' /proc/mounts; then
    echo "postgres-image: left $work in place: something is still mounted under it" >&2
  else
    rm -rf --one-file-system "$work"
  fi
}
trap cleanup EXIT

# mkimage first: a Go problem shows before the slow part.
go build -o "$work/mkimage" ./hack/images/mkimage

log "debootstrap --variant=minbase $suite"
# Per-package lines go to the log only; the phases show.
debootstrap --variant=minbase --arch="$arch" --keyring="$keyring" "$suite" "$rootfs" "$mirror" 2>&1 |
  tee "$work/debootstrap.log" |
  awk '!/^I: (Retrieving|Validating) [^ ]+ [^ ]+$/ && !/^I: (Extracting|Unpacking|Configuring) [^ ]+\.\.\.$/ {
    print "  " $0 > "/dev/stderr"; fflush("/dev/stderr") }' ||
  { tail -n 20 "$work/debootstrap.log" >&2; die "debootstrap failed"; }

# Downloaded here, through this machine's apt configuration, into the image's apt cache:
# the release's updates and the server, exactly the version looked up above.
log "downloading $package $version and the $suite updates"
mkdir -p "$rootfs/var/cache/apt/archives/partial"
host_apt=(apt-get "${apt_opts[@]}" -o "Dir::State::status=$rootfs/var/lib/dpkg/status"
  -o "Dir::Cache::archives=$rootfs/var/cache/apt/archives" -y -qq --download-only)
"${host_apt[@]}" dist-upgrade >/dev/null
"${host_apt[@]}" install "$package=$version" >/dev/null
# The image's apt sees the same index, so that it installs what was downloaded.
printf '%s\n' "$sources" >"$rootfs/etc/apt/sources.list"
cp "$aptdir"/lists/*Release* "$aptdir"/lists/*_Packages* "$rootfs/var/lib/apt/lists/"

# As Debian's slim images: no documentation (but the copyright files), man pages or
# translations, for this install and for what the base system has already. (PostgreSQL's
# own man pages, under /usr/share/postgresql, stay: its packages' scripts register them
# with update-alternatives, which fails on a missing file.)
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/pgpilot-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
# No service starts in the chroot.
printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
chmod 0755 "$rootfs/usr/sbin/policy-rc.d"
mount -t proc proc "$rootfs/proc"

in_root() {
  chroot "$rootfs" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive "$@"
}
log "installing $package $version"
# shellcheck disable=SC2016 # expanded by the inner shell, not this one
in_root sh -euc '
  # The user and group of the official postgres image, before the packages make theirs.
  groupadd --system --gid 999 postgres
  useradd --system --uid 999 --gid 999 --home-dir /var/lib/postgresql --shell /bin/bash postgres
  mkdir -p /var/lib/postgresql
  chown postgres:postgres /var/lib/postgresql
  apt="apt-get -y -q --no-download --no-install-recommends -o Dpkg::Use-Pty=0
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"
  $apt dist-upgrade
  # No cluster made at install: the agent runs initdb.
  $apt install postgresql-common
  sed -ri "s/#(create_main_cluster) .*$/\1 = false/" /etc/postgresql-common/createcluster.conf
  $apt install "$1"
  # The socket directory and the data directory, as the official image has them.
  mkdir -p /run/postgresql /var/lib/postgresql/data
  chown postgres:postgres /run/postgresql /var/lib/postgresql/data
  chmod 3777 /run/postgresql
  chmod 1777 /var/lib/postgresql/data
' sh "$package=$version" >"$work/install.log" 2>&1 ||
  { tail -n 20 "$work/install.log" >&2; die "installing $package failed"; }
# shellcheck disable=SC2016 # a dpkg-query format, not a shell expansion
installed=$(in_root dpkg-query -W -f '${Version}' "$package")
[[ $installed == "$version" ]] || die "installed $package $installed, not $version"
[[ $(in_root id -u postgres):$(in_root id -g postgres) == 999:999 ]] || die "the postgres user is not 999:999"

log "trimming"
in_root sh -euc '
  apt-get clean
  rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/debconf/*-old /var/lib/dpkg/*-old
  find /usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete
  find /usr/share/doc -mindepth 1 -type d -empty -delete
  rm -rf /usr/share/man/* /usr/share/groff/* /usr/share/info/* /usr/share/lintian /usr/share/linda
  find /usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
  # Compiled locales: C.UTF-8 only (the agent runs initdb with --locale=C).
  find /usr/lib/locale -mindepth 1 -maxdepth 1 ! -name C.utf8 -exec rm -rf {} +
  find /var/log -type f -delete
  rm -rf /tmp/* /var/tmp/* /root/.bash_history /usr/sbin/policy-rc.d /run/adduser
'
# This machine's name and resolver are not the image's (the runtime provides both).
: >"$rootfs/etc/hostname"
: >"$rootfs/etc/resolv.conf"

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
umount "$rootfs/proc"
# The runtime mounts /dev; debootstrap's device nodes stay out of the image.
find "$rootfs/dev" -mindepth 1 -delete

log "packing $(du -sm "$rootfs" | cut -f1) MB"
bin="/usr/lib/postgresql/$major/bin"
"$work/mkimage" -rootfs "$rootfs" -platform "linux/$(go env GOARCH)" \
  -ref "pgpilot-postgres:$major" -ref "pgpilot-postgres:$upstream" -o "$tarball.partial" \
  -env "PATH=$bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  -env "PG_MAJOR=$major" -env "PG_VERSION=$version" -env LANG=C.UTF-8 \
  -env PGDATA=/var/lib/postgresql/data \
  -user 999:999 -cmd '["postgres"]' -expose 5432 -stop-signal SIGINT \
  -label org.opencontainers.image.title=pgpilot-postgres \
  -label "org.opencontainers.image.description=PostgreSQL $major from Debian $suite's packages (hack/images/postgres.sh)" \
  -label "org.opencontainers.image.version=$version" \
  -label "org.opencontainers.image.base.name=debian:$suite" >/dev/null
mv -f "$tarball.partial" "$tarball"
# Of this major version's tarballs, the newest two stay (the one before for going back).
# shellcheck disable=SC2012 # our own file names, no odd characters; ls -t sorts them by time
ls -1t "$out/pgpilot-postgres-$major-"*.tar | tail -n +3 | while read -r old; do
  rm -f "$old"
done
log "wrote $tarball ($(du -m "$tarball" | cut -f1) MB)"
finish "$tarball"
