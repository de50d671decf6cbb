# Sanitizer and fuzzing builds. TANDEM_SANITIZE (e.g. "address,undefined") instruments every target;
# TANDEM_FUZZ (clang only) adds libFuzzer's coverage instrumentation and the harnesses in fuzz/.
set(TANDEM_SANITIZE "" CACHE STRING "Sanitizers for every target, e.g. address,undefined (empty: none)")
option(TANDEM_FUZZ "Build the libFuzzer harnesses in fuzz/ (clang; implies address,undefined)" OFF)

if(TANDEM_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "TANDEM_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++")
  endif()
  if(NOT TANDEM_SANITIZE)
    set(TANDEM_SANITIZE address,undefined)
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
  # The conventional switch that lets fuzzed inputs past checksums into the parsers behind them.
  add_compile_definitions(FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION)
endif()
if(TANDEM_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${TANDEM_SANITIZE}>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=all>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=${TANDEM_SANITIZE})
endif()
