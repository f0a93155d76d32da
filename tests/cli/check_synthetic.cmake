# Runs `sparse-mla validate --synthetic ... --json` and checks its JSON: exit
# 0, nothing on stderr, ok, the expected number of groups, one conversion per group per decode
# step, and no mismatches.
#   cmake -DCLI=<sparse-mla> -DARGS="validate|--synthetic|...|--json" -DEXPECT_GROUPS=16 -P check_synthetic.cmake
# ARGS separates arguments with '|' (ctest would split ';').
string(REPLACE "|" ";" args "${ARGS}")
execute_process(COMMAND "${CLI}" ${args} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(shown "sparse-mla ${ARGS}\n--- exit: ${code}\n--- stdout:\n${out}\n--- stderr:\n${err}")
if(NOT code STREQUAL "0")
  message(FATAL_ERROR "expected exit code 0\n${shown}")
endif()
# Sanitizer reports go to stderr.
if(NOT err STREQUAL "")
  message(FATAL_ERROR "expected nothing on stderr\n${shown}")
endif()

function(field name out_var)
  string(JSON value ERROR_VARIABLE error GET "${out}" ${name})
  if(error)
    message(FATAL_ERROR "the JSON has no '${name}': ${error}\n${shown}")
  endif()
  set(${out_var} "${value}" PARENT_SCOPE)
endfunction()

field(ok ok)
field(groups groups)
field(decode_steps decode_steps)
field(decode_conversions decode_conversions)
field(mismatches mismatches)
math(EXPR expected_conversions "${groups} * ${decode_steps}")
if(NOT ok STREQUAL "ON")
  message(FATAL_ERROR "ok is ${ok}\n${shown}")
endif()
if(NOT groups EQUAL EXPECT_GROUPS)
  message(FATAL_ERROR "expected ${EXPECT_GROUPS} groups, got ${groups}\n${shown}")
endif()
if(NOT decode_conversions EQUAL expected_conversions)
  message(FATAL_ERROR "expected ${expected_conversions} decode conversions (groups x decode steps), got ${decode_conversions}\n${shown}")
endif()
if(NOT mismatches EQUAL 0)
  message(FATAL_ERROR "${mismatches} mismatches\n${shown}")
endif()
message(STATUS "${out}")
