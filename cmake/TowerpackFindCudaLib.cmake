# One find module's body for a library shipped beside CUDA (cuDNN, NCCL):
# its header and library under the CUDA toolkit, $<PKG>_ROOT or
# /usr/local/cuda; defines <PKG>_FOUND, <PKG>_INCLUDE_DIR, <PKG>_LIBRARY and
# the imported target. A macro, so that <PKG>_FOUND lands in the caller.
#   tp_find_cuda_lib(PKG header library target)
macro(tp_find_cuda_lib _pkg _header _lib _target)
  find_path(${_pkg}_INCLUDE_DIR ${_header}
    HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV ${_pkg}_ROOT /usr/local/cuda
    PATH_SUFFIXES include)
  find_library(${_pkg}_LIBRARY ${_lib}
    HINTS ${CUDAToolkit_LIBRARY_DIR} ENV ${_pkg}_ROOT /usr/local/cuda
    PATH_SUFFIXES lib64 lib)
  include(FindPackageHandleStandardArgs)
  find_package_handle_standard_args(${_pkg} DEFAULT_MSG
    ${_pkg}_LIBRARY ${_pkg}_INCLUDE_DIR)
  if(${_pkg}_FOUND AND NOT TARGET ${_target})
    add_library(${_target} UNKNOWN IMPORTED)
    set_target_properties(${_target} PROPERTIES
      IMPORTED_LOCATION "${${_pkg}_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${${_pkg}_INCLUDE_DIR}")
  endif()
  mark_as_advanced(${_pkg}_INCLUDE_DIR ${_pkg}_LIBRARY)
endmacro()
