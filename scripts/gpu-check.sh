#!/usr/bin/env bash
# The GPU check of gradzip in one command, for a GPU machine such as the one this project is lent
# now and then (one H200, CUDA 13, CMake, ninja, PyTorch; no internet, no GoogleTest, no Eigen,
# no Open MPI, no zlib).
#
#   scripts/gpu-check.sh --prepare
#       Run on a development machine (with libgtest-dev and libeigen3-dev installed): copies the
#       GoogleTest sources and Eigen's headers and CMake package into .gpu-deps/ (git-ignored),
#       prints its size and the device `run` call that carries it.
#   scripts/gpu-check.sh [--allow-skip] [--memcheck] [--deadline S] [--build-dir DIR] [--jobs N]
#                        [--size N] [--repeat R]
#       Run on the GPU machine, from the working tree with .gpu-deps/ carried. The whole run is
#       bounded by --deadline S seconds from its start (default 420): every step runs under
#       `timeout` with at most what is left, so the device call ends in time to be rerun.
#         1. the device as nvidia-smi sees it (name, driver, memory, compute and MIG mode);
#         2. builds GoogleTest from .gpu-deps/googletest into the build folder;
#         3. configures gradzip (CUDA ON for sm_90, MPI OFF, examples OFF and zlib hidden, Eigen
#            and GTest from .gpu-deps) and builds only the gpu test executables
#            (tests/gpu/test_*.cpp) and gradzip-bench;
#         4. `gradzip-bench preflight`: device properties, memory-pool support (gradzip falls back
#            to cudaMalloc without it), one allocation through gradzip's device runtime, a
#            one-rank NCCL communicator with one exact all-reduce -> preflight.json;
#         5. `gradzip-bench kernels` (2^28 f32 elements) -> kernels.json;
#         6. times torch.topk and .half()/.bfloat16()/.float() on the same size with CUDA
#            events -> torch.json (when python3 has torch with CUDA);
#         7. `gradzip-bench calls`: device allocations and host waits per steady-state
#            all-reduce call, per codec -> calls.json;
#         8. `ctest -L gpu` (each case at most 60 s, GRADZIP_TIMEOUT_S=60, NCCL_DEBUG=WARN): a
#            failure if any test failed, if any test case skipped (a skip there means the device
#            was not seen) or if fewer ran than were discovered;
#         9. with --memcheck, and only when at least 60 s are left, the gpu tests under
#            compute-sanitizer (below);
#        10. prints the kernel tables side by side with the targets.
#       Measurements come before the tests so that a hanging test cannot cost the figures.
#       A failing configure or build stops the run; later failures do not (one call on the
#       device should report everything): they are listed at the end and the exit status is 1.
#       With $OUT set, the log (gpu-check.log) and the JSON files go to $OUT; otherwise to
#       <build dir>/results.
#   --allow-skip  local dry run without a device: skipped gpu tests and a bench that found no
#                 device are accepted (the build and the checks are still exercised).
#   --memcheck    after the tests, run every gpu test executable under compute-sanitizer
#                 --tool memcheck until the deadline; tests not reached, or a machine whose
#                 compute-sanitizer refuses the device (gVisor), are reported as not checked,
#                 errors found fail the run.
#   --build-dir   default <repo>/build-gpu-check;  --jobs  default $(nproc)
#   --size/--repeat  passed to gradzip-bench kernels and to the PyTorch timing.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS=$ROOT/.gpu-deps
GTEST_SRC=${GTEST_SRC:-/usr/src/googletest}
EIGEN_INCLUDE=${EIGEN_INCLUDE:-/usr/include/eigen3}
EIGEN_CMAKE=${EIGEN_CMAKE:-/usr/share/eigen3/cmake}
CARRY_LIMIT_MIB=64

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
    die ".gpu-deps/ is not git-ignored: it would travel twice (add /.gpu-deps/ to .gitignore)"

  local deps_bytes tree_bytes
  deps_bytes=$(du -sb "$DEPS" | cut -f1)
  # What travels besides: tracked and untracked-but-not-ignored files.
  tree_bytes=$(cd "$ROOT" && git ls-files -z -co --exclude-standard |
    xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}')
  echo "gpu-check --prepare: $DEPS"
  du -sh "$DEPS/googletest" "$DEPS/eigen"
  awk -v d="$deps_bytes" -v t="$tree_bytes" -v l="$CARRY_LIMIT_MIB" 'BEGIN {
    printf ".gpu-deps: %.1f MiB; working tree that travels: %.1f MiB; together %.1f of %d MiB\n",
      d / 1048576, t / 1048576, (d + t) / 1048576, l }'
  if ((deps_bytes + tree_bytes > 48 * 1024 * 1024)); then
    die "over 48 MiB would travel: too close to the ${CARRY_LIMIT_MIB} MiB limit"
  fi
  cat <<'EOF'

Now, on the GPU machine (one call: builds, checks the device, measures, runs the gpu tests,
then the tests under compute-sanitizer while time is left; bounded to 420 s in all):
  run(command="bash scripts/gpu-check.sh --memcheck", carry=[".gpu-deps"], timeout_s=480)
(without --memcheck it ends after the tests). Results come back under $OUT: gpu-check.log,
preflight.json, kernels.json, torch.json, calls.json.
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
# Failures after the build do not stop the run (device time is scarce: one call should report
# everything); they are listed, and make the exit status nonzero, at the end.
FAILURES=()
fail_later() {
  echo "gpu-check: FAILURE: $*"
  FAILURES+=("$*")
}

# device_bench NAME BUILD RESULTS ALLOW_SKIP: `gradzip-bench NAME --json RESULTS/NAME.json`,
# at most 60 s (or what is left), NCCL quiet but for warnings and gradzip's waits at most 60 s;
# a failure, an overrun or (without --allow-skip) a run that found no device is noted.
device_bench() {
  local name=$1 build=$2 results=$3 allow_skip=$4
  rm -f "$results/$name.json"
  NCCL_DEBUG=WARN GRADZIP_TIMEOUT_S=60 timeout --kill-after=10 "$(bound_for 60)" \
    "$build/gradzip/bin/gradzip-bench" "$name" --json "$results/$name.json" ||
    fail_later "gradzip-bench $name (exit $?; 124: over its bound)"
  if [[ $allow_skip != 1 ]] && grep -q '"skipped"' "$results/$name.json" 2>/dev/null; then
    fail_later "gradzip-bench $name found no device: $(cat "$results/$name.json")"
  fi
}

check() {
  local allow_skip=$1 memcheck=$2 build=$3 jobs=$4 size=$5 repeat=$6 deadline=$7
  local results=${OUT:-$build/results}
  mkdir -p "$results" || die "cannot create $results"

  DEADLINE=$deadline
  step "environment and device (bounded to $DEADLINE s in all: each step gets at most what is left)"
  echo "repo: $ROOT   build: $build   results: $results   jobs: $jobs"
  echo "gpu-check: total bound on this machine: $DEADLINE s (--deadline); steps, at most:" \
    "build 300, preflight 60, kernels 150, PyTorch 90, calls 60, ctest 240, memcheck what is left"
  if command -v nvidia-smi >/dev/null; then
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,compute_mode,mig.mode.current \
      --format=csv || echo "gpu-check: nvidia-smi did not answer (exit $?)"
  else
    echo "gpu-check: no nvidia-smi here"
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
    die "$DEPS is missing or incomplete: run 'scripts/gpu-check.sh --prepare' on the development machine and name .gpu-deps in the run call's carry"


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

  # NCCL: the CUDA toolkit's, else the one PyTorch's wheels bring (nvidia-nccl), else none
  # (the NCCL tests then check the stand-ins).
  local nccl_root=${NCCL_ROOT:-}
  if [[ -z $nccl_root && ! -f $(dirname "$nvcc")/../include/nccl.h ]]; then
    nccl_root=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null) || nccl_root=
  fi
  [[ -n $nccl_root ]] && { export NCCL_ROOT=$nccl_root; echo "NCCL from $nccl_root"; }

  # The GPU machine has no zlib: the examples (the Fashion-MNIST loader needs it) are off, and
  # zlib is hidden from CMake here too, so a dry run on a machine that has it fails the same way
  # the GPU machine would if anything still looked for it.
  step "configure gradzip (CUDA sm_90, no MPI, no examples, no zlib)"
  run_step "configure gradzip" cmake -S "$ROOT" -B "$build/gradzip" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGRADZIP_WITH_CUDA=ON -DGRADZIP_WITH_MPI=OFF -DGRADZIP_SANITIZE_TESTS=OFF \
    -DGRADZIP_BUILD_TESTS=ON -DGRADZIP_BUILD_BENCHMARKS=ON \
    -DGRADZIP_BUILD_EXAMPLES=OFF -DCMAKE_DISABLE_FIND_PACKAGE_ZLIB=ON \
    -DGTest_DIR="$gtest_prefix/lib/cmake/GTest" \
    -DEigen3_DIR="$DEPS/eigen/share/eigen3/cmake" \
    -DCMAKE_PREFIX_PATH="$gtest_prefix;$DEPS/eigen"
  # The carried copies, not some other installation, must be the ones found.
  local cache=$build/gradzip/CMakeCache.txt
  grep -q "^GTest_DIR:[A-Z]*=$gtest_prefix/lib/cmake/GTest$" "$cache" ||
    die "GTest was not found in $gtest_prefix: $(grep '^GTest_DIR' "$cache")"
  grep -q "^Eigen3_DIR:[A-Z]*=$DEPS/eigen/share/eigen3/cmake$" "$cache" ||
    die "Eigen was not found in $DEPS/eigen: $(grep '^Eigen3_DIR' "$cache")"

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
  run_step "build (exit 124: over its bound)" timeout --kill-after=10 "$(bound_for 300)" \
    cmake --build "$build/gradzip" -j "$jobs" "${targets[@]}" -- "${keep_going[@]}"
  echo "built in $((SECONDS - step_start)) s"

  step "gradzip-bench preflight: the device, its memory pools, a one-rank NCCL communicator"
  device_bench preflight "$build" "$results" "$allow_skip"

  step "gradzip-bench kernels"
  local bench_args=(--json "$results/kernels.json")
  [[ -n $size ]] && bench_args+=(--size "$size")
  [[ -n $repeat ]] && bench_args+=(--repeat "$repeat")
  rm -f "$results/kernels.json"
  timeout --kill-after=10 "$(bound_for 150)" "$build/gradzip/bin/gradzip-bench" kernels "${bench_args[@]}" ||
    fail_later "gradzip-bench kernels (exit $?; 124: over its bound)"
  if [[ ! -f $results/kernels.json ]]; then
    fail_later "gradzip-bench kernels wrote no $results/kernels.json"
  elif grep -q '"skipped"' "$results/kernels.json"; then
    if [[ $allow_skip == 1 ]]; then
      echo "gpu-check: the bench found no device: accepted (--allow-skip)"
    else
      fail_later "gradzip-bench kernels found no device: $(cat "$results/kernels.json")"
    fi
  fi
  echo "bench in $((SECONDS - step_start)) s"

  step "PyTorch on the same sizes"
  local python=
  command -v python3 >/dev/null && python=python3
  rm -f "$results/torch.json"
  if [[ -n $python ]] && "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    PYTHONUNBUFFERED=1 timeout --kill-after=10 "$(bound_for 90)" "$python" - "${size:-268435456}" "${repeat:-20}" "$results/torch.json" <<'PY' || fail_later "the PyTorch timing (exit $?; 124: over its bound)"
import json, sys
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
entries = [  # name, launch, minimum bytes moved, input tensor (copied for the baseline)
    ("torch.half", lambda: x.half(), 6 * n, x),
    ("torch.bfloat16", lambda: x.bfloat16(), 6 * n, x),
    ("torch.half.float", lambda: h.float(), 6 * n, h),
    ("torch.bfloat16.float", lambda: b.float(), 6 * n, b),
    ("torch.topk(x.abs(),k)", lambda: torch.topk(x.abs(), k), 4 * n + topk_out, x),
    ("torch.topk(x.abs(),k,sorted=False)", lambda: torch.topk(x.abs(), k, sorted=False), 4 * n + topk_out, x),
    ("torch.topk(a,k,sorted=False)", lambda: torch.topk(a, k, sorted=False), 4 * n + topk_out, a),
]
props = torch.cuda.get_device_properties(0)
print(f"PyTorch {torch.__version__} on {props.name}: {n} f32 elements, k = {k}, median of {repeat} runs")
print(f"{'kernel':<36} {'time ms':>10} {'GB/s':>9} {'copy GB/s':>10} {'of copy':>8}")
rows = []
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
with open(path, "w") as out:
    json.dump({"benchmark": "torch", "torch": torch.__version__, "device": props.name, "size": n,
               "k": k, "repeat": repeat, "kernels": rows}, out, indent=1)
PY
  else
    echo "gpu-check: python3 with a CUDA-enabled torch is not available here: no PyTorch comparison"
  fi

  step "gradzip-bench calls: device allocations and host waits per steady-state call"
  device_bench calls "$build" "$results" "$allow_skip"

  step "ctest -L gpu"
  local ctest_log=$build/ctest-gpu.log
  # -V prints every test's output, passed ones too: a GTEST_SKIP exits 0, so the skips show
  # only there ("[  SKIPPED ]"); each line carries its test's number. -j 4: the tests' CPU
  # references use the cores while the GPU is shared (each test is its own process).
  # Bounded three ways: each case by ctest (--timeout 60), each wait inside gradzip by its
  # deadline (GRADZIP_TIMEOUT_S=60, so a hung NCCL call ends as an error, not a stall), and the
  # whole step by what is left of the run's bound.
  local ctest_bound
  ctest_bound=$(bound_for 240)
  GRADZIP_TIMEOUT_S=60 NCCL_DEBUG=WARN timeout --kill-after=10 "$ctest_bound" \
    ctest --test-dir "$build/gradzip" -L gpu -V -j 4 --output-on-failure --timeout 60 2>&1 |
    tee "$ctest_log"
  local ctest_status=${PIPESTATUS[0]}
  ((ctest_status == 124 || ctest_status == 137)) &&
    fail_later "ctest -L gpu did not finish within its bound of $ctest_bound s"
  ((ctest_status == 0)) || fail_later "ctest -L gpu (exit $ctest_status)"
  # Every discovered case must have run (skipped cases count: ctest lists them as not run).
  local ran cases
  cases=$(ctest --test-dir "$build/gradzip" -N -L gpu 2>/dev/null | grep -c 'Test *#[0-9]*: gpu\.')
  ran=$(sed -n 's/.*tests passed, [0-9]* tests\{0,1\} failed out of \([0-9]*\).*/\1/p' "$ctest_log" | tail -n 1)
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


  if [[ $memcheck == 1 ]]; then
    # Last, after the measurements, and bounded: each test under compute-sanitizer gets what is
    # left until the deadline; tests not reached are reported as not checked (not a failure).
    step "compute-sanitizer --tool memcheck (until t = $deadline s)"
    local sanitizer mc_log mc_status left
    sanitizer=$(command -v compute-sanitizer || echo "$(dirname "$nvcc")/compute-sanitizer")
    left=$((deadline - (SECONDS - START)))
    if ((left < 60)); then
      echo "memcheck: not run: only $left s left before the deadline (it runs when time is left)"
    elif [[ ! -x $sanitizer ]]; then
      fail_later "no compute-sanitizer (for --memcheck)"
    else
      for name in "${gpu_tests[@]}"; do
        left=$((deadline - (SECONDS - START)))
        if ((left < 15)); then
          echo "memcheck $name: not checked (deadline)"
          continue
        fi
        mc_log=$build/memcheck-$name.log
        timeout "$left" "$sanitizer" --tool memcheck --error-exitcode 99 "$build/gradzip/bin/$name" \
          >"$mc_log" 2>&1
        mc_status=$?
        if grep -q 'Device not supported' "$mc_log"; then
          echo "memcheck: compute-sanitizer refuses this device (gVisor machines do): not checked"
          head -n 5 "$mc_log"
          break
        elif ((mc_status == 124)); then
          echo "memcheck $name: not finished within the deadline: not checked"
        elif ((mc_status == 0)); then
          echo "memcheck $name: $(grep -m1 'ERROR SUMMARY' "$mc_log")"
        else
          head -n 60 "$mc_log"
          fail_later "compute-sanitizer memcheck $name (exit $mc_status; log $mc_log)"
        fi
      done
    fi
  fi

  if [[ -n $python && -f $results/kernels.json ]]; then
    step "summary"
    "$python" - "$results/kernels.json" "$results/torch.json" "$results/calls.json" <<'PY'
import json, os, sys

def load(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)

ours, torch_rows = load(sys.argv[1]), load(sys.argv[2])
rows = [("gradzip", r) for r in (ours or {}).get("kernels", [])]
rows += [("torch", r) for r in (torch_rows or {}).get("kernels", [])]
if not rows:
    print("nothing measured")
    sys.exit(0)
if ours and ours.get("input_copy_gbps"):
    print(f"{ours['device']}: copy of the {ours['size']}-element f32 input {ours['input_copy_gbps']:.0f} GB/s "
          "(read + written); 'of copy' = against a copy of each kernel's own input, same run")
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
    print(f"{'spec':<24} {'allocs':>7} {'waits':>7}  target")
    for r in calls["rows"]:
        if "failed" in r:
            print(f"{r['spec']:<24} FAILED: {r['failed']}")
            continue
        target = "0 allocations" + (", <= 1 wait" if r["fixed_size"] else "")
        print(f"{r['spec']:<24} {r['allocations_per_call']:7.2f} {r['waits_per_call']:7.2f}  "
              f"{target}: {'met' if r['target_met'] else 'NOT met'}")
PY
  fi

  local total=$((SECONDS - START))
  echo
  ((total <= DEADLINE + 30)) || echo "gpu-check: WARNING: took $total s, over its bound of $DEADLINE s"
  if ((${#FAILURES[@]} > 0)); then
    local failure
    for failure in "${FAILURES[@]}"; do echo "gpu-check: FAILED: $failure"; done
    exit 1
  fi
  echo "gpu-check: OK in $total s$([[ $allow_skip == 1 ]] && echo ' (--allow-skip: a dry run, not a GPU check)')"
}

# ---- arguments ---------------------------------------------------------------------------------
main() {
  local mode=check allow_skip=0 memcheck=0 deadline=420 build=$ROOT/build-gpu-check jobs size='' repeat=''
  jobs=$(nproc 2>/dev/null || echo 16)
  while (($#)); do
    case $1 in
      --prepare) mode=prepare ;;
      --allow-skip) allow_skip=1 ;;
      --memcheck) memcheck=1 ;;
      --deadline) deadline=${2:?--deadline needs seconds}; shift ;;
      --build-dir) build=${2:?--build-dir needs a folder}; shift ;;
      --jobs) jobs=${2:?--jobs needs a number}; shift ;;
      --size) size=${2:?--size needs a number}; shift ;;
      --repeat) repeat=${2:?--repeat needs a number}; shift ;;
      -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; return 0 ;;
      *) die "unknown option '$1' (see --help)" ;;
    esac
    shift
  done
  if [[ $mode == prepare ]]; then
    prepare
  else
    mkdir -p "$build" || die "cannot create $build"
    build=$(cd "$build" && pwd)
    check "$allow_skip" "$memcheck" "$build" "$jobs" "$size" "$repeat" "$deadline"
  fi
}

if [[ -n ${OUT:-} ]] && [[ " $* " != *" --prepare "* ]]; then
  mkdir -p "$OUT"
  # The whole output, also on failure, to $OUT/gpu-check.log; the exit status is main's.
  main "$@" 2>&1 | tee "$OUT/gpu-check.log"
  exit "${PIPESTATUS[0]}"
fi
main "$@"
