# towerpack: TP_WITH_CUDA=AUTO|ON|OFF.
# AUTO builds the CUDA backend when nvcc and the toolkit are found, ON fails
# when they are not, OFF skips it. The backend is a separate shared module
# (libtowerpack_cuda) that libtowerpack loads at run time, so nothing outside
# gpu/cuda sees CUDA and a machine without the CUDA libraries still runs on
# the CPU.
set(TP_CUDA_ENABLED OFF)
string(TOUPPER "${TP_WITH_CUDA}" _tp_cuda_mode)
if(NOT _tp_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "TP_WITH_CUDA must be AUTO, ON or OFF (got '${TP_WITH_CUDA}')")
endif()

if(NOT _tp_cuda_mode STREQUAL "OFF")
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX}
     AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  set(_tp_cuda_missing "")
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(NOT CUDAToolkit_FOUND)
      set(_tp_cuda_missing "the CUDA toolkit (cudart, cuBLAS)")
    endif()
  else()
    set(_tp_cuda_missing "nvcc (looked on PATH and in /usr/local/cuda/bin)")
  endif()
  if(NOT _tp_cuda_missing)
    find_package(CUDNN)
    find_package(NCCL)
    if(NOT CUDNN_FOUND)
      set(_tp_cuda_missing "cuDNN (cudnn.h, libcudnn)")
    elseif(NOT NCCL_FOUND)
      set(_tp_cuda_missing "NCCL (nccl.h, libnccl)")
    endif()
  endif()
  if(_tp_cuda_missing)
    if(_tp_cuda_mode STREQUAL "ON")
      message(FATAL_ERROR "TP_WITH_CUDA=ON but ${_tp_cuda_missing} was not "
        "found. Install the CUDA toolkit under /usr/local/cuda, or configure "
        "with -DTP_WITH_CUDA=OFF.")
    endif()
    message(STATUS "towerpack: CUDA backend off: ${_tp_cuda_missing} not found")
  else()
    set(TP_CUDA_ENABLED ON)
    message(STATUS "towerpack: CUDA backend on (architectures ${CMAKE_CUDA_ARCHITECTURES})")
  endif()
endif()
