# sparse-mla bench --json-file, read by tools/bench/plot_hisparse.py: the
# quick model-step cases at 1 row are timed and checked, their JSON is
# written beside the table, and the script turns it into its table and a PNG.
#   cmake -DCLI=<sparse-mla> -DPYTHON=<python3> -DSCRIPT=<plot_hisparse.py> -DDIR=<dir> -P bench_plot.cmake
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
execute_process(COMMAND "${CLI}" bench --quick --filter "^model-step/rows=1," --json-file "${DIR}/bench.json"
                RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT code EQUAL 0 OR NOT out MATCHES "model-step/rows=1,hits=99")
  message(FATAL_ERROR "bench exited ${code}\n--- stdout:\n${out}\n--- stderr:\n${err}")
endif()
file(READ "${DIR}/bench.json" json)
foreach(hits 90 99 100)
  if(NOT json MATCHES "\"name\": \"model-step/rows=1,hits=${hits}\",[^}]*\"outcome\": \"ok \\(hits ${hits}%\\)\"[^}]*\"at_ceiling_us\"")
    message(FATAL_ERROR "bench.json has no checked model-step/rows=1,hits=${hits} with its floor:\n${json}")
  endif()
endforeach()
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" "${DIR}/bench.json" --png "${DIR}/sweep.png"
                RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT code EQUAL 0 OR NOT out MATCHES "\\| 1 \\| 99% \\| [0-9.]+ \\| [0-9.]+ \\|")
  message(FATAL_ERROR "plot_hisparse.py exited ${code}\n--- stdout:\n${out}\n--- stderr:\n${err}")
endif()
file(READ "${DIR}/sweep.png" signature LIMIT 8 HEX)
if(NOT signature STREQUAL "89504e470d0a1a0a")
  message(FATAL_ERROR "${DIR}/sweep.png is not a PNG (starts ${signature})")
endif()
