# Find cuDNN. Defines CUDNN_FOUND and the imported target CUDNN::cudnn.
include(${CMAKE_CURRENT_LIST_DIR}/TowerpackFindCudaLib.cmake)
tp_find_cuda_lib(CUDNN cudnn.h cudnn CUDNN::cudnn)
