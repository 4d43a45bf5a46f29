# Locate LibTorch: Debian's libtorch-dev, an unpacked LibTorch, or the one inside a
# PyTorch wheel. Set Torch_DIR or CMAKE_PREFIX_PATH to choose; otherwise the system
# package is tried first and then `python3 -c 'import torch; ...cmake_prefix_path'`
# (GRADGUARD_PYTHON names the interpreter to ask, e.g. a virtual environment's).
#
# Then it works out which GPU code the LibTorch found can run and sets
#   GRADGUARD_GPU_BACKEND      CUDA | ROCm | none
#   GRADGUARD_GPU_DEFINITIONS  compile definitions for the gradguard target (PUBLIC):
#                              GRADGUARD_WITH_CUDA=1 for CUDA, GRADGUARD_WITH_ROCM=1 for ROCm
# GRADGUARD_ENABLE_GPU=OFF builds the CPU code only, whatever LibTorch has.
set(GRADGUARD_PYTHON "" CACHE FILEPATH "Python interpreter whose torch package provides LibTorch (optional)")
option(GRADGUARD_ENABLE_GPU "Compile gradguard's CUDA code when the LibTorch found has CUDA" ON)

find_package(Torch QUIET)
if(NOT Torch_FOUND)
  if(GRADGUARD_PYTHON)
    set(_gg_python ${GRADGUARD_PYTHON})
  else()
    find_package(Python3 COMPONENTS Interpreter QUIET)
    set(_gg_python ${Python3_EXECUTABLE})
  endif()
  if(_gg_python)
    execute_process(
      COMMAND ${_gg_python} -c "import torch; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _gg_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_gg_torch_prefix)
      list(APPEND CMAKE_PREFIX_PATH ${_gg_torch_prefix})
    endif()
  endif()
  find_package(Torch REQUIRED)
endif()
message(STATUS "gradguard: LibTorch ${Torch_VERSION} from ${Torch_DIR}")

# ---- which GPU code this LibTorch has --------------------------------------------------
# TorchConfig/Caffe2Config leave these traces of the build's GPU support:
#   CUDA: TORCH_CUDA_LIBRARIES (c10_cuda and the CUDA runtime) is non-empty, and
#         Caffe2's public/cuda.cmake sets CAFFE2_USE_CUDA; lib/libc10_cuda.so exists.
#   ROCm: Caffe2's public/LoadHIP.cmake sets PYTORCH_FOUND_HIP; lib/libc10_hip.so exists.
# ROCm LibTorch also calls its GPUs "cuda" devices, but its GPU headers are the hipified
# c10/hip ones, so a ROCm build gets GRADGUARD_WITH_ROCM only and runs the
# device-generic code (see src/core/device.cpp for what that leaves out).
set(GRADGUARD_GPU_BACKEND "none")
set(GRADGUARD_GPU_DEFINITIONS "")
set(_gg_torch_lib_dir "")
if(TORCH_INSTALL_PREFIX)
  set(_gg_torch_lib_dir "${TORCH_INSTALL_PREFIX}/lib")
endif()
if(PYTORCH_FOUND_HIP OR (_gg_torch_lib_dir AND EXISTS "${_gg_torch_lib_dir}/libc10_hip.so"))
  set(GRADGUARD_GPU_BACKEND "ROCm")
elseif(TORCH_CUDA_LIBRARIES OR CAFFE2_USE_CUDA OR TARGET c10_cuda
       OR (_gg_torch_lib_dir AND EXISTS "${_gg_torch_lib_dir}/libc10_cuda.so"))
  set(GRADGUARD_GPU_BACKEND "CUDA")
endif()

if(GRADGUARD_GPU_BACKEND STREQUAL "CUDA" AND GRADGUARD_ENABLE_GPU)
  set(GRADGUARD_GPU_DEFINITIONS GRADGUARD_WITH_CUDA=1)
  message(STATUS "gradguard: GPU code: CUDA (GRADGUARD_WITH_CUDA=1; LibTorch has CUDA)")
elseif(GRADGUARD_GPU_BACKEND STREQUAL "ROCm" AND GRADGUARD_ENABLE_GPU)
  set(GRADGUARD_GPU_DEFINITIONS GRADGUARD_WITH_ROCM=1)
  message(STATUS "gradguard: GPU code: ROCm (GRADGUARD_WITH_ROCM=1; device-generic paths only: "
                 "no allocator statistics, no host-sync counting)")
elseif(NOT GRADGUARD_GPU_BACKEND STREQUAL "none")
  message(STATUS "gradguard: GPU code: none (LibTorch has ${GRADGUARD_GPU_BACKEND}, GRADGUARD_ENABLE_GPU=OFF)")
  set(GRADGUARD_GPU_BACKEND "none")
else()
  message(STATUS "gradguard: GPU code: none (CPU-only LibTorch)")
endif()
