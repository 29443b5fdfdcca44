# The Python package (python/): whether to build it, and with which Python.
#
# OVERLAP_BUILD_PYTHON defaults to ON when a Python with NumPy and mpi4py and
# pybind11's CMake package are found, the build is overlap's own, and the
# MPI is Open MPI (Debian's mpi4py is built against Open MPI; a module that
# links MPICH beside it would load two MPIs). OVERLAP_PYTHON_EXECUTABLE
# picks the interpreter; otherwise the first of python3 on PATH and
# /usr/bin/python3 that imports numpy and mpi4py (a pyenv or venv python3
# first on PATH often lacks the distribution's packages).
set(overlap_python_default OFF)
set(overlap_python_why "")
if(NOT overlap_is_top OR OVERLAP_SMPI)
  set(overlap_python_why "not the top-level project, or an SMPI build")
elseif(MPI_CXX_COMPILER MATCHES "mpich" OR OVERLAP_MPI_STACK STREQUAL "mpich")
  set(overlap_python_why "MPICH build (mpi4py here is Open MPI's)")
else()
  set(candidates ${OVERLAP_PYTHON_EXECUTABLE})
  if(NOT candidates)
    find_program(overlap_path_python3 python3)
    set(candidates ${overlap_path_python3} /usr/bin/python3)
  endif()
  foreach(py IN LISTS candidates)
    if(EXISTS ${py})
      execute_process(COMMAND ${py} -c "import numpy, mpi4py" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
      if(rc EQUAL 0)
        set(overlap_python ${py})
        break()
      endif()
    endif()
  endforeach()
  if(overlap_python)
    # pybind11 then finds this interpreter through FindPython (not the first on PATH).
    set(Python_EXECUTABLE ${overlap_python})
    set(PYBIND11_FINDPYTHON ON)
    find_package(pybind11 2.6 CONFIG QUIET)
  endif()
  if(NOT overlap_python)
    set(overlap_python_why "no Python with numpy and mpi4py (tried: ${candidates})")
  elseif(NOT pybind11_FOUND)
    set(overlap_python_why "pybind11's CMake package not found (Debian: pybind11-dev)")
  else()
    set(overlap_python_default ON)
  endif()
endif()
option(OVERLAP_BUILD_PYTHON "Build the Python package overlap (python/)" ${overlap_python_default})
if(OVERLAP_BUILD_PYTHON AND NOT overlap_python_default)
  message(FATAL_ERROR "OVERLAP_BUILD_PYTHON is ON, but ${overlap_python_why}")
endif()
if(OVERLAP_BUILD_PYTHON)
  set(OVERLAP_PYTHON_EXECUTABLE ${overlap_python} CACHE FILEPATH "The Python the package is built for")
  message(STATUS "Python package: for ${OVERLAP_PYTHON_EXECUTABLE}")
elseif(overlap_python_why)
  message(STATUS "Python package: not built (${overlap_python_why})")
endif()
