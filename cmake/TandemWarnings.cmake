add_library(tandem_warnings INTERFACE)
target_compile_options(tandem_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wno-sign-compare>)
