# validate --synthetic --dump DIR, then validate --golden on every dumped
# file: the dump is in the golden format and matches the library.
#   cmake -DCLI=<sparse-mla> -DDIR=<empty scratch dir> [-DEXTRA=--dcp-size|2] -P dump_roundtrip.cmake
# EXTRA: more options, separated by '|'.
file(REMOVE_RECURSE "${DIR}")
string(REPLACE "|" ";" extra "${EXTRA}")
execute_process(COMMAND "${CLI}" validate --synthetic --layers 8 --index-every 4 --requests 4 --topk 64
                        --steps 3 --seed 7 --dump "${DIR}" ${extra}
                RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT code EQUAL 0 OR NOT out MATCHES "dumped 4 topk_convert files")
  message(FATAL_ERROR "dump: exit ${code}\n${out}\n${err}")
endif()
file(GLOB dumped "${DIR}/*.safetensors")
list(LENGTH dumped n)
if(NOT n EQUAL 4)
  message(FATAL_ERROR "expected 4 dumped files (the prefill step and 3 decode steps), found ${n}: ${dumped}")
endif()
execute_process(COMMAND "${CLI}" validate --golden ${dumped}
                RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT code EQUAL 0 OR NOT out MATCHES "4 case\\(s\\) on host: 4 ok, 0 failed")
  message(FATAL_ERROR "validate --golden on the dump: exit ${code}\n${out}\n${err}")
endif()
