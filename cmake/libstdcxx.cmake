# cmake/libstdcxx.cmake — keep libstdc++ out of _C.so.
#
# Some toolchains link libstdc++ statically into shared libraries: their driver's library directory holds
# libstdc++.a but no libstdc++.so (seen on a GPU machine whose compiler lives in /opt/gcc). _C.so then carries
# a private copy of the iostream templates (std::ostream::_M_insert<long>, the num_put facet ids) next to the
# libstdc++.so.6 that torch loads, and every error message that formats a number goes through a facet the
# running locale never registered: a segfault (or, with other versions, the number silently missing). Torch's
# own exceptions pass through fine, so only our TORCH_CHECK messages showed it.
#
# mk_link_shared_libstdcxx(target runtime_lib) probes the compiler once: a tiny shared library that formats a
# long; if its nm lists a definition of std::ostream::_M_insert<long>, the driver links statically, and the
# target links `runtime_lib` (the libstdc++.so.6 of the python + torch process) before the driver's own
# -lstdc++, so the archive contributes nothing. cmake/check_libstdcxx.py checks the result after every link.
function(mk_link_shared_libstdcxx target runtime_lib)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    return()
  endif()
  set(_dir "${CMAKE_BINARY_DIR}/libstdcxx_probe")
  file(WRITE "${_dir}/probe.cc" "#include <sstream>\nstd::string mk_probe(long v) { std::ostringstream s; s << v; return s.str(); }\n")
  separate_arguments(_flags UNIX_COMMAND "${CMAKE_SHARED_LINKER_FLAGS}")
  execute_process(COMMAND "${CMAKE_CXX_COMPILER}" -fPIC -shared ${_flags} probe.cc -o probe.so
                  WORKING_DIRECTORY "${_dir}" RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(WARNING "libstdc++ probe did not link (${_err}); cmake/check_libstdcxx.py still checks _C.so")
    return()
  endif()
  execute_process(COMMAND "${CMAKE_NM}" -D --defined-only "${_dir}/probe.so" OUTPUT_VARIABLE _syms)
  if(NOT _syms MATCHES "_ZNSo9_M_insertIlEERSoT_")
    message(STATUS "libstdc++: linked as a shared library")
    return()
  endif()
  if(runtime_lib STREQUAL "" OR NOT EXISTS "${runtime_lib}")
    find_library(_mk_libstdcxx NAMES libstdc++.so.6)
    set(runtime_lib "${_mk_libstdcxx}")
  endif()
  if(runtime_lib STREQUAL "" OR NOT EXISTS "${runtime_lib}")
    message(FATAL_ERROR "${CMAKE_CXX_COMPILER} links libstdc++ statically into shared libraries and no "
            "libstdc++.so.6 was found: use a compiler with a shared libstdc++ (CMAKE_CXX_COMPILER=...)")
  endif()
  message(STATUS "libstdc++: ${CMAKE_CXX_COMPILER} would link it statically; linking ${runtime_lib} instead")
  target_link_libraries(${target} PRIVATE "${runtime_lib}")
endfunction()
