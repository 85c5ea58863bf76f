#!/usr/bin/env bash
# Installs the Debian packages gradzip's build, tests and demo need. Idempotent: packages
# already present are not touched, and apt-get runs only when something is missing.
# Run as root (or with sudo) on Debian 12.
#
# --torch-venv: also makes the virtual environment with a current PyTorch from PyPI (and its
# NumPy 2.x) that the Python tests run under besides Debian's PyTorch 1.13: GRADZIP_TORCH_VENV,
# default ~/.cache/gradzip/venv-torch, outside the checkout because it is large (about 5 GB with
# the CUDA wheels torch depends on). Made once and reused while its torch imports; when PyPI
# cannot be reached the script says so and goes on (those tests then show as skipped).
set -euo pipefail

torch_venv=0
for argument in "$@"; do
  case $argument in
    --torch-venv) torch_venv=1 ;;
    *) echo "install-deps: unknown argument '$argument' (accepted: --torch-venv)" >&2; exit 2 ;;
  esac
done

make_torch_venv() {
  local venv=${GRADZIP_TORCH_VENV:-$HOME/.cache/gradzip/venv-torch}
  if [[ -x $venv/bin/torchrun ]] && "$venv/bin/python" -c 'import torch, numpy, pytest' 2>/dev/null; then
    echo "install-deps: PyTorch environment $venv present (torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)'))"
    return 0
  fi
  echo "install-deps: making the PyTorch environment $venv (pip install torch numpy pytest; a few GB)"
  mkdir -p "$(dirname "$venv")"
  if ! { /usr/bin/python3 -m venv "$venv" &&
         "$venv/bin/pip" install --quiet --progress-bar off torch numpy pytest; }; then
    echo "install-deps: WARNING: could not make $venv; the tests that need a current PyTorch will be skipped" >&2
    rm -rf "$venv"
  fi
}

packages=(
  build-essential cmake             # compiler and build system
  ccache                            # compiler cache: rebuilds of a fresh checkout take minutes
  libgtest-dev libgmock-dev         # GoogleTest (CMake package GTest)
  libopenmpi-dev openmpi-bin        # Open MPI transport and mpirun
  libeigen3-dev                     # Eigen: PowerSGD's dense products (pipeline/), the MLP example
  zlib1g-dev                        # reading the gzip-compressed IDX files of Fashion-MNIST
  dataset-fashion-mnist             # the real data of the convergence experiments and the demo
  fortunes                          # English text (2.6 MB) for the language-model convergence runs
  python3 python3-matplotlib        # helper scripts, convergence plots
  python3-venv                      # --torch-venv: the PyPI PyTorch environment
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
else
  if [[ $(id -u) -ne 0 ]]; then
    SUDO=sudo
  else
    SUDO=
  fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if ((torch_venv)); then
  make_torch_venv
fi
