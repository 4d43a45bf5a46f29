# Locate LibTorch: Debian's libtorch-dev, an unpacked LibTorch, or the one inside a
# PyTorch wheel. Set Torch_DIR or CMAKE_PREFIX_PATH to choose; otherwise the system
# package is tried first and then `python3 -c 'import torch; ...cmake_prefix_path'`.
find_package(Torch QUIET)
if(NOT Torch_FOUND)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import torch; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _gg_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_gg_torch_prefix)
      list(APPEND CMAKE_PREFIX_PATH ${_gg_torch_prefix})
    endif()
  endif()
  find_package(Torch REQUIRED)
endif()
message(STATUS "gradguard: LibTorch ${Torch_VERSION} from ${Torch_DIR}")
