# tools/ci/ncu-passes.py on a source page written here with fresh random
# counts: each pass (ending at its BAR.SYNC, predicated or not) gets the sum
# of its instructions divided by the teams, a predicated instruction counts
# under its opcode, the stall shares count issued samples only (not the "Not
# Issued" columns), and a page without ncu's header is refused with one line
# and exit 2.
#   cmake -DPYTHON=<python3> -DSCRIPT=<ncu-passes.py> -DDIR=<dir> -P ncu_passes.cmake
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
set(teams 2)
set(csv "\"Kernel Name\",\"void k(int)\",\n\"Address\",\"Source\",\"Warp Stall Sampling (All Samples)\",\"Instructions Executed\",\"stall_wait\",\"stall_barrier\",\"stall_barrier (Not Issued)\"\n")
set(sources "IMAD R1, R2, R3, RZ" "@!P1  LDG.E R4, desc[UR6][R12.64]" "LDS.128 R12, [R13]" "BAR.SYNC.DEFER_BLOCKING 0x0"
            "ISETP.NE.AND P1, PT, R12, RZ, PT" "@P1   BRA 0x7f12c17b5b20" "@!P0  BAR.SYNC.DEFER_BLOCKING 0x0" "EXIT")
set(expected 0 0 0)
set(pass 0)
set(address 4096)
set(waits 0)
foreach(source IN LISTS sources)
  string(RANDOM LENGTH 2 ALPHABET 123456789 half)  # an even count below 200, so that count / teams is whole
  math(EXPR count "${half} * ${teams}")
  string(RANDOM LENGTH 1 ALPHABET 123456789 wait)
  string(APPEND csv "\"0x${address}\",\"      ${source}\",\"${wait}\",\"${count}\",\"${wait}\",\"0\",\"${count}\"\n")
  math(EXPR waits "${waits} + ${wait}")
  math(EXPR address "${address} + 16")
  list(GET expected ${pass} sum)
  math(EXPR sum "${sum} + ${half}")
  list(REMOVE_AT expected ${pass})
  list(INSERT expected ${pass} ${sum})
  if(source MATCHES "BAR[.]SYNC")
    math(EXPR pass "${pass} + 1")
  endif()
endforeach()
file(WRITE "${DIR}/source.csv" "${csv}")
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" "${DIR}/source.csv" --rows ${teams}
                RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT code EQUAL 0)
  message(FATAL_ERROR "ncu-passes.py exited ${code}\n--- stdout:\n${out}\n--- stderr:\n${err}\n--- input:\n${csv}")
endif()
list(GET expected 0 p0)
list(GET expected 1 p1)
list(GET expected 2 p2)
math(EXPR total "${p0} + ${p1} + ${p2}")
foreach(pattern "warp instructions per row: ${total} \\(teams: ${teams}\\)" "\\| 0 \\| `BAR.SYNC.DEFER_BLOCKING 0x0` \\| ${p0} \\|"
                "\\| 1 \\| `@!P0  BAR.SYNC.DEFER_BLOCKING 0x0` \\| ${p1} \\|" "\\| 2 \\| `\\(end of kernel\\)` \\| ${p2} \\|"
                "\\| 0 \\|[^\n]*LDG [0-9]" "stall samples \\(${waits}\\): wait 100%\n")
  if(NOT out MATCHES "${pattern}")
    message(FATAL_ERROR "ncu-passes.py's table lacks '${pattern}' (passes ${p0} ${p1} ${p2}):\n${out}\n--- input:\n${csv}")
  endif()
endforeach()
file(WRITE "${DIR}/details.txt" "    Duration  us  21.66\n")
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" "${DIR}/details.txt"
                RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(STRIP "${err}" err)
if(NOT code EQUAL 2 OR NOT err MATCHES "^ncu-passes: .*details.txt: no header" OR err MATCHES "\n")
  message(FATAL_ERROR "a page without the header: exit ${code} (want 2), stderr:\n${err}")
endif()
