# Runs `gradzip-bench overlap` at 2 ranks on the small model (396,800 parameters, 1.5 MiB of
# gradients, cut into buckets of at most 512 KiB) for none, fp16 and topk 1%, and checks its JSON:
#   - every key is there; ranks, params, gradient bytes and GEMM flops are the model's exactly;
#   - the figures are measured, not modelled: each is the median of raw per-iteration samples
#     that are all there, all positive and finite, and (as real clock readings are) nearly all
#     different; exposed_comm_s is overlapped_s - compute_s;
#   - the benchmark's wall times agree with the Reducer's own clocks: in every comm-only step the
#     Reducer's communication_seconds is within the step, and in every overlapped step its time
#     blocked in wait() is within the step;
#   - every sequential step contains a whole backward and then the whole communication, and
#     every overlapped step a whole backward, by the ranks' own clocks inside that step;
#   - overlap happened: in every overlapped step the first bucket was launched before
#     backward's last mark_ready, on every rank (the Reducer's last_ready_seconds > 0).
# Only intervals nested in one step are compared: no check sets one phase's time against another
# phase's (sequential against compute, say), since a shared machine can slow one step and not the
# next; those ratios are what the benchmark reports, not what this test asserts.
#   - the Reducer really ran the spec on the model's bytes: bytes sent and compression ratios.
# Invoked by ctest with -DBENCH=<gradzip-bench> -DMPIEXEC=<mpirun> -DWORK_DIR=<scratch dir>.
set(world_size 2)
# Three timed iterations: the median ignores one step that another process slowed down.
set(bench_iters 3)
# Steps of tens of milliseconds, long against the scheduler's time slices.
set(bench_batch 1024)
set(specs none fp16 topk:ratio=0.01)
# small: d = 128, 2 blocks; params = blocks (12 d^2 + 13 d) + 2 d = 2 (196608 + 1664) + 256.
set(expected_params 396800)
math(EXPR expected_gradient_bytes "4 * ${expected_params}")
# GEMM flops: 2 * batch * (weights of the linear layers) = 2 * batch * blocks * 12 d^2.
math(EXPR expected_gemm_flops "2 * ${bench_batch} * 2 * 12 * 128 * 128")
set(first_bucket_bytes 262144)
set(bucket_bytes 524288)
# Chunks of 256 KiB: at or above the specs' min_bytes (64 KiB), so chunks of weights are
# compressed rather than sent uncompressed as small tensors.
set(chunk_bytes 262144)

set(json ${WORK_DIR}/overlap.json)
file(MAKE_DIRECTORY ${WORK_DIR})
file(REMOVE ${json})
set(arguments)
foreach(spec IN LISTS specs)
  list(APPEND arguments --codec ${spec})
endforeach()
# The bytes and algorithms checked below are those of each codec's default algorithm. algo=auto
# would measure the link and, on a machine loaded by other work (every start-up slow), could take
# the tree for top-k (dense f32 vectors): a fixed slow link (50 us, 100 Mbit/s: bytes dominate)
# makes the choice independent of the machine's state.
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env GRADZIP_LINK=50,0.1
          ${MPIEXEC} -np ${world_size} --oversubscribe --bind-to none
          ${BENCH} overlap --model small --batch ${bench_batch} --iters ${bench_iters} --warmup 1
          --first-bucket-bytes ${first_bucket_bytes} --bucket-bytes ${bucket_bytes}
          --chunk-bytes ${chunk_bytes} ${arguments} --json ${json}
  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
message(STATUS "${out}")
if(NOT result EQUAL 0)
  message(FATAL_ERROR "gradzip-bench overlap failed (${result}):\n${out}\n${err}")
endif()

# CMake's math() has integers only: seconds as the JSON writes them (%.9g: "0.00123456789",
# "1.5e-05", "-0.0004") become whole nanoseconds, truncated toward zero.
function(to_nanoseconds text out)
  if(NOT text MATCHES "^(-?)([0-9]+)(\\.([0-9]+))?([eE]([-+]?[0-9]+))?$")
    message(FATAL_ERROR "'${text}' is not a number of seconds")
  endif()
  set(sign "${CMAKE_MATCH_1}")
  set(digits "${CMAKE_MATCH_2}${CMAKE_MATCH_4}")
  string(LENGTH "${CMAKE_MATCH_4}" fraction_digits)
  set(exponent 0)
  if(CMAKE_MATCH_6)
    set(exponent "${CMAKE_MATCH_6}")
  endif()
  # value = digits * 10^(exponent - fraction_digits) s = digits * 10^shift ns
  math(EXPR shift "${exponent} - ${fraction_digits} + 9")
  if(shift GREATER_EQUAL 0)
    while(shift GREATER 0)
      string(APPEND digits "0")
      math(EXPR shift "${shift} - 1")
    endwhile()
  else()
    math(EXPR keep "-(${shift})")
    string(LENGTH "${digits}" length)
    math(EXPR length "${length} - ${keep}")
    if(length LESS_EQUAL 0)
      set(digits 0)
    else()
      string(SUBSTRING "${digits}" 0 ${length} digits)
    endif()
  endif()
  # Without leading zeros, so that equal values give equal strings (the distinctness check).
  string(REGEX MATCH "^0*([0-9]+)$" digits "${digits}")
  set(digits "${CMAKE_MATCH_1}")
  set(${out} "${sign}${digits}" PARENT_SCOPE)
endfunction()

# The JSON array `key` of row `index` as a list of nanoseconds; it must hold bench_iters samples.
function(samples_ns text index key out)
  string(JSON count ERROR_VARIABLE missing LENGTH "${text}" ${index} ${key})
  if(missing OR NOT count EQUAL bench_iters)
    message(FATAL_ERROR "row ${index}: '${key}' must be an array of ${bench_iters} samples: "
                        "${missing}")
  endif()
  set(values)
  math(EXPR last "${count} - 1")
  foreach(i RANGE ${last})
    string(JSON value GET "${text}" ${index} ${key} ${i})
    to_nanoseconds("${value}" ns)
    list(APPEND values ${ns})
  endforeach()
  set(${out} ${values} PARENT_SCOPE)
endfunction()

# |a - b| <= tolerance, all in ns.
function(require_close a b tolerance where)
  math(EXPR difference "${a} - (${b})")
  if(difference LESS 0)
    math(EXPR difference "-(${difference})")
  endif()
  if(difference GREATER tolerance)
    message(FATAL_ERROR "${where}: ${a} ns vs ${b} ns (tolerance ${tolerance} ns)")
  endif()
endfunction()

file(READ ${json} text)
string(JSON entries LENGTH "${text}")
list(LENGTH specs spec_count)
if(NOT entries EQUAL spec_count)
  message(FATAL_ERROR "expected ${spec_count} rows, got ${entries}:\n${text}")
endif()

set(keys spec ranks model params batch gemm_flops iters warmup lanes first_bucket_bytes
         bucket_bytes chunk_bytes compute_s comm_s sequential_s overlapped_s exposed_comm_s
         reducer_exposed_s overlap_vs_max overlap_vs_compute hidden_comm_fraction hidden_fraction sent_bytes
         gradient_bytes compression_ratio buckets)
set(phases compute comm sequential overlapped)
set(all_samples)
set(index 0)
foreach(expected_spec IN LISTS specs)
  foreach(key IN LISTS keys)
    string(JSON ${key} ERROR_VARIABLE missing GET "${text}" ${index} ${key})
    if(missing)
      message(FATAL_ERROR "row ${index}: no key '${key}': ${missing}")
    endif()
  endforeach()
  set(where "row ${index} (${spec})")
  if(NOT spec STREQUAL expected_spec)
    message(FATAL_ERROR "${where}: expected spec '${expected_spec}'")
  endif()
  if(NOT ranks EQUAL world_size OR NOT params EQUAL expected_params
     OR NOT gradient_bytes EQUAL expected_gradient_bytes OR NOT gemm_flops EQUAL expected_gemm_flops
     OR NOT batch EQUAL bench_batch OR NOT iters EQUAL bench_iters)
    message(FATAL_ERROR "${where}: ranks ${ranks}, params ${params}, gradient_bytes "
                        "${gradient_bytes}, gemm_flops ${gemm_flops}, batch ${batch}, "
                        "iters ${iters};"
                        " expected ${world_size}, ${expected_params}, ${expected_gradient_bytes}, "
                        "${expected_gemm_flops}, ${bench_batch}, ${bench_iters}")
  endif()

  # Each phase's figure is the median of its samples: with 3 samples, the middle one, written
  # from the same double.
  foreach(phase IN LISTS phases)
    samples_ns("${text}" ${index} ${phase}_samples_s ${phase}_samples)
    foreach(sample IN LISTS ${phase}_samples)
      if(NOT sample GREATER 0)
        message(FATAL_ERROR "${where}: a ${phase} sample is ${sample} ns, not positive")
      endif()
    endforeach()
    list(APPEND all_samples ${${phase}_samples})
    set(sorted ${${phase}_samples})
    list(SORT sorted COMPARE NATURAL)
    list(GET sorted 1 middle)
    to_nanoseconds("${${phase}_s}" ${phase}_ns)
    if(NOT ${phase}_ns EQUAL middle)
      message(FATAL_ERROR "${where}: ${phase}_s = ${${phase}_s} is not the median of its samples "
                          "(${${phase}_samples} ns)")
    endif()
  endforeach()
  to_nanoseconds("${exposed_comm_s}" exposed_ns)
  math(EXPR difference "${overlapped_ns} - ${compute_ns}")
  require_close(${exposed_ns} ${difference} 2
                "${where}: exposed_comm_s != overlapped_s - compute_s")

  # The Reducer's clocks against the benchmark's, step by step. On each rank the Reducer's
  # communication_seconds (its step's first mark_ready or launch to its last bucket's completion)
  # and its exposed_seconds (time in wait()) lie inside the benchmark's timed region of that
  # step, and a maximum over ranks keeps that order.
  samples_ns("${text}" ${index} reducer_comm_samples_s reducer_comm)
  samples_ns("${text}" ${index} reducer_exposed_samples_s reducer_exposed)
  math(EXPR last_sample "${bench_iters} - 1")
  foreach(i RANGE ${last_sample})
    list(GET reducer_comm ${i} inner)
    list(GET comm_samples ${i} outer)
    if(NOT inner GREATER 0 OR inner GREATER outer)
      message(FATAL_ERROR "${where}: comm step ${i}: the Reducer's communication_seconds "
                          "(${inner} ns) must be positive and within the step (${outer} ns)")
    endif()
    list(GET reducer_exposed ${i} inner)
    list(GET overlapped_samples ${i} outer)
    if(inner LESS 0 OR inner GREATER outer)
      message(FATAL_ERROR "${where}: overlapped step ${i}: the Reducer's exposed_seconds "
                          "(${inner} ns) must lie within the step (${outer} ns)")
    endif()
  endforeach()

  # Overlap happened: in every overlapped step, on every rank, the first bucket went out before
  # backward's last mark_ready (ReducerStats::last_ready_seconds > 0, minimum over ranks). Later
  # layers' GEMMs run between the mark that completes bucket 0 and the last mark, so this is an
  # order of events, not a race; a Reducer that held its buckets until wait() gives <= 0.
  samples_ns("${text}" ${index} reducer_last_ready_samples_s last_ready)
  foreach(i RANGE ${last_sample})
    list(GET last_ready ${i} value)
    if(NOT value GREATER 0)
      message(FATAL_ERROR "${where}: overlapped step ${i}: no bucket was launched before "
                          "backward's last mark_ready (last_ready_seconds ${value} ns)")
    endif()
  endforeach()

  # A sequential step runs a whole backward and then a whole communication; an overlapped step a
  # whole backward. Each rank timed those parts inside the step itself, so part <= step holds
  # however the machine is loaded (1 us for the JSON's rounding to 9 digits and truncation to ns).
  samples_ns("${text}" ${index} sequential_contained_samples_s sequential_contained)
  samples_ns("${text}" ${index} overlapped_backward_samples_s overlapped_backward)
  foreach(i RANGE ${last_sample})
    foreach(pair IN ITEMS "sequential_contained;sequential_samples" "overlapped_backward;overlapped_samples")
      list(GET pair 0 part_list)
      list(GET pair 1 step_list)
      list(GET ${part_list} ${i} part)
      list(GET ${step_list} ${i} step)
      math(EXPR slack_step "${step} + 1000")
      if(NOT part GREATER 0 OR part GREATER slack_step)
        message(FATAL_ERROR "${where}: step ${i}: ${part_list} (${part} ns) must be positive and "
                            "within the step (${step} ns)")
      endif()
    endforeach()
  endforeach()

  # What the Reducer sent. At 2 ranks an uncompressed byte is sent once by each rank (the ring's
  # two halves; MPI's all-reduce is counted as 2(P-1)/P = 1 of its bytes), plus 32-byte headers
  # (two per ring chunk, a few hundred bytes in all, far below 1%).
  set(sent_${index} ${sent_bytes})
  # fp16: 4n / (2n + 32) per chunk, just under 2.
  set(ratio_low 1.9)
  set(ratio_high 2.0)
  if(spec STREQUAL "none")
    math(EXPR most "${gradient_bytes} + ${gradient_bytes} / 100")
    if(sent_bytes LESS gradient_bytes OR sent_bytes GREATER most)
      message(FATAL_ERROR "${where}: sent ${sent_bytes} bytes, expected "
                          "${gradient_bytes} .. ${most}")
    endif()
    # Nothing is compressed: the Reducer reports exactly 1 (headers are not compression).
    set(ratio_low 1.0)
    set(ratio_high 1.0)
  elseif(spec STREQUAL "fp16")
    # Weights (99.1% of the bytes) halve; biases and norms (dims<=1 -> none) stay f32:
    # 0.5 * 0.991 + 0.009 = 0.5045 of `none`.
    math(EXPR fp16_percent "100 * ${sent_bytes} / ${sent_0}")
    if(fp16_percent LESS 45 OR fp16_percent GREATER 55)
      message(FATAL_ERROR "${where}: sent ${sent_bytes} bytes = ${fp16_percent}% of none's, "
                          "expected about 50%")
    endif()
  else()
    # Top-k 1% sends (value, index) pairs, 8 bytes per 100 f32 (2%), plus the f32 biases and
    # norms (0.9%): about 3% of none; and a ratio of 4n / (32 + 8k) just under 50.
    math(EXPR topk_percent "100 * ${sent_bytes} / ${sent_0}")
    if(topk_percent GREATER 10)
      message(FATAL_ERROR "${where}: sent ${sent_bytes} bytes = ${topk_percent}% of none's, "
                          "expected about 3%")
    endif()
    set(ratio_low 40)
    set(ratio_high 50)
  endif()
  if(compression_ratio LESS ratio_low OR compression_ratio GREATER ratio_high)
    message(FATAL_ERROR "${where}: compression_ratio ${compression_ratio}, expected "
                        "${ratio_low} .. ${ratio_high}")
  endif()
  # 1.5 MiB in buckets of at most 512 KiB (no tensor is larger): at least 4 buckets.
  if(buckets LESS 4)
    message(FATAL_ERROR "${where}: ${buckets} buckets, expected at least 4")
  endif()
  string(JSON algorithms GET "${text}" ${index} algorithms)
  if(spec STREQUAL "topk:ratio=0.01")
    set(expected_algorithm sparse)
  else()
    set(expected_algorithm ring)
  endif()
  if(NOT algorithms MATCHES "\"${expected_algorithm}\"")
    message(FATAL_ERROR "${where}: algorithms ${algorithms} lack '${expected_algorithm}'")
  endif()
  math(EXPR index "${index} + 1")
endforeach()

# Readings of a nanosecond clock for steps of milliseconds practically never repeat; numbers
# from a model or a constant do. Allow two coincidences among the 36 samples.
list(LENGTH all_samples total)
set(distinct ${all_samples})
list(REMOVE_DUPLICATES distinct)
list(LENGTH distinct distinct_count)
math(EXPR fewest "${total} - 2")
if(distinct_count LESS fewest)
  message(FATAL_ERROR "only ${distinct_count} distinct values among ${total} samples: "
                      "${all_samples}")
endif()
