#!/usr/bin/env bash
# Installs the Debian packages gradzip's build, tests and demo need. Idempotent: packages
# already present are not touched, and apt-get runs only when something is missing.
# Run as root (or with sudo) on Debian 12.
set -euo pipefail

packages=(
  build-essential cmake             # compiler and build system
  libgtest-dev libgmock-dev         # GoogleTest (CMake package GTest)
  libopenmpi-dev openmpi-bin        # Open MPI transport and mpirun
  libeigen3-dev                     # Eigen: PowerSGD's dense products (pipeline/), the MLP example
  zlib1g-dev                        # reading the gzip-compressed IDX files of Fashion-MNIST
  dataset-fashion-mnist             # the real data of the convergence experiments and the demo
  python3 python3-matplotlib        # helper scripts, convergence plots
  python3-dev pybind11-dev          # the Python module (python/)
  python3-numpy python3-pytest      # its tests
  python3-torch                     # the DDP communication hook and its tests (PyTorch 1.13, CPU)
  clang libclang-rt-14-dev          # libFuzzer for the decoders' fuzz targets (tests/fuzz)
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  SUDO=sudo
else
  SUDO=
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
