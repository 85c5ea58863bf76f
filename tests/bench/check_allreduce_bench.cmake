# Runs `gradzip-bench allreduce --check` at 3 ranks on small sizes (0 elements, fewer elements
# than ranks, counts that do not divide by 3) for every default codec, and checks its JSON:
#   - every key is there, ranks = 3, bytes as asked, times positive;
#   - every rank holds byte-identical results, and the error is within the bound;
#   - the cosine with the exact sum reaches its floor, and every lossy row with elements has a
#     floor above 0 (the error bound alone accepts an all-zero result for sign, top-k and
#     random-k; the floor rejects it and a negated sum): the estimate-based floor from 1024
#     elements per rank (the 65540-byte rows), below that the result's direction alone;
#   - top-k and random-k of one element (k >= n) are exact up to the f32 adds: error bound
#     below 1e-5 (the generic bound, at least max sum |x|, would accept a dropped element);
#   - `none` (integer-valued data) is exact: max_abs_error = 0;
#   - the algorithm is one algo=auto may choose for the codec (collectives/cost_model.h
#     auto_candidates; which one depends on the measured link and γ);
#   - bytes sent per rank match the theory within 2% plus 2(P - 1) 32-byte headers.
# Invoked by ctest with -DBENCH=<gradzip-bench> -DMPIEXEC=<mpirun> -DWORK_DIR=<scratch dir>.
cmake_policy(SET CMP0057 NEW)  # if(IN_LIST)
set(world_size 3)
set(sizes 0 4 28 4100 65540)
set(specs none fp16 qsgd:bits=4 qsgd:bits=8 sign topk:ratio=0.01 randk:ratio=0.01)
set(expected_algo_none ring sra rhd tree)
set(expected_algo_fp16 ring sra rhd tree)
set(expected_algo_qsgd sra tree)
set(expected_algo_sign sra tree)
set(expected_algo_topk sparse tree)
set(expected_algo_randk randk)

set(json ${WORK_DIR}/allreduce.json)
file(MAKE_DIRECTORY ${WORK_DIR})
file(REMOVE ${json})
set(arguments)
foreach(size IN LISTS sizes)
  list(APPEND arguments --size ${size})
endforeach()
foreach(spec IN LISTS specs)
  list(APPEND arguments --codec ${spec})
endforeach()
execute_process(
  COMMAND ${MPIEXEC} -np ${world_size} --oversubscribe --bind-to none
          ${BENCH} allreduce --check --iters 1 --link-gbps 2 ${arguments} --json ${json}
  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "${out}")
if(NOT result EQUAL 0)
  message(FATAL_ERROR "gradzip-bench allreduce failed (${result}):\n${out}\n${err}")
endif()

file(READ ${json} text)
string(JSON entries LENGTH "${text}")
list(LENGTH sizes size_count)
list(LENGTH specs spec_count)
math(EXPR expected_entries "${size_count} * ${spec_count}")
if(NOT entries EQUAL expected_entries)
  message(FATAL_ERROR "expected ${expected_entries} rows, got ${entries}:\n${text}")
endif()

set(keys spec algo ranks bytes time_s algbw_gbps busbw_gbps sent_bytes_per_rank
         theory_bytes_per_rank mpi_time_s speedup_vs_mpi max_abs_error error_bound cosine
         min_cosine ranks_identical link_gbps wire_s time_over_wire)
math(EXPR last "${entries} - 1")
set(index 0)
foreach(size IN LISTS sizes)
  foreach(spec IN LISTS specs)
    foreach(key IN LISTS keys)
      string(JSON ${key} ERROR_VARIABLE missing GET "${text}" ${index} ${key})
      if(missing)
        message(FATAL_ERROR "row ${index}: no key '${key}': ${missing}")
      endif()
    endforeach()
    set(where "row ${index} (${spec}, ${size} bytes, ${algo})")
    # The benchmark appends min_bytes=0 to specs that do not set it.
    if(NOT spec MATCHES "min_bytes=0$")
      message(FATAL_ERROR "${where}: spec '${spec}' lacks the appended min_bytes=0")
    endif()
    if(NOT ranks EQUAL world_size OR NOT bytes EQUAL size)
      message(FATAL_ERROR "${where}: ranks ${ranks}, bytes ${bytes}; expected ${world_size}, ${size}")
    endif()
    if(NOT time_s GREATER 0 OR NOT mpi_time_s GREATER 0)
      message(FATAL_ERROR "${where}: times must be positive: ${time_s}, ${mpi_time_s}")
    endif()
    if(NOT ranks_identical STREQUAL "ON" AND NOT ranks_identical STREQUAL "true")
      message(FATAL_ERROR "${where}: ranks_identical = ${ranks_identical}")
    endif()
    if(NOT max_abs_error LESS_EQUAL error_bound)
      message(FATAL_ERROR "${where}: max_abs_error ${max_abs_error} > error_bound ${error_bound}")
    endif()
    string(REGEX MATCH "^[a-z0-9]+" codec "${spec}")
    if(NOT cosine GREATER_EQUAL min_cosine)
      message(FATAL_ERROR "${where}: cosine with the exact sum ${cosine} < floor ${min_cosine}")
    endif()
    if(NOT codec STREQUAL "none" AND size GREATER 0 AND NOT min_cosine GREATER 0)
      message(FATAL_ERROR "${where}: a lossy row of ${size} bytes has no cosine floor")
    endif()
    if((codec STREQUAL "topk" OR codec STREQUAL "randk") AND size EQUAL 4 AND NOT error_bound LESS 1e-5)
      message(FATAL_ERROR "${where}: one element is kept whole (k >= n), yet the bound is ${error_bound}")
    endif()
    if(codec STREQUAL "none" AND NOT max_abs_error EQUAL 0)
      message(FATAL_ERROR "${where}: none must be exact on integer data, max_abs_error ${max_abs_error}")
    endif()
    if(NOT algo IN_LIST expected_algo_${codec})
      message(FATAL_ERROR "${where}: algorithm '${algo}', expected one of '${expected_algo_${codec}}'")
    endif()
    # --link-gbps 2: wire_s = sent bytes x 8 bits / 2e9 bit/s = sent x 4 ns (within 1 ns:
    # %.9g), and time / wire positive.
    math(EXPR wire_ns "${sent_bytes_per_rank} * 4")
    math(EXPR wire_ns_low "${wire_ns} - 1")
    math(EXPR wire_ns_high "${wire_ns} + 1")
    if(NOT link_gbps EQUAL 2 OR wire_s LESS "${wire_ns_low}e-9" OR wire_s GREATER "${wire_ns_high}e-9"
       OR NOT time_over_wire GREATER 0)
      message(FATAL_ERROR "${where}: link_gbps ${link_gbps}, wire_s ${wire_s}, time_over_wire "
                          "${time_over_wire}; expected 2, ${wire_ns} ns and a positive ratio")
    endif()
    # |sent - theory| <= theory / 50 + 2 (P - 1) * 32
    math(EXPR difference "${sent_bytes_per_rank} - ${theory_bytes_per_rank}")
    if(difference LESS 0)
      math(EXPR difference "-(${difference})")
    endif()
    math(EXPR tolerance "${theory_bytes_per_rank} / 50 + 2 * (${world_size} - 1) * 32")
    if(difference GREATER tolerance)
      message(FATAL_ERROR "${where}: sent ${sent_bytes_per_rank} bytes per rank, theory "
                          "${theory_bytes_per_rank} (tolerance ${tolerance})")
    endif()
    math(EXPR index "${index} + 1")
  endforeach()
endforeach()
