#!/usr/bin/env bash
# apt-install.sh COMMAND PACKAGE: installs Debian's PACKAGE when COMMAND is missing.
# Needs root (CI runs as root); prints what to run otherwise.
set -euo pipefail
command=$1 package=$2
command -v "$command" >/dev/null && exit 0
if [[ $(id -u) != 0 ]]; then
  echo "$command is missing: run 'sudo apt-get install $package'" >&2
  exit 1
fi
echo "apt-install: installing $package from Debian's packages" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "$package" >/dev/null 2>&1 ||
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "$package" >/dev/null; }
