#!/usr/bin/env bash
# Installs the Debian packages dtrain needs to build, test and demo; quiet and
# quick when everything is already there. Needs root (or sudo) only to install.
set -euo pipefail
pkgs=(build-essential cmake pkg-config zlib1g-dev libssl-dev libopenblas-openmp-dev libjpeg62-turbo-dev libpng-dev libutf8proc-dev libdnnl-dev
      dataset-fashion-mnist python3 python3-torch python3-numpy python3-sklearn python3-torchvision python3-pil clang libclang-rt-dev time
      openmpi-bin libopenmpi-dev iproute2 protobuf-compiler python3-protobuf chromium slurmctld slurmd slurm-client munge)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "deps: need root to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
