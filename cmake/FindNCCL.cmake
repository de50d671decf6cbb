# Finds NCCL 2: defines NCCL_FOUND and the imported target NCCL::nccl.
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include /usr/local/include /usr/include)
find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu /usr/local/lib)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL DEFAULT_MSG NCCL_LIBRARY NCCL_INCLUDE_DIR)
if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
