# shellcheck shell=bash
# What hack/images/postgres.sh and hack/images/pgbouncer.sh share (sourced, not run): an
# image of Debian packages built without Docker or a registry. `debootstrap
# --variant=minbase` of a Debian release, the release's updates and the packages asked
# for, with the postgres user and group 999 of the official postgres image, trimmed as
# Debian's slim images are (no documentation, man pages or translations; only the
# C.UTF-8 locale), packed by hack/images/mkimage.
#
# A tarball is built once per package version and recipe (the script and this file);
# later runs look the version up in Debian's package index (a few seconds) and return the
# cached tarball, or, offline, the newest one built. Building needs root (debootstrap,
# chroot).
#
# The Debian mirror is the one this machine's apt sources use for its own release (its
# security mirror for the security suite); set DEBIAN_MIRROR and DEBIAN_SECURITY_MIRROR
# to choose others (DEBIAN_SECURITY_MIRROR=none leaves the security suite out).
#
# The script, in the repository's root, calls in turn:
#
#   debian_init SELF NAME SUITE     the private apt state, its package index updated
#   debian_resolve PACKAGE PREFIX   sets version and tarball ($out/PREFIX-<version>-<recipe>.tar)
#   debian_finish TARBALL REF       prints both lines: now when the tarball is there, else last
#   debian_need_root ARGS...        dies, saying how to run the script with ARGS as root
#   debian_bootstrap PACKAGE=VERSION    a root file system in $rootfs, the packages downloaded
#   debian_install PACKAGE=VERSION SCRIPT   SCRIPT run by sh in it, with $apt and $1
#   debian_trim, then its own checks (in_root, chroot --userspec=999:999), then debian_seal
#   debian_pack PREFIX TARBALL MKIMAGE-ARGS...

CACHE=${PGPILOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pgpilot}
out="$CACHE/images"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
started=$SECONDS
name=pgpilot-debian

log() { echo "${name#pgpilot-}-image: [$((SECONDS - started))s] $*" >&2; }
die() {
  echo "${name#pgpilot-}-image: $*" >&2
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

# debian_init SELF NAME SUITE: the script at SELF builds images of Debian SUITE named
# NAME (pgpilot-postgres: its tarballs' names and, less pgpilot-, its messages'). It sets
# recipe (of SELF and this file), mirror, sources (the image's apt sources), aptdir and
# apt_opts (a private apt state on this machine with those sources, to find the
# packages' versions and download them), and updates its package index.
debian_init() {
  self=$1 name=$2 suite=$3
  local host_codename security
  recipe=$(cat "$self" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-8)
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
  if ! apt-get "${apt_opts[@]}" -qq update >"$aptdir/update.log" 2>&1; then
    echo "${name#pgpilot-}-image: cannot update Debian's package index, using what this machine has of it:" \
      "$(tail -n 1 "$aptdir/update.log")" >&2
  fi
}

# debian_resolve PACKAGE PREFIX sets version, PACKAGE's version in the suite, and
# tarball, $out/PREFIX-<version>-<recipe>.tar. When the index has no PACKAGE (offline,
# with no index yet), both are the newest tarball's this recipe built.
debian_resolve() {
  local package=$1 prefix=$2 file
  version=$(apt-cache "${apt_opts[@]}" policy "$package" 2>/dev/null | awk '/Candidate:/ { print $2 }')
  if [[ -n $version && $version != "(none)" ]]; then
    tarball="$out/$prefix-${version//[^A-Za-z0-9.+~_-]/_}-$recipe.tar"
    return 0
  fi
  # shellcheck disable=SC2012 # our own file names, no odd characters; ls -t sorts them by time
  tarball=$(ls -1t "$out/$prefix-"*"-$recipe.tar" 2>/dev/null | head -n 1 || true)
  [[ -n $tarball ]] || die "found no $package in Debian $suite's package index"
  echo "${name#pgpilot-}-image: using the newest image built: $tarball" >&2
  file=${tarball##*/}
  file=${file#"$prefix-"}
  version=${file%-"$recipe.tar"}
}

# debian_upstream prints the upstream part of the Debian version $1 (1.18.0 of
# 1.18.0-1+deb12u1), also of one from a tarball's name (where an epoch's colon is _).
debian_upstream() {
  local v=${1#*[:_]}
  v=${v%%-*}
  echo "${v%%~*}"
}

# debian_finish TARBALL REF prints the result, owned by the user sudo ran this for.
debian_finish() {
  local tarball=$1 ref=$2
  if [[ -n ${SUDO_UID:-} ]]; then
    chown "$SUDO_UID:${SUDO_GID:-$SUDO_UID}" "$tarball" || true
    chown -R "$SUDO_UID:${SUDO_GID:-$SUDO_UID}" "$aptdir" || true
  fi
  echo "$tarball"
  echo "$ref"
}

unmount_all() { # everything mounted under $work, innermost first
  awk -v w="$work/" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m"
  done
}
cleanup() {
  unmount_all
  if awk -v w="$work/" 'index($2, w) == 1 { found = 1 } END { exit !found }' /proc/mounts; then
    echo "${name#pgpilot-}-image: left $work in place: something is still mounted under it" >&2
  else
    rm -rf --one-file-system "$work"
  fi
}

in_root() {
  chroot "$rootfs" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive "$@"
}

# debian_need_root ARGS... dies unless this runs as root, with the command that runs the
# script with ARGS as root.
debian_need_root() {
  [[ $(id -u) == 0 ]] || die "building the image needs root once (debootstrap, chroot): run
  sudo env PATH=\"\$PATH\" PGPILOT_CACHE=\"$CACHE\" bash ${self#"$PWD/"} $*"
}

# debian_bootstrap PACKAGE=VERSION... makes the root file system $rootfs under $work
# (removed on exit), with the packages and the suite's updates downloaded into its apt
# cache, ready for debian_install.
debian_bootstrap() {
  log "building the image of ${*//=/ } from Debian $suite (about a minute, once per version)"
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends debootstrap >/dev/null 2>&1 ||
      { apt-get update -qq && apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
  fi

  work=$(mktemp -d "$out/build.XXXXXX")
  rootfs="$work/rootfs"
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

  # Downloaded here, through this machine's apt configuration, into the image's apt
  # cache: the release's updates and the packages, exactly the versions looked up.
  log "downloading $* and the $suite updates"
  mkdir -p "$rootfs/var/cache/apt/archives/partial"
  local host_apt=(apt-get "${apt_opts[@]}" -o "Dir::State::status=$rootfs/var/lib/dpkg/status"
    -o "Dir::Cache::archives=$rootfs/var/cache/apt/archives" -y -qq --download-only)
  "${host_apt[@]}" dist-upgrade >/dev/null
  "${host_apt[@]}" install "$@" >/dev/null
  # The image's apt sees the same index, so that it installs what was downloaded.
  printf '%s\n' "$sources" >"$rootfs/etc/apt/sources.list"
  cp "$aptdir"/lists/*Release* "$aptdir"/lists/*_Packages* "$rootfs/var/lib/apt/lists/"

  # As Debian's slim images: no documentation (but the copyright files), man pages or
  # translations, for this install and for what the base system has already.
  # (PostgreSQL's own man pages, under /usr/share/postgresql, stay: its packages' scripts
  # register them with update-alternatives, which fails on a missing file.)
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
}

# debian_install PACKAGE=VERSION SCRIPT installs the suite's updates, then runs SCRIPT
# with sh in the root file system, with $apt (apt-get installing what was downloaded)
# and PACKAGE=VERSION as $1, and checks that PACKAGE is at VERSION. The postgres user and
# group 999 of the official postgres image are made first, before any package makes its
# own.
debian_install() {
  local spec=$1 script=$2 installed
  log "installing $spec"
  # shellcheck disable=SC2016 # expanded by the inner shell, not this one
  in_root sh -euc '
    groupadd --system --gid 999 postgres
    useradd --system --uid 999 --gid 999 --home-dir /var/lib/postgresql --shell /bin/bash postgres
    mkdir -p /var/lib/postgresql
    chown postgres:postgres /var/lib/postgresql
    apt="apt-get -y -q --no-download --no-install-recommends -o Dpkg::Use-Pty=0
      -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"
    $apt dist-upgrade
  '"$script" sh "$spec" >"$work/install.log" 2>&1 ||
    { tail -n 20 "$work/install.log" >&2; die "installing ${spec%%=*} failed"; }
  # shellcheck disable=SC2016 # a dpkg-query format, not a shell expansion
  installed=$(in_root dpkg-query -W -f '${Version}' "${spec%%=*}")
  [[ $installed == "${spec#*=}" ]] || die "installed ${spec%%=*} $installed, not ${spec#*=}"
  [[ $(in_root id -u postgres):$(in_root id -g postgres) == 999:999 ]] || die "the postgres user is not 999:999"
}

# debian_trim removes what the image does not need: apt's lists and caches, the
# documentation but the copyright files, man pages, translations, compiled locales but
# C.UTF-8, logs; and this machine's name and resolver, which the runtime provides.
debian_trim() {
  log "trimming"
  in_root sh -euc '
    apt-get clean
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/debconf/*-old /var/lib/dpkg/*-old
    find /usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete
    find /usr/share/doc -mindepth 1 -type d -empty -delete
    rm -rf /usr/share/man/* /usr/share/groff/* /usr/share/info/* /usr/share/lintian /usr/share/linda
    find /usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
    find /usr/lib/locale -mindepth 1 -maxdepth 1 ! -name C.utf8 -exec rm -rf {} +
    find /var/log -type f -delete
    rm -rf /tmp/* /var/tmp/* /root/.bash_history /usr/sbin/policy-rc.d /run/adduser
  '
  : >"$rootfs/etc/hostname"
  : >"$rootfs/etc/resolv.conf"
}

# debian_seal ends the checks: /proc unmounted, and debootstrap's device nodes out of the
# image (the runtime mounts /dev).
debian_seal() {
  umount "$rootfs/proc"
  find "$rootfs/dev" -mindepth 1 -delete
}

# debian_pack PREFIX TARBALL MKIMAGE-ARGS... packs the root file system into TARBALL, and
# keeps the newest two of PREFIX's tarballs (the one before for going back).
debian_pack() {
  local prefix=$1 tarball=$2
  shift 2
  log "packing $(du -sm "$rootfs" | cut -f1) MB"
  "$work/mkimage" -rootfs "$rootfs" -platform "linux/$(go env GOARCH)" -o "$tarball.partial" "$@" >/dev/null
  mv -f "$tarball.partial" "$tarball"
  # shellcheck disable=SC2012 # our own file names, no odd characters; ls -t sorts them by time
  ls -1t "$out/$prefix-"*.tar | tail -n +3 | while read -r old; do
    rm -f "$old"
  done
  log "wrote $tarball ($(du -m "$tarball" | cut -f1) MB)"
}
