# The cuDNN frontend's C++ headers (header-only; PyPI's nvidia-cudnn-frontend carries them), from which
# cuDNN's fused flash attention is built. ./tandem.sh fetches them into the default place; without
# them tandem still builds, and attention on GPUs takes the math path.
set(TANDEM_CUDNN_FRONTEND_INCLUDE "${PROJECT_BINARY_DIR}/cudnn-frontend/include" CACHE PATH
    "Directory holding cudnn_frontend.h (the cuDNN frontend's include/), for cuDNN's fused attention")
if(EXISTS "${TANDEM_CUDNN_FRONTEND_INCLUDE}/cudnn_frontend.h" AND TARGET CUDA::nvrtc)
  set(TANDEM_WITH_CUDNN_FRONTEND TRUE)
  file(STRINGS "${TANDEM_CUDNN_FRONTEND_INCLUDE}/cudnn_frontend_version.h" _fe_version
       REGEX "define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION")
  string(REGEX REPLACE "[^0-9;]" "" _fe_version "${_fe_version}")
  string(REPLACE ";" "." _fe_version "${_fe_version}")
  message(STATUS "tandem: cuDNN frontend ${_fe_version} at ${TANDEM_CUDNN_FRONTEND_INCLUDE}: fused attention on")
else()
  set(TANDEM_WITH_CUDNN_FRONTEND FALSE)
  if(NOT TARGET CUDA::nvrtc)
    message(STATUS "tandem: no NVRTC in the CUDA toolkit, which the cuDNN frontend needs")
  endif()
  message(STATUS "tandem: no cuDNN frontend headers at ${TANDEM_CUDNN_FRONTEND_INCLUDE} (./tandem.sh fetches them, "
                 "or set -DTANDEM_CUDNN_FRONTEND_INCLUDE=<dir with cudnn_frontend.h>): fused attention compiled out, "
                 "attention on GPUs takes the math path")
endif()

# tandem_use_cudnn_frontend(<source>): compiles the source that builds cuDNN graphs with the headers (as system
# headers: their warnings are not tandem's) and TANDEM_WITH_CUDNN_FRONTEND=1|0. The library links NVRTC where
# the headers are used (src/CMakeLists.txt): the frontend's own kernels, never used by tandem, reference it.
function(tandem_use_cudnn_frontend src)
  if(TANDEM_WITH_CUDNN_FRONTEND)
    set_property(SOURCE ${src} APPEND PROPERTY COMPILE_OPTIONS "-isystem" "${TANDEM_CUDNN_FRONTEND_INCLUDE}")
    set_property(SOURCE ${src} APPEND PROPERTY COMPILE_DEFINITIONS TANDEM_WITH_CUDNN_FRONTEND=1
                 CUDNN_FRONTEND_SKIP_JSON_LIB)
  else()
    set_property(SOURCE ${src} APPEND PROPERTY COMPILE_DEFINITIONS TANDEM_WITH_CUDNN_FRONTEND=0)
  endif()
endfunction()
