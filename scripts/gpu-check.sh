#!/usr/bin/env bash
# The GPU check of gradzip in one command: builds the GPU tests and gradzip-bench on a machine
# with an NVIDIA GPU, checks the device and NCCL, measures the CUDA kernels and runs the GPU
# tests, every step bounded in time. Written for a machine without internet access (CUDA 13,
# CMake, ninja, optionally PyTorch; no GoogleTest, Eigen, Open MPI or zlib installed), which
# receives GoogleTest and Eigen from a development machine (--prepare).
#
#   scripts/gpu-check.sh --prepare
#       Run on a development machine (with libgtest-dev and libeigen3-dev installed): copies the
#       GoogleTest sources and Eigen's headers and CMake package into .gpu-deps/ (git-ignored)
#       and prints their size with the working tree's. Copy the working tree with .gpu-deps/ to
#       the GPU machine.
#   scripts/gpu-check.sh [--quick] [--allow-skip] [--memcheck] [--deadline S] [--build-dir DIR]
#                        [--jobs N] [--size N|auto] [--repeat R] [--memcheck-bound S]
#       Run on the GPU machine, from the working tree with .gpu-deps/. The whole run is bounded
#       by --deadline S seconds from its start (default 420; 280 with --quick): every step runs
#       with at most what is left, so the run ends in time.
#         1. the device: nvidia-smi (name, driver, memory, compute and MIG mode) and the device
#            count (nvidia-smi -L; none is a failure without --allow-skip); GRADZIP_DEVICE=cuda,
#            so nothing runs on gradzip's emulated device;
#         2. builds GoogleTest from .gpu-deps/googletest into the build folder;
#         3. configures gradzip (CUDA ON for sm_90, MPI, Python and examples OFF, zlib hidden,
#            Eigen and GTest from .gpu-deps); stops, loudly, when the configured build has no
#            NCCL ("gradzip: NCCL transport" not ON, or no GRADZIP_NCCL_LIBRARY in the cache):
#            the GPU tests need it; then builds only the GPU test executables
#            (tests/gpu/test_*.cpp) and gradzip-bench, with -j --jobs (default: all cores);
#         4. preflight: `gradzip-bench kernels --nccl-library` prints the NCCL library gradzip's
#            loader takes at run time (path, the search step that found it, version; failing
#            when none loads), then `gradzip-bench preflight`: device properties, memory-pool
#            support, one allocation through gradzip's device runtime, a one-rank NCCL
#            communicator with one exact all-reduce -> preflight.json;
#         5. `gradzip-bench kernels` -> kernels.json, every kernel against a device-to-device
#            copy in the same run (of its input; for decoders, of the f32 output they write),
#            at sizes of at least 4x the device's L2 cache (read at run time); 2^28 f32
#            elements by default, with --quick the L2 floor (--size auto) and 5 repeats;
#         6. (not with --quick) torch.topk and .half()/.bfloat16()/.float() on the same size
#            with CUDA events -> torch.json (when python3 has torch with CUDA);
#         7. (not with --quick) `gradzip-bench calls`: device allocations and host waits per
#            steady-state all-reduce call, per codec -> calls.json; then `gradzip-bench
#            model --device cuda`: γ of the device codecs and the cost model's projection of
#            calls on CUDA tensors over NCCL -> model-device.json (.txt);
#         8. `ctest -L gpu` (-j 4, GRADZIP_TIMEOUT_S=60, NCCL_DEBUG=WARN), each case stopped
#            after 60 s by this script (below); a failure if any case failed or was stopped,
#            if any case skipped (a skip there means the device was not seen) or if fewer ran
#            than were discovered;
#         9. with --memcheck only, the GPU test executables under compute-sanitizer --tool
#            memcheck, the fast kernels' tests first (test_cast_cuda, test_qsgd_cuda,
#            test_sign_cuda, test_topk_cuda, test_sparse_cuda, test_randk_cuda, test_ef_cuda,
#            test_nonfinite_cuda, test_device_codec), test_communicator_cuda,
#            test_reducer_cuda and test_nccl_transport last, each executable with its own bound
#            (60 s for the kernels' tests, 120 s for the last three, or --memcheck-bound S; never
#            past the deadline); one not finished in its bound is reported as not checked;
#        10. a summary: the kernel table against the targets, what each step found, failures.
#       Measurements come before the tests so that a hanging test cannot cost the figures, and
#       every JSON file is rewritten after each row it gains ("complete": false until its
#       command ends), so a bench that hangs or is stopped keeps every row already measured.
#       A failing configure or build stops the run; later failures do not: they are listed at
#       the end and the exit status is 1. With $OUT set, the log (gpu-check.log) and the JSON
#       files go to $OUT; otherwise to <build dir>/results.
#   --quick       build, preflight, the kernel rows (fewer repeats, the L2-floor size), the GPU
#                 tests and the summary only: under 5 minutes on a 16-core machine with an H100.
#   --allow-skip  dry run without a device: no GPU, skipped GPU tests and benches that found no
#                 device are accepted (the build, NCCL and every check still run). There is no
#                 device time to save, so the default --deadline is then 1800 s and the build
#                 may use all of it (a development machine with 2 cores builds for minutes).
#   --build-dir   default <repo>/build-gpu-check;  --jobs  default $(nproc)
#   --size/--repeat  passed to gradzip-bench kernels (and the PyTorch timing).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS=$ROOT/.gpu-deps
GTEST_SRC=${GTEST_SRC:-/usr/src/googletest}
EIGEN_INCLUDE=${EIGEN_INCLUDE:-/usr/include/eigen3}
EIGEN_CMAKE=${EIGEN_CMAKE:-/usr/share/eigen3/cmake}
COPY_LIMIT_MIB=64

# The GPU tests' executables under --memcheck: the fast kernels' first, the NCCL-bound last.
MEMCHECK_FIRST=(test_cast_cuda test_qsgd_cuda test_sign_cuda test_topk_cuda test_sparse_cuda
                test_randk_cuda test_ef_cuda test_nonfinite_cuda test_device_codec)
MEMCHECK_LAST=(test_communicator_cuda test_reducer_cuda test_nccl_transport)
CASE_BOUND_S=60  # each ctest case of `ctest -L gpu`

die() {
  echo "gpu-check: FAILED: $*" >&2
  exit 1
}

# ---- --prepare: on the development machine ----------------------------------------------------
prepare() {
  [[ -f $GTEST_SRC/CMakeLists.txt && -d $GTEST_SRC/googletest ]] ||
    die "no GoogleTest sources at $GTEST_SRC (Debian: apt-get install googletest, or scripts/install-deps.sh)"
  [[ -f $EIGEN_INCLUDE/Eigen/Dense ]] ||
    die "no Eigen headers at $EIGEN_INCLUDE (Debian: apt-get install libeigen3-dev)"
  [[ -f $EIGEN_CMAKE/Eigen3Config.cmake && -f $EIGEN_CMAKE/Eigen3Targets.cmake ]] ||
    die "no Eigen CMake package at $EIGEN_CMAKE (Debian: apt-get install libeigen3-dev)"
  rm -rf "$DEPS"
  # GoogleTest without googlemock (configured with BUILD_GMOCK=OFF).
  mkdir -p "$DEPS/googletest" || die "cannot create $DEPS"
  cp -a "$GTEST_SRC/CMakeLists.txt" "$GTEST_SRC/googletest" "$DEPS/googletest/" || die "copying GoogleTest"
  # Eigen as an install prefix: include/eigen3/{Eigen,signature...} and share/eigen3/cmake/,
  # so Debian's Eigen3Targets.cmake (which finds its prefix three folders above itself) works.
  # Only Eigen/ is used by gradzip (no unsupported/).
  mkdir -p "$DEPS/eigen/include/eigen3" "$DEPS/eigen/share/eigen3/cmake" || die "cannot create $DEPS/eigen"
  cp -a "$EIGEN_INCLUDE/Eigen" "$EIGEN_INCLUDE/signature_of_eigen3_matrix_library" \
    "$DEPS/eigen/include/eigen3/" || die "copying Eigen headers"
  cp -a "$EIGEN_CMAKE"/*.cmake "$DEPS/eigen/share/eigen3/cmake/" || die "copying Eigen's CMake package"
  git -C "$ROOT" check-ignore -q "$DEPS/eigen/include/eigen3/Eigen/Dense" ||
    die ".gpu-deps/ is not git-ignored: it would be copied twice (add /.gpu-deps/ to .gitignore)"

  local deps_bytes tree_bytes
  deps_bytes=$(du -sb "$DEPS" | cut -f1)
  # What is copied besides: tracked and untracked-but-not-ignored files.
  tree_bytes=$(cd "$ROOT" && git ls-files -z -co --exclude-standard |
    xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}')
  echo "gpu-check --prepare: $DEPS"
  du -sh "$DEPS/googletest" "$DEPS/eigen"
  awk -v d="$deps_bytes" -v t="$tree_bytes" -v l="$COPY_LIMIT_MIB" 'BEGIN {
    printf ".gpu-deps: %.1f MiB; working tree (tracked and not ignored): %.1f MiB; together %.1f MiB (keep under %d)\n",
      d / 1048576, t / 1048576, (d + t) / 1048576, l }'
  if ((deps_bytes + tree_bytes > 48 * 1024 * 1024)); then
    die "over 48 MiB to copy: too close to ${COPY_LIMIT_MIB} MiB"
  fi
  cat <<'EOF'

Now copy the working tree with .gpu-deps/ (git-ignored: copy it explicitly) to the GPU machine
and run there, from the repository root:
  bash scripts/gpu-check.sh --quick      # build, preflight, kernel rows, GPU tests: < 5 min
  bash scripts/gpu-check.sh              # also PyTorch and per-call counts: bounded to 420 s
  bash scripts/gpu-check.sh --memcheck   # then the GPU tests under compute-sanitizer
Results: gpu-check.log, preflight.json, kernels.json (torch.json, calls.json, model-device.json)
in $OUT when set,
else in build-gpu-check/results.
EOF
}

# ---- the check: on the GPU machine ------------------------------------------------------------
START=$SECONDS
step_start=$SECONDS
step() {  # step NAME: prints a header with the elapsed time
  echo
  echo "==== gpu-check: $1   (t = $((SECONDS - START)) s)"
  step_start=$SECONDS
}
run_step() {  # run_step WHAT CMD...: runs CMD, dies naming WHAT on failure
  local what=$1
  shift
  "$@"
  local status=$?
  ((status == 0)) || die "$what (exit $status): $*"
}
# bound_for CAP: the seconds a step may take: CAP, or what is left before the run's deadline
# (--deadline, from the start) when that is less, and never under 5.
DEADLINE=420
bound_for() {
  local left=$((DEADLINE - (SECONDS - START)))
  local bound=$(($1 < left ? $1 : left))
  echo $((bound < 5 ? 5 : bound))
}
# Failures after the build do not stop the run (one run should report everything); they are
# listed, and make the exit status nonzero, at the end.
FAILURES=()
fail_later() {
  echo "gpu-check: FAILURE: $*"
  FAILURES+=("$*")
}
# One line per step for the summary.
FOUND=()
found() { FOUND+=("$*"); }

# json_field FILE EXPR: python3's answer for the JSON in FILE (EXPR over `d`), or nothing.
json_field() {
  [[ -n ${PYTHON:-} && -f $1 ]] || return 0
  "$PYTHON" - "$1" "$2" <<'PY' 2>/dev/null
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print(eval(sys.argv[2], {"d": d}))
except Exception as error:
    print(f"(unreadable: {error})")
PY
}

# device_bench NAME BUILD RESULTS ALLOW_SKIP: `gradzip-bench NAME --json RESULTS/NAME.json`,
# at most 60 s (or what is left), NCCL quiet but for warnings and gradzip's waits at most 60 s;
# a failure, an overrun or (without --allow-skip) a run that found no device is noted.
device_bench() {
  local name=$1 build=$2 results=$3 allow_skip=$4
  rm -f "$results/$name.json"
  NCCL_DEBUG=WARN GRADZIP_TIMEOUT_S=60 timeout --kill-after=10 "$(bound_for 60)" \
    "$build/gradzip/bin/gradzip-bench" "$name" --json "$results/$name.json"
  local status=$?
  ((status == 0)) || fail_later "gradzip-bench $name (exit $status; 124: over its bound)"
  if grep -q '"skipped"' "$results/$name.json" 2>/dev/null; then
    if [[ $allow_skip == 1 ]]; then
      found "$name: no device (accepted: --allow-skip)"
    else
      fail_later "gradzip-bench $name found no device: $(cat "$results/$name.json")"
    fi
  elif grep -q '"complete": false' "$results/$name.json" 2>/dev/null; then
    fail_later "gradzip-bench $name stopped before the end: $(cat "$results/$name.json")"
  else
    found "$name: exit $status"
  fi
}

# children_of PID: "PID:STARTTIME" of each direct child of PID (from /proc, no procps needed).
children_of() {
  local parent=$1 stat line rest fields pid
  for stat in /proc/[0-9]*/stat; do
    read -r line 2>/dev/null <"$stat" || continue
    rest=${line##*) }  # the fields after the command name, which may hold spaces or ')'
    read -ra fields <<<"$rest"
    [[ ${fields[1]:-} == "$parent" ]] || continue
    pid=${stat#/proc/}
    echo "${pid%/stat}:${fields[19]:-0}"
  done
}

# ctest_bounded LOG STEP_BOUND CMD...: runs the ctest command CMD in the background with its
# output in LOG (and on stdout as it comes), and stops each of its test processes that runs
# longer than CASE_BOUND_S seconds (TERM, then KILL 5 s later), and everything at STEP_BOUND.
#
# Why a watchdog and not `ctest --timeout`: --timeout applies only to tests WITHOUT a TIMEOUT
# property, and gtest_discover_tests gives every GPU case one (tests/CMakeLists.txt), which
# wins. The 60 s per case is therefore enforced here, whatever that property says. Each case is
# a direct child of ctest (ctest spawns the test executable itself); the watchdog times them
# from when it first sees them (polling every second), so it needs no process start times.
# Sets CTEST_STATUS (ctest's exit status) and STOPPED (the cases stopped, one per element).
CTEST_STATUS=0
STOPPED=()
ctest_bounded() {
  local log=$1 step_bound=$2
  shift 2
  : >"$log"  # before tail opens it
  "$@" >"$log" 2>&1 &
  local ctest_pid=$!
  tail -n +1 -f --pid="$ctest_pid" "$log" &
  local tail_pid=$!
  local step_end=$((SECONDS + step_bound)) key pid what
  declare -A first_seen=() termed=()
  STOPPED=()
  while kill -0 "$ctest_pid" 2>/dev/null; do
    for key in $(children_of "$ctest_pid"); do
      pid=${key%%:*}
      [[ -n ${first_seen[$key]:-} ]] || first_seen[$key]=$SECONDS
      if [[ -z ${termed[$key]:-} ]] && ((SECONDS - first_seen[$key] > CASE_BOUND_S || SECONDS > step_end)); then
        what=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | sed -n 's/.*--gtest_filter=\([^ ]*\).*/\1/p')
        echo "gpu-check: stopping ${what:-pid $pid} after $((SECONDS - first_seen[$key])) s" \
          "($( ((SECONDS > step_end)) && echo "the step's bound of $step_bound s" || echo "the bound of $CASE_BOUND_S s per case"))"
        kill -TERM "$pid" 2>/dev/null
        termed[$key]=$SECONDS
        STOPPED+=("${what:-pid $pid}")
      elif [[ -n ${termed[$key]:-} ]] && ((SECONDS - termed[$key] >= 5)); then
        kill -KILL "$pid" 2>/dev/null
      fi
    done
    if ((SECONDS > step_end + 10)); then  # ctest itself did not end after its cases did
      echo "gpu-check: stopping ctest (pid $ctest_pid): over the step's bound of $step_bound s"
      kill -TERM "$ctest_pid" 2>/dev/null
      sleep 5
      kill -KILL "$ctest_pid" 2>/dev/null
      break
    fi
    sleep 1
  done
  wait "$ctest_pid"
  CTEST_STATUS=$?
  wait "$tail_pid" 2>/dev/null
}

check() {
  local allow_skip=$1 memcheck=$2 build=$3 jobs=$4 size=$5 repeat=$6 deadline=$7 quick=$8
  local memcheck_bound=$9
  local results=${OUT:-$build/results}
  mkdir -p "$results" || die "cannot create $results"
  PYTHON=
  command -v python3 >/dev/null && PYTHON=python3

  DEADLINE=$deadline
  local mode="full"
  [[ $quick == 1 ]] && mode="quick"
  step "environment and device ($mode run, bounded to $DEADLINE s in all: each step gets at most what is left)"
  echo "repo: $ROOT   build: $build   results: $results   jobs: $jobs"
  echo "gpu-check: total bound: $DEADLINE s (--deadline); steps, at most:" \
    "build $([[ $allow_skip == 1 ]] && echo "$DEADLINE (dry run)" || echo 300), preflight 60," \
    "kernels $([[ $quick == 1 ]] && echo 60 || echo 150)$([[ $quick == 1 ]] || echo ', PyTorch 90, calls 60')," \
    "ctest 240 ($CASE_BOUND_S per case)$([[ $memcheck == 1 ]] && echo ', memcheck what is left')"
  # The real device only: gradzip's emulated device (GRADZIP_DEVICE=emulated) must not stand in.
  export GRADZIP_DEVICE=cuda
  echo "GRADZIP_DEVICE=cuda   CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-(unset)}"
  local gpus=0
  if command -v nvidia-smi >/dev/null; then
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,compute_mode,mig.mode.current \
      --format=csv || echo "gpu-check: nvidia-smi did not answer (exit $?)"
    gpus=$(timeout 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  else
    echo "gpu-check: no nvidia-smi here"
  fi
  echo "devices (nvidia-smi -L): $gpus"
  if ((gpus == 0)); then
    if [[ $allow_skip == 1 ]]; then
      found "device: none (accepted: --allow-skip)"
    else
      fail_later "no GPU visible (nvidia-smi -L lists none)"
    fi
  else
    found "device: $gpus GPU(s), $(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
  fi
  # The toolkit's own nvcc first (as CMakeLists.txt does), then whatever PATH has.
  local nvcc=
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then nvcc=/usr/local/cuda/bin/nvcc; elif command -v nvcc >/dev/null; then
    nvcc=$(command -v nvcc)
  fi
  [[ -n $nvcc ]] || die "no nvcc at /usr/local/cuda/bin or on PATH"
  "$nvcc" --version | tail -n 2
  cmake --version | head -n 1 || die "no cmake"
  local generator=()
  if command -v ninja >/dev/null; then generator=(-G Ninja); echo "ninja $(ninja --version)"; fi
  [[ -f $DEPS/googletest/CMakeLists.txt && -f $DEPS/eigen/share/eigen3/cmake/Eigen3Config.cmake ]] ||
    die "$DEPS is missing or incomplete: run 'scripts/gpu-check.sh --prepare' on a development machine and copy .gpu-deps/ along"

  step "GoogleTest from .gpu-deps/googletest"
  local gtest_prefix=$build/deps/gtest-install
  if [[ -f $gtest_prefix/lib/cmake/GTest/GTestConfig.cmake ]]; then
    echo "already installed in $gtest_prefix"
  else
    # GoogleTest 1.12 asks for CMake 3.5, which CMake 4 no longer accepts without this.
    local policy=()
    [[ $(cmake --version | sed -n 's/^cmake version \([0-9]*\).*/\1/p') -ge 4 ]] &&
      policy=(-DCMAKE_POLICY_VERSION_MINIMUM=3.5)
    run_step "configure GoogleTest" cmake -S "$DEPS/googletest" -B "$build/deps/gtest-build" "${generator[@]}" \
      -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON "${policy[@]}" \
      -DCMAKE_INSTALL_PREFIX="$gtest_prefix" -DCMAKE_INSTALL_LIBDIR=lib
    run_step "build GoogleTest" cmake --build "$build/deps/gtest-build" -j "$jobs"
    run_step "install GoogleTest" cmake --install "$build/deps/gtest-build"
  fi

  # NCCL: the CUDA toolkit's, else the one PyTorch's wheels bring (nvidia-nccl); without one,
  # the configure below has no NCCL transport and the check stops.
  local nccl_root=${NCCL_ROOT:-}
  if [[ -z $nccl_root && ! -f $(dirname "$nvcc")/../include/nccl.h ]]; then
    nccl_root=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null) || nccl_root=
  fi
  [[ -n $nccl_root ]] && { export NCCL_ROOT=$nccl_root; echo "NCCL from $nccl_root"; }

  # The GPU machine has no zlib: the examples (the Fashion-MNIST loader needs it) are off, and
  # zlib is hidden from CMake here too, so a dry run on a machine that has it fails the same way
  # the GPU machine would if anything still looked for it.
  step "configure gradzip (CUDA sm_90, NCCL required; no MPI, no Python, no examples, no zlib)"
  # Through ccache when installed (as scripts/configure-and-build.sh), so that a rerun or a dry
  # run on a development machine rebuilds little; paths hashed relative to the checkout.
  local launchers=()
  if command -v ccache >/dev/null; then
    export CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=true
    launchers=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
               -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    echo "compiling through $(command -v ccache)"
  fi
  local configure_log=$build/configure.log
  cmake -S "$ROOT" -B "$build/gradzip" "${generator[@]}" "${launchers[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGRADZIP_WITH_CUDA=ON -DGRADZIP_WITH_MPI=OFF -DGRADZIP_WITH_PYTHON=OFF \
    -DGRADZIP_SANITIZE_TESTS=OFF -DGRADZIP_TSAN_DEVICE_TESTS=OFF -DGRADZIP_BUILD_TESTS=ON -DGRADZIP_BUILD_BENCHMARKS=ON \
    -DGRADZIP_BUILD_EXAMPLES=OFF -DCMAKE_DISABLE_FIND_PACKAGE_ZLIB=ON \
    -DGTest_DIR="$gtest_prefix/lib/cmake/GTest" \
    -DEigen3_DIR="$DEPS/eigen/share/eigen3/cmake" \
    -DCMAKE_PREFIX_PATH="$gtest_prefix;$DEPS/eigen" 2>&1 | tee "$configure_log"
  local configure_status=${PIPESTATUS[0]}
  ((configure_status == 0)) || die "configure gradzip (exit $configure_status; $configure_log)"
  # The carried copies, not some other installation, must be the ones found.
  local cache=$build/gradzip/CMakeCache.txt
  grep -q "^GTest_DIR:[A-Z]*=$gtest_prefix/lib/cmake/GTest$" "$cache" ||
    die "GTest was not found in $gtest_prefix: $(grep '^GTest_DIR' "$cache")"
  grep -q "^Eigen3_DIR:[A-Z]*=$DEPS/eigen/share/eigen3/cmake$" "$cache" ||
    die "Eigen was not found in $DEPS/eigen: $(grep '^Eigen3_DIR' "$cache")"
  grep -q 'gradzip: CUDA kernels ON' "$configure_log" ||
    die "the configured build has no CUDA kernels: $(grep 'gradzip: CUDA' "$configure_log")"
  # NCCL is required here: without it the NCCL tests and the Communicator / Reducer paths over
  # NCCL would only check the stand-ins. GRADZIP_HAVE_NCCL is no cache entry: the configure
  # line and the library CMake found say it.
  local nccl_library nccl_include
  nccl_library=$(sed -n 's/^GRADZIP_NCCL_LIBRARY:[A-Z]*=//p' "$cache")
  nccl_include=$(sed -n 's/^GRADZIP_NCCL_INCLUDE_DIR:[A-Z]*=//p' "$cache")
  if ! grep -q 'gradzip: NCCL transport ON' "$configure_log" || [[ -z $nccl_library || $nccl_library == *NOTFOUND* ||
    -z $nccl_include || $nccl_include == *NOTFOUND* ]]; then
    echo "gpu-check: NO NCCL in the configured build:" \
      "$(grep 'gradzip: NCCL transport' "$configure_log"), GRADZIP_NCCL_LIBRARY='$nccl_library'," \
      "GRADZIP_NCCL_INCLUDE_DIR='$nccl_include'" >&2
    die "the GPU check needs NCCL (nccl.h and libnccl.so.2): install it with the CUDA toolkit," \
      "or PyTorch's nvidia-nccl wheel, or set NCCL_ROOT to a folder with include/nccl.h and lib/libnccl.so.2"
  fi
  echo "NCCL at configure time: $nccl_library (header in $nccl_include)"

  # The gpu test executables: one per tests/gpu/test_*.cpp (a missing target fails the build).
  # Their cases are registered one by one (ctest gpu.<Suite>.<Case>) when each is built.
  local gpu_tests=() source
  for source in "$ROOT"/tests/gpu/test_*.cpp; do gpu_tests+=("$(basename "$source" .cpp)"); done
  [[ ${gpu_tests[0]} != "test_*" ]] || die "no tests/gpu/test_*.cpp"  # the glob matched nothing
  echo "gpu tests: ${gpu_tests[*]}"

  step "build ${gpu_tests[*]} gradzip-bench"
  local targets=()
  for name in "${gpu_tests[@]}" gradzip-bench; do targets+=(--target "$name"); done
  # Keep going past the first error, so one run shows every compile error.
  local keep_going=(-k)
  [[ ${#generator[@]} -gt 0 ]] && keep_going=(-k 0)
  local build_cap=300
  [[ $allow_skip == 1 ]] && build_cap=$DEADLINE  # a dry run: a slow machine may take longer
  # NCCL's header on every compile's include path (as a system folder, after the build's own):
  # gradzip-bench asks gradzip's NCCL loader which library it takes, which needs nccl.h, and
  # CMake gives that folder to the library and the tests only.
  CPLUS_INCLUDE_PATH=$nccl_include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH} \
    run_step "build (exit 124: over its bound)" timeout --kill-after=10 "$(bound_for "$build_cap")" \
    cmake --build "$build/gradzip" -j "$jobs" "${targets[@]}" -- "${keep_going[@]}"
  echo "built in $((SECONDS - step_start)) s"
  found "build: ${#gpu_tests[@]} GPU test executables and gradzip-bench in $((SECONDS - step_start)) s (-j $jobs)"
  local bench=$build/gradzip/bin/gradzip-bench

  step "preflight: the NCCL library gradzip loads; the device, its memory pools, a one-rank NCCL communicator"
  local nccl_line nccl_status
  nccl_line=$(NCCL_DEBUG=WARN timeout --kill-after=5 "$(bound_for 30)" "$bench" kernels --nccl-library 2>&1)
  nccl_status=$?
  echo "$nccl_line"
  if ((nccl_status == 0)); then
    found "$(grep -m1 '^NCCL library' <<<"$nccl_line")"
  else
    echo "gpu-check: ============================================================================"
    echo "gpu-check: gradzip's NCCL loader takes NO library here (exit $nccl_status): the NCCL tests will fail"
    echo "gpu-check: ============================================================================"
    fail_later "NCCL: gradzip's loader takes no library (exit $nccl_status): $nccl_line"
  fi
  device_bench preflight "$build" "$results" "$allow_skip"

  step "gradzip-bench kernels"
  local bench_args=(--json "$results/kernels.json")
  if [[ -n $size ]]; then bench_args+=(--size "$size"); elif [[ $quick == 1 ]]; then bench_args+=(--size auto); fi
  if [[ -n $repeat ]]; then bench_args+=(--repeat "$repeat"); elif [[ $quick == 1 ]]; then bench_args+=(--repeat 5); fi
  rm -f "$results/kernels.json"
  local kernels_cap=150
  [[ $quick == 1 ]] && kernels_cap=60
  NCCL_DEBUG=WARN timeout --kill-after=10 "$(bound_for $kernels_cap)" "$bench" kernels "${bench_args[@]}"
  local kernels_status=$?
  ((kernels_status == 0)) || fail_later "gradzip-bench kernels (exit $kernels_status; 124: over its bound)"
  if [[ ! -f $results/kernels.json ]]; then
    fail_later "gradzip-bench kernels wrote no $results/kernels.json"
  elif grep -q '"skipped"' "$results/kernels.json"; then
    if [[ $allow_skip == 1 ]]; then
      echo "gpu-check: the bench found no device: accepted (--allow-skip)"
      found "kernels: no device (accepted: --allow-skip)"
    else
      fail_later "gradzip-bench kernels found no device: $(cat "$results/kernels.json")"
    fi
  else
    grep -q '"complete": true' "$results/kernels.json" ||
      fail_later "gradzip-bench kernels stopped before the end: kernels.json holds the rows measured until then"
    found "kernels: $(json_field "$results/kernels.json" \
      '"{} rows, {} failed, at {} elements (L2 {} B), complete: {}".format(len(d["kernels"]), len(d["failed"]), d["size"], d["l2_bytes"], d["complete"])')"
  fi
  echo "bench in $((SECONDS - step_start)) s"

  if [[ $quick != 1 ]]; then
    step "PyTorch on the same sizes"
    rm -f "$results/torch.json"
    # The size the kernel bench measured (it may have raised --size to the L2 floor).
    local torch_size
    torch_size=$(json_field "$results/kernels.json" 'd.get("size", "")')
    [[ $torch_size =~ ^[0-9]+$ ]] || torch_size=${size:-268435456}
    [[ $torch_size =~ ^[0-9]+$ ]] || torch_size=268435456
    if [[ -n $PYTHON ]] && "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
      PYTHONUNBUFFERED=1 timeout --kill-after=10 "$(bound_for 90)" "$PYTHON" - "$torch_size" "${repeat:-20}" "$results/torch.json" <<'PY' || fail_later "the PyTorch timing (exit $?; 124: over its bound)"
import json, os, sys
import torch

n, repeat, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dev = torch.device("cuda")
gen = torch.Generator(device=dev)
gen.manual_seed(2024)
x = torch.randn(n, device=dev, dtype=torch.float32, generator=gen)
a = x.abs()
h, b = x.half(), x.bfloat16()
k = max(1, -(-n // 100))  # ceil(n / 100), the spec's k at ratio 0.01, as gradzip-bench

def median_seconds(fn):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    times.sort()
    m = len(times) // 2
    return times[m] if len(times) % 2 else 0.5 * (times[m - 1] + times[m])

topk_out = k * (4 + 8)  # values f32 + indices int64
entries = [  # name, launch, minimum bytes moved, tensor the baseline copies (the bytes written
             # for the widening casts, as gradzip-bench does for decoders)
    ("torch.half", lambda: x.half(), 6 * n, x),
    ("torch.bfloat16", lambda: x.bfloat16(), 6 * n, x),
    ("torch.half.float", lambda: h.float(), 6 * n, x),
    ("torch.bfloat16.float", lambda: b.float(), 6 * n, x),
    ("torch.topk(x.abs(),k)", lambda: torch.topk(x.abs(), k), 4 * n + topk_out, x),
    ("torch.topk(x.abs(),k,sorted=False)", lambda: torch.topk(x.abs(), k, sorted=False), 4 * n + topk_out, x),
    ("torch.topk(a,k,sorted=False)", lambda: torch.topk(a, k, sorted=False), 4 * n + topk_out, a),
]
props = torch.cuda.get_device_properties(0)
print(f"PyTorch {torch.__version__} on {props.name}: {n} f32 elements, k = {k}, median of {repeat} runs")
print(f"{'kernel':<36} {'time ms':>10} {'GB/s':>9} {'copy GB/s':>10} {'of copy':>8}")
rows = []

def save(complete):  # the whole file after every row, renamed over the last one
    with open(path + ".part", "w") as out:
        json.dump({"benchmark": "torch", "complete": complete, "torch": torch.__version__,
                   "device": props.name, "size": n, "k": k, "repeat": repeat, "kernels": rows}, out, indent=1)
    os.replace(path + ".part", path)

save(False)
for name, fn, nbytes, src in entries:
    dst = torch.empty_like(src)
    copy_s = median_seconds(lambda: dst.copy_(src))
    del dst
    t = median_seconds(fn)
    copy_bytes = src.numel() * src.element_size()
    gbps, copy_gbps = nbytes / t / 1e9, 2 * copy_bytes / copy_s / 1e9
    rows.append({"name": name, "time_s": t, "bytes": nbytes, "gbps": gbps, "copy_bytes": copy_bytes,
                 "copy_time_s": copy_s, "copy_gbps": copy_gbps, "fraction_of_copy": gbps / copy_gbps})
    print(f"{name:<36} {t * 1e3:10.4f} {gbps:9.1f} {copy_gbps:10.1f} {gbps / copy_gbps:8.3f}", flush=True)
    save(False)
save(True)
PY
      found "PyTorch: $(json_field "$results/torch.json" '"{} rows, complete: {}".format(len(d["kernels"]), d["complete"])')"
    else
      echo "gpu-check: python3 with a CUDA-enabled torch is not available here: no PyTorch comparison"
      found "PyTorch: not available"
    fi

    step "gradzip-bench calls: device allocations and host waits per steady-state call"
    device_bench calls "$build" "$results" "$allow_skip"

    step "gradzip-bench model --device cuda: the device codecs' gamma, device calls projected"
    if grep -q '"skipped"' "$results/preflight.json" 2>/dev/null; then
      found "model --device cuda: no device (not run)"
    else
      rm -f "$results/model-device.json"
      timeout --kill-after=10 "$(bound_for 90)" "$bench" model --device cuda --models resnet50,7b \
        --json "$results/model-device.json" >"$results/model-device.txt" 2>&1
      local model_status=$?
      if ((model_status == 0)); then
        found "model --device cuda: model-device.json"
      else
        fail_later "gradzip-bench model --device cuda (exit $model_status; 124: over its bound): $(tail -n 3 "$results/model-device.txt")"
      fi
    fi
  fi

  step "ctest -L gpu"
  local ctest_log=$build/ctest-gpu.log
  # -V prints every test's output, passed ones too: a GTEST_SKIP exits 0, so the skips show
  # only there ("[  SKIPPED ]"); each line carries its test's number. -j 4: the tests' CPU
  # references use the cores while the GPU is shared (each test is its own process).
  # Bounded three ways: each case by this script's watchdog (CASE_BOUND_S = 60 s; ctest_bounded
  # says why not ctest's --timeout), each wait inside gradzip by its deadline
  # (GRADZIP_TIMEOUT_S=60, so a hung NCCL call ends as an error, not a stall), and the whole step
  # by what is left of the run's bound.
  local ctest_bound
  ctest_bound=$(bound_for 240)
  ctest_bounded "$ctest_log" "$ctest_bound" \
    env GRADZIP_TIMEOUT_S=60 NCCL_DEBUG=WARN ctest --test-dir "$build/gradzip" -L gpu -V -j 4 --output-on-failure
  local ctest_status=$CTEST_STATUS
  local stopped
  for stopped in "${STOPPED[@]}"; do fail_later "ctest -L gpu: $stopped stopped (over $CASE_BOUND_S s, or the step's bound)"; done
  ((ctest_status == 0)) || fail_later "ctest -L gpu (exit $ctest_status)"
  # Every discovered case must have run (skipped cases count: ctest lists them as not run).
  local ran cases
  cases=$(ctest --test-dir "$build/gradzip" -N -L gpu 2>/dev/null | grep -c 'Test *#[0-9]*: gpu\.')
  ran=$(sed -n 's/.*tests passed, [0-9]* tests\{0,1\} failed out of \([0-9]*\).*/\1/p' "$ctest_log" | tail -n 1)
  local failed_cases
  failed_cases=$(sed -n 's/.*tests passed, \([0-9]*\) tests\{0,1\} failed out of.*/\1/p' "$ctest_log" | tail -n 1)
  ((cases >= ${#gpu_tests[@]})) ||
    fail_later "ctest -L gpu lists $cases cases for ${#gpu_tests[@]} executables: discovery missed some"
  [[ $ran == "$cases" ]] || fail_later "ctest -L gpu ran '${ran:-no}' tests of the $cases discovered"
  # Any "[  SKIPPED ]" line fails; the cases are the lines with a time, "Suite.Name (0 ms)".
  local skip_lines skipped
  skip_lines=$(grep -c '\[  SKIPPED \]' "$ctest_log")
  skipped=$(grep -c '\[  SKIPPED \] .* ([0-9]* ms)$' "$ctest_log")
  if ((skip_lines > 0)); then
    echo "skipped test cases (first 10) and the reasons given:"
    grep '\[  SKIPPED \] .* ([0-9]* ms)$' "$ctest_log" | head -n 10
    grep -B1 '\[  SKIPPED \] .* ([0-9]* ms)$' "$ctest_log" | grep -v '\[  SKIPPED \]\|^--$' |
      sed 's/^[0-9]*: //' | sort | uniq -c | sort -rn | head -n 5
    if [[ $allow_skip == 1 ]]; then
      echo "gpu-check: $skipped gpu test cases skipped: accepted (--allow-skip)"
    else
      fail_later "$skipped gpu test cases skipped: with a device, none may skip"
    fi
  fi
  echo "gpu tests: ${#gpu_tests[@]} executables, $cases cases, ctest exit $ctest_status, $skipped cases skipped, in $((SECONDS - step_start)) s"
  found "ctest -L gpu: $cases cases, ${ran:-?} run, ${failed_cases:-?} failed, $skipped skipped, ${#STOPPED[@]} stopped at $CASE_BOUND_S s (exit $ctest_status)"

  if [[ $memcheck == 1 ]]; then
    # After the measurements and the tests. Each executable has its own bound (and none goes
    # past the deadline); one not finished within it is reported as not checked.
    step "compute-sanitizer --tool memcheck (until t = $deadline s at most)"
    local sanitizer mc_log mc_status left bound ordered=() name rest=()
    sanitizer=$(command -v compute-sanitizer || echo "$(dirname "$nvcc")/compute-sanitizer")
    # The order: MEMCHECK_FIRST, then any other gpu test, then MEMCHECK_LAST.
    for name in "${MEMCHECK_FIRST[@]}"; do [[ " ${gpu_tests[*]} " == *" $name "* ]] && ordered+=("$name"); done
    for name in "${gpu_tests[@]}"; do
      [[ " ${MEMCHECK_FIRST[*]} ${MEMCHECK_LAST[*]} " == *" $name "* ]] || rest+=("$name")
    done
    ordered+=("${rest[@]}")
    for name in "${MEMCHECK_LAST[@]}"; do [[ " ${gpu_tests[*]} " == *" $name "* ]] && ordered+=("$name"); done
    local checked=0 unchecked=0
    if [[ ! -x $sanitizer ]]; then
      fail_later "no compute-sanitizer (for --memcheck)"
    else
      for name in "${ordered[@]}"; do
        left=$((deadline - (SECONDS - START)))
        if ((left < 15)); then
          echo "memcheck $name: not checked (the run's deadline)"
          unchecked=$((unchecked + 1))
          continue
        fi
        if [[ -n $memcheck_bound ]]; then bound=$memcheck_bound
        elif [[ " ${MEMCHECK_LAST[*]} " == *" $name "* ]]; then bound=120
        else bound=60; fi
        ((bound > left)) && bound=$left
        mc_log=$build/memcheck-$name.log
        GRADZIP_TIMEOUT_S=60 NCCL_DEBUG=WARN timeout --kill-after=10 "$bound" \
          "$sanitizer" --tool memcheck --error-exitcode 99 "$build/gradzip/bin/$name" >"$mc_log" 2>&1
        mc_status=$?
        if grep -q 'Device not supported' "$mc_log"; then
          echo "memcheck: compute-sanitizer refuses this device (gVisor machines do): not checked"
          head -n 5 "$mc_log"
          unchecked=$((${#ordered[@]} - checked))
          break
        elif ((mc_status == 124 || mc_status == 137)); then
          echo "memcheck $name: not finished within its bound of $bound s: not checked"
          unchecked=$((unchecked + 1))
        elif ((mc_status == 0)); then
          echo "memcheck $name: $(grep -m1 'ERROR SUMMARY' "$mc_log") (bound $bound s)"
          checked=$((checked + 1))
        else
          head -n 60 "$mc_log"
          fail_later "compute-sanitizer memcheck $name (exit $mc_status; log $mc_log)"
          checked=$((checked + 1))
        fi
      done
    fi
    found "memcheck: $checked executables checked, $unchecked not checked"
  fi

  step "summary"
  if [[ -n $PYTHON && -f $results/kernels.json ]]; then
    "$PYTHON" - "$results/kernels.json" "$results/torch.json" "$results/calls.json" <<'PY'
import json, os, sys

def load(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)

ours, torch_rows = load(sys.argv[1]), load(sys.argv[2])
if ours and ours.get("nccl"):
    nccl = ours["nccl"]
    print("NCCL (gradzip's loader): " + (f"{nccl['path']} ({nccl['found_by']}), {nccl['version_text']}"
                                          if nccl.get("loaded") else f"none: {nccl.get('error')}"))
rows = [("gradzip", r) for r in (ours or {}).get("kernels", [])]
rows += [("torch", r) for r in (torch_rows or {}).get("kernels", [])]
if not rows:
    print("no kernel measured")
else:
    if ours and ours.get("input_copy_gbps"):
        print(f"{ours['device']}: copy of the {ours['size']}-element f32 input {ours['input_copy_gbps']:.0f} GB/s "
              f"(read + written); L2 {ours.get('l2_bytes', 0) / 2**20:.0f} MiB")
        print("'of copy' = against a device copy in the same run of each kernel's input, or for decoders of "
              f"the f32 output they write, never under {ours.get('copy_floor_bytes', 0) / 2**20:.0f} MiB (4x L2)")
    if ours and not ours.get("complete", True):
        print(f"kernels.json is INCOMPLETE: the bench stopped after {len(ours.get('kernels', []))} rows")
    print(f"{'':8} {'kernel':<36} {'time ms':>10} {'GB/s':>9} {'of copy':>8}  target")
    # Top-k against torch.topk(x.abs(), k) (the comparison the targets name), and against the fastest torch
    # variant measured (sorted=False, |x| precomputed: the strictest).
    torch_topk = next((r for who, r in rows if r["name"] == "torch.topk(x.abs(),k)"), None)
    torch_topks = [r for who, r in rows if who == "torch" and r["name"].startswith("torch.topk")]
    fastest = min(torch_topks, key=lambda r: r["time_s"]) if torch_topks else None

    def versus(r):
        if not fastest or fastest is torch_topk:
            return ""
        return f"; {fastest['time_s'] / r['time_s']:.2f}x vs {fastest['name']}"

    for who, r in rows:
        target = ""
        name = r["name"]
        if who == "gradzip":
            if name.split(".")[0] in ("cast", "qsgd", "sign", "ef"):
                target = f">= 0.80 of copy: {'met' if r['fraction_of_copy'] >= 0.8 else 'NOT met'}"
            elif name.startswith("topk.exact") and torch_topk:
                ratio = torch_topk["time_s"] / r["time_s"]
                target = f"<= torch.topk time: {ratio:.2f}x faster, {'met' if ratio >= 1 else 'NOT met'}{versus(r)}"
            elif name.startswith("topk.approx") and torch_topk:
                ratio = torch_topk["time_s"] / r["time_s"]
                target = f">= 3x faster than torch.topk: {ratio:.2f}x, {'met' if ratio >= 3 else 'NOT met'}{versus(r)}"
        print(f"{who:<8} {name:<36} {r['time_s'] * 1e3:10.4f} {r['gbps']:9.1f} {r['fraction_of_copy']:8.3f}  {target}")
for failed in (ours or {}).get("failed", []):
    print(f"gradzip  {failed['name']:<36} FAILED: {failed['error']}")
calls = load(sys.argv[3])
if calls and calls.get("rows"):
    print()
    print(f"per steady-state all-reduce call of {calls['size']} elements (gradzip-bench calls):")
    print(f"{'spec':<34} {'allocs':>7} {'waits':>7} {'complete':>8} {'h<->d B':>9}  target")
    for r in calls["rows"]:
        if "failed" in r:
            print(f"{r['spec']:<34} FAILED: {r['failed']}")
            continue
        target = "0/0/0" if r["fixed_size"] else "(none)"
        print(f"{r['spec']:<34} {r['allocations_per_call']:7.2f} {r['host_waits_per_call']:7.2f} "
              f"{r.get('completion_waits_per_call', 0):8.2f} "
              f"{r['host_device_bytes_per_call']:9.1f}  {target}: {'met' if r['target_met'] else 'NOT met'}")
        print(f"{'':<34} waits by site: {r.get('wait_sites', '?')}")
PY
    echo
  fi
  local line
  for line in "${FOUND[@]}"; do echo "gpu-check: $line"; done

  local total=$((SECONDS - START))
  echo
  ((total <= DEADLINE + 30)) || echo "gpu-check: WARNING: took $total s, over its bound of $DEADLINE s"
  if ((${#FAILURES[@]} > 0)); then
    local failure
    for failure in "${FAILURES[@]}"; do echo "gpu-check: FAILED: $failure"; done
    exit 1
  fi
  echo "gpu-check: OK in $total s ($mode run)$([[ $allow_skip == 1 ]] && echo ' (--allow-skip: a dry run, not a GPU check)')"
}

# ---- arguments ---------------------------------------------------------------------------------
main() {
  local mode=check allow_skip=0 memcheck=0 quick=0 deadline='' build=$ROOT/build-gpu-check jobs size='' repeat=''
  local memcheck_bound=''
  jobs=$(nproc 2>/dev/null || echo 16)
  while (($#)); do
    case $1 in
      --prepare) mode=prepare ;;
      --quick) quick=1 ;;
      --allow-skip) allow_skip=1 ;;
      --memcheck) memcheck=1 ;;
      --memcheck-bound) memcheck_bound=${2:?--memcheck-bound needs seconds}; shift ;;
      --deadline) deadline=${2:?--deadline needs seconds}; shift ;;
      --build-dir) build=${2:?--build-dir needs a folder}; shift ;;
      --jobs) jobs=${2:?--jobs needs a number}; shift ;;
      --size) size=${2:?--size needs a number or auto}; shift ;;
      --repeat) repeat=${2:?--repeat needs a number}; shift ;;
      -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; return 0 ;;
      *) die "unknown option '$1' (see --help)" ;;
    esac
    shift
  done
  if [[ -z $deadline ]]; then
    deadline=420
    ((quick)) && deadline=280
    ((allow_skip)) && deadline=1800  # a dry run: no device time to save
  fi
  [[ $deadline =~ ^[0-9]+$ ]] || die "--deadline needs whole seconds, got '$deadline'"
  [[ -z $memcheck_bound || $memcheck_bound =~ ^[0-9]+$ ]] || die "--memcheck-bound needs whole seconds"
  if [[ $mode == prepare ]]; then
    prepare
  else
    mkdir -p "$build" || die "cannot create $build"
    build=$(cd "$build" && pwd)
    check "$allow_skip" "$memcheck" "$build" "$jobs" "$size" "$repeat" "$deadline" "$quick" "$memcheck_bound"
  fi
}

if [[ -n ${OUT:-} ]] && [[ " $* " != *" --prepare "* ]]; then
  mkdir -p "$OUT"
  # The whole output, also on failure, to $OUT/gpu-check.log; the exit status is main's.
  main "$@" 2>&1 | tee "$OUT/gpu-check.log"
  exit "${PIPESTATUS[0]}"
fi
main "$@"
