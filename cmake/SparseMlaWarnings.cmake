# Warnings (errors with SPARSE_MLA_WERROR) on our own code only: Kokkos, GTest
# and CLI11 come in as imported targets, whose headers are system headers.
function(sparse_mla_warnings target)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wshadow -Wnon-virtual-dtor>)
    if(SPARSE_MLA_WERROR)
      target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
    endif()
  endif()
endfunction()

function(sparse_mla_sanitize target)
  if(SPARSE_MLA_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${SPARSE_MLA_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
    target_link_options(${target} PUBLIC -fsanitize=${SPARSE_MLA_SANITIZE})
  endif()
endfunction()

# Sources of `target` include no Kokkos header: where hipcc is the C++
# compiler it would compile them as HIP for its default GPU (gfx803), which
# costs time and checks nothing; they are plain C++.
function(sparse_mla_plain_cxx target)
  if(CMAKE_CXX_COMPILER MATCHES "hipcc$")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-xc++>)
  endif()
endfunction()
