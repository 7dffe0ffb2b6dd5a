# Find NCCL. Defines NCCL_FOUND and the imported target NCCL::nccl.
include(${CMAKE_CURRENT_LIST_DIR}/TowerpackFindCudaLib.cmake)
tp_find_cuda_lib(NCCL nccl.h nccl NCCL::nccl)
