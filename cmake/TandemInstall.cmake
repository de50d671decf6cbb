# Install rules: headers, libtandem, the tandem program, a CMake package (tandemConfig.cmake with the
# target tandem::tandem) and a pkg-config file. Version: PROJECT_VERSION.
include(CMakePackageConfigHelpers)

set(TANDEM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/tandem)
install(TARGETS tandem EXPORT tandemTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tandem DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET tandem_cli)
  install(TARGETS tandem_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(EXPORT tandemTargets NAMESPACE tandem:: DESTINATION ${TANDEM_CMAKE_DIR})

# What tandemConfig.cmake must find again: exactly the components this build linked.
set(TANDEM_CONFIG_DEPENDENCIES "find_dependency(Threads)\nfind_dependency(OpenMP)\nfind_dependency(ZLIB)\nfind_dependency(BLAS)\n")
if(TANDEM_WITH_CUDA)
  string(APPEND TANDEM_CONFIG_DEPENDENCIES "find_dependency(CUDAToolkit)\nfind_dependency(CUDNN)\n")
endif()
if(TANDEM_WITH_NCCL)
  string(APPEND TANDEM_CONFIG_DEPENDENCIES "find_dependency(NCCL)\n")
endif()
if(TANDEM_WITH_GLOO)
  string(APPEND TANDEM_CONFIG_DEPENDENCIES "find_dependency(Gloo CONFIG)\n")
endif()
if(TANDEM_WITH_MPI)
  string(APPEND TANDEM_CONFIG_DEPENDENCIES "find_dependency(MPI COMPONENTS CXX)\n")
endif()
if(TANDEM_WITH_OPENSSL)
  string(APPEND TANDEM_CONFIG_DEPENDENCIES "find_dependency(OpenSSL COMPONENTS Crypto)\n")
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tandemConfig.cmake.in
  ${PROJECT_BINARY_DIR}/tandemConfig.cmake INSTALL_DESTINATION ${TANDEM_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/tandemConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tandemConfig.cmake ${PROJECT_BINARY_DIR}/tandemConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/FindCUDNN.cmake ${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake
  DESTINATION ${TANDEM_CMAKE_DIR})

# pkg-config: libtandem is static, so its dependencies go into Libs (pkg-config --libs tandem links).
# Imported targets are spelled as the files they stand for.
set(TANDEM_PC_LIBS "-lz -lopenblas -fopenmp -pthread")
function(tandem_pc_add_target target)
  foreach(prop IMPORTED_LOCATION IMPORTED_LOCATION_RELEASE IMPORTED_LOCATION_NOCONFIG)
    get_target_property(loc ${target} ${prop})
    if(loc)
      set(TANDEM_PC_LIBS "${TANDEM_PC_LIBS} ${loc}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  get_target_property(libs ${target} INTERFACE_LINK_LIBRARIES)
  foreach(lib ${libs})
    if(lib MATCHES "^/")
      string(APPEND TANDEM_PC_LIBS " ${lib}")
    endif()
  endforeach()
  set(TANDEM_PC_LIBS "${TANDEM_PC_LIBS}" PARENT_SCOPE)
endfunction()
if(TANDEM_WITH_GLOO)
  string(APPEND TANDEM_PC_LIBS " -lgloo")
endif()
if(TANDEM_WITH_MPI)
  tandem_pc_add_target(MPI::MPI_CXX)
endif()
if(TANDEM_WITH_OPENSSL)
  tandem_pc_add_target(OpenSSL::Crypto)
endif()
if(TANDEM_WITH_CUDA)
  foreach(t CUDA::cudart CUDA::cublas CUDA::cublasLt CUDNN::cudnn)
    tandem_pc_add_target(${t})
  endforeach()
  if(TANDEM_WITH_CUDNN_FRONTEND)
    tandem_pc_add_target(CUDA::nvrtc)
  endif()
endif()
if(TANDEM_WITH_NCCL)
  tandem_pc_add_target(NCCL::nccl)
endif()
# The prefix is found from the .pc file's own place, so that `cmake --install --prefix P` works.
file(RELATIVE_PATH TANDEM_PC_TO_PREFIX /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
configure_file(${PROJECT_SOURCE_DIR}/cmake/tandem.pc.in ${PROJECT_BINARY_DIR}/tandem.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/tandem.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
