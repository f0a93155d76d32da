# Runs the sparse-mla CLI once and checks how it ended, for ctest:
#   cmake -DCLI=<sparse-mla> -DARGS="validate|--golden|f.safetensors" -DEXPECT_EXIT=2
#         [-DEXPECT_STDERR_LINES=1] [-DEXPECT_STDOUT_REGEX=...] [-DEXPECT_STDERR_REGEX=...] -P run_cli.cmake
# ARGS separates arguments with '|' (ctest would split ';'). Sanitizer
# reports go to stderr, so counting its lines also catches them.
string(REPLACE "|" ";" args "${ARGS}")
execute_process(COMMAND "${CLI}" ${args}
                RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(shown "sparse-mla ${ARGS}\n--- exit: ${code}\n--- stdout:\n${out}\n--- stderr:\n${err}")
if(NOT "${code}" STREQUAL "${EXPECT_EXIT}")
  message(FATAL_ERROR "expected exit code ${EXPECT_EXIT}\n${shown}")
endif()
if(DEFINED EXPECT_STDERR_LINES)
  string(REGEX MATCHALL "\n" newlines "${err}")
  list(LENGTH newlines lines)
  string(REGEX MATCH "[^\n]$" unterminated "${err}")
  if(unterminated)
    math(EXPR lines "${lines} + 1")
  endif()
  if(NOT lines EQUAL EXPECT_STDERR_LINES)
    message(FATAL_ERROR "expected ${EXPECT_STDERR_LINES} line(s) on stderr, got ${lines}\n${shown}")
  endif()
endif()
if(DEFINED EXPECT_STDOUT_REGEX AND NOT out MATCHES "${EXPECT_STDOUT_REGEX}")
  message(FATAL_ERROR "stdout does not match '${EXPECT_STDOUT_REGEX}'\n${shown}")
endif()
if(DEFINED EXPECT_STDERR_REGEX AND NOT err MATCHES "${EXPECT_STDERR_REGEX}")
  message(FATAL_ERROR "stderr does not match '${EXPECT_STDERR_REGEX}'\n${shown}")
endif()
