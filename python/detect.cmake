# Whether the Python module (python/) can be built here: included by the top-level
# CMakeLists.txt before its GRADGUARD_BUILD_PYTHON option, whose default is the answer.
# The module needs three things from the system:
#   pybind11 (Debian: pybind11-dev)      its CMake package, pybind11Config.cmake
#   Python 3 headers (python3-dev)       found by pybind11 through FindPython3
#   torch's Python library               libtorch_python.so beside libtorch.so, and
#                                        torch/extension.h among LibTorch's headers
# Sets GRADGUARD_PYTHON_FOUND (ON/OFF) and, when found, GRADGUARD_TORCH_PYTHON_LIBRARY.
# The interpreter is GRADGUARD_PYTHON_EXECUTABLE: /usr/bin/python3 by default, the one
# Debian's python3-torch belongs to (another python3 on PATH may have no torch).
set(GRADGUARD_PYTHON_EXECUTABLE "/usr/bin/python3" CACHE FILEPATH
    "Python interpreter the gradguard module is built for (its torch must be this LibTorch's)")

set(GRADGUARD_PYTHON_FOUND OFF)
set(_gg_py_missing "")
if(NOT EXISTS "${GRADGUARD_PYTHON_EXECUTABLE}")
  list(APPEND _gg_py_missing "the interpreter ${GRADGUARD_PYTHON_EXECUTABLE}")
endif()
set(Python3_EXECUTABLE "${GRADGUARD_PYTHON_EXECUTABLE}")
find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
if(NOT Python3_Development.Module_FOUND)
  list(APPEND _gg_py_missing "the Python 3 headers (python3-dev)")
endif()
find_package(pybind11 CONFIG QUIET)  # after Python3: pybind11 then uses FindPython3's result
if(NOT pybind11_FOUND)
  list(APPEND _gg_py_missing "pybind11 (apt-get install pybind11-dev)")
endif()
set(_gg_torch_lib_hints "")
foreach(_lib IN LISTS TORCH_LIBRARIES)
  if(IS_ABSOLUTE "${_lib}")
    get_filename_component(_dir "${_lib}" DIRECTORY)
    list(APPEND _gg_torch_lib_hints "${_dir}")
  endif()
endforeach()
if(TORCH_INSTALL_PREFIX)
  list(APPEND _gg_torch_lib_hints "${TORCH_INSTALL_PREFIX}/lib")
endif()
find_library(GRADGUARD_TORCH_PYTHON_LIBRARY torch_python HINTS ${_gg_torch_lib_hints})
if(NOT GRADGUARD_TORCH_PYTHON_LIBRARY)
  list(APPEND _gg_py_missing "libtorch_python.so (Debian: python3-torch)")
endif()
find_path(GRADGUARD_TORCH_EXTENSION_INCLUDE torch/extension.h PATHS ${TORCH_INCLUDE_DIRS})
if(NOT GRADGUARD_TORCH_EXTENSION_INCLUDE)
  list(APPEND _gg_py_missing "torch/extension.h (LibTorch's Python extension headers)")
endif()

if(_gg_py_missing)
  list(JOIN _gg_py_missing ", " _gg_py_missing_text)
  message(STATUS "gradguard: Python module off (missing: ${_gg_py_missing_text})")
else()
  set(GRADGUARD_PYTHON_FOUND ON)
  message(STATUS "gradguard: Python module buildable (pybind11 ${pybind11_VERSION}, ${GRADGUARD_TORCH_PYTHON_LIBRARY})")
endif()

# The option's default follows the detection, also when it changes later (pybind11-dev
# installed after the first configure): a value this file chose is re-chosen, a value
# given with -DGRADGUARD_BUILD_PYTHON=... is kept.
if(DEFINED CACHE{GRADGUARD_BUILD_PYTHON} AND DEFINED CACHE{_GRADGUARD_BUILD_PYTHON_AUTO}
   AND "${GRADGUARD_BUILD_PYTHON}" STREQUAL "${_GRADGUARD_BUILD_PYTHON_AUTO}"
   AND NOT "${GRADGUARD_BUILD_PYTHON}" STREQUAL "${GRADGUARD_PYTHON_FOUND}")
  set_property(CACHE GRADGUARD_BUILD_PYTHON PROPERTY VALUE ${GRADGUARD_PYTHON_FOUND})
endif()
if(NOT DEFINED CACHE{GRADGUARD_BUILD_PYTHON} OR DEFINED CACHE{_GRADGUARD_BUILD_PYTHON_AUTO})
  set(_GRADGUARD_BUILD_PYTHON_AUTO ${GRADGUARD_PYTHON_FOUND} CACHE INTERNAL "value detect.cmake chose")
endif()
