# kernel_list.cmake - which kernel instantiations a build compiles, worked out in one place: for
# the build itself (CMakeLists.txt includes this file) and for the C layer's fuzzer (ci/fuzz.sh
# runs it in script mode), so that the list of launchers the dispatch tables name exists once.
#
#   include(cmake/kernel_list.cmake)            # defines the defaults and flashcore_kernel_list()
#   cmake [-DFLASHCORE_CUDA_ARCHS=...] -DFLASHCORE_KERNEL_LIST_FILE=kernel_list.h \
#         [-DFLASHCORE_KERNEL_DEFS_FILE=defs.rsp] -P cmake/kernel_list.cmake
#                                               # script mode: writes the header (and the defines,
#                                               # one -D flag a line) for the default build, or for
#                                               # the archs / head dims / dtypes given; needs no
#                                               # compiler and configures nothing
#
# One instantiation per kernel file, for each head dim x dtype that has a file. What comes out:
#   FLASHCORE_KERNEL_SOURCES  the sm80-class forward and backward and the decode kernels (every arch)
#   FLASHCORE_SM90_SOURCES    the Hopper forward and backward (sm_90a only; empty without 90a)
#   FLASHCORE_KERNEL_DEFS     FC_HAVE_<kernel>=1 per instantiation and FC_BUILT_SM89 / FC_BUILT_SM90
#                             per arch (c_src/dispatch.c: a family runs where its code is built)
#   FLASHCORE_KERNEL_LIST     one X-macro line per launcher, for the C layer's kernel tables
#                             (c_src/dispatch.c, c_src/bwd.c include the generated kernel_list.h)

# The defaults of CMakeLists.txt's cache variables: every arch, head dim and dtype.
set(FLASHCORE_DEFAULT_CUDA_ARCHS "89;90a")
set(FLASHCORE_DEFAULT_HEAD_DIMS "32;64;80;96;128;256")
set(FLASHCORE_DEFAULT_DTYPES "fp16;bf16")

# Sets the four variables above in the caller's scope from FLASHCORE_CUDA_ARCHS,
# FLASHCORE_HEAD_DIMS and FLASHCORE_DTYPES, for the kernel files under source_dir, and writes
# kernel_list.h to list_file (rewritten only when it changes, file(CONFIGURE), so an unchanged
# build recompiles nothing).
function(flashcore_kernel_list source_dir list_file)
  set(sources "")
  set(sm90_sources "")
  set(defs "")
  set(list "")
  set(kernels "${source_dir}/kernels")
  foreach(hd IN LISTS FLASHCORE_HEAD_DIMS)
    foreach(dt IN LISTS FLASHCORE_DTYPES)
      set(src "${kernels}/fwd_sm80_hdim${hd}_${dt}.cu")
      if(EXISTS "${src}")
        list(APPEND sources "${src}")
        list(APPEND defs "FC_HAVE_SM80_HDIM${hd}_${dt}=1")
        string(TOUPPER "${dt}" DT)
        string(APPEND list "FC_FWD_KERNEL(SM80, sm80_fwd, ${hd}, ${dt}, ${DT})\n")
      elseif(NOT EXISTS "${kernels}/fwd_sm90_hdim${hd}_${dt}.cu")
        message(FATAL_ERROR "no kernel file for head dim ${hd} / dtype ${dt} in either family")
      endif()
    endforeach()
  endforeach()

  # The Hopper family (TMA, wgmma, setmaxnreg) exists only as sm_90a code: the build compiles it
  # as its own object library, for 90a alone, when 90a is among the targets.
  if("90a" IN_LIST FLASHCORE_CUDA_ARCHS)
    foreach(hd IN LISTS FLASHCORE_HEAD_DIMS)
      foreach(dt IN LISTS FLASHCORE_DTYPES)
        set(src "${kernels}/fwd_sm90_hdim${hd}_${dt}.cu")
        if(EXISTS "${src}")
          list(APPEND sm90_sources "${src}")
          list(APPEND defs "FC_HAVE_SM90_HDIM${hd}_${dt}=1")
          string(TOUPPER "${dt}" DT)
          string(APPEND list "FC_FWD_KERNEL(SM90, sm90_fwd, ${hd}, ${dt}, ${DT})\n")
        endif()
        # The Hopper backward (head dims 64/128).
        set(src "${kernels}/bwd_sm90_hdim${hd}_${dt}.cu")
        if(EXISTS "${src}")
          list(APPEND sm90_sources "${src}")
          list(APPEND defs "FC_HAVE_SM90_BWD_HDIM${hd}_${dt}=1")
          string(TOUPPER "${dt}" DT)
          string(APPEND list "FC_BWD_KERNEL(SM90, sm90_bwd, ${hd}, ${dt}, ${DT})\n")
        endif()
      endforeach()
    endforeach()
  endif()

  # The decode kernel (split-KV, GQA packing) for head dims 64 and 128 and both dtypes: every
  # file there is, whatever the head dim and dtype lists say. (A configure re-globs when the
  # build runs, CONFIGURE_DEPENDS; script mode has no build to re-run it.)
  if(CMAKE_SCRIPT_MODE_FILE)
    file(GLOB decode_sources "${kernels}/decode_sm80_hdim*.cu")
  else()
    file(GLOB decode_sources CONFIGURE_DEPENDS "${kernels}/decode_sm80_hdim*.cu")
  endif()
  list(APPEND sources ${decode_sources})
  list(APPEND defs "FC_HAVE_DECODE_HDIM64_fp16=1")
  foreach(src IN LISTS decode_sources)
    string(REGEX MATCH "hdim([0-9]+)_([a-z0-9]+)\\.cu$" _ "${src}")
    string(TOUPPER "${CMAKE_MATCH_2}" DT)
    string(APPEND list "FC_FWD_KERNEL(DECODE, decode, ${CMAKE_MATCH_1}, ${CMAKE_MATCH_2}, ${DT})\n")
  endforeach()

  # The fused backward (sm80 family, head dims 32/64/80/96/128): one instantiation per file, like the forward.
  foreach(hd IN LISTS FLASHCORE_HEAD_DIMS)
    foreach(dt IN LISTS FLASHCORE_DTYPES)
      set(src "${kernels}/bwd_sm80_hdim${hd}_${dt}.cu")
      if(EXISTS "${src}")
        list(APPEND sources "${src}")
        list(APPEND defs "FC_HAVE_SM80_BWD_HDIM${hd}_${dt}=1")
        string(TOUPPER "${dt}" DT)
        string(APPEND list "FC_BWD_KERNEL(SM80, sm80_bwd, ${hd}, ${dt}, ${DT})\n")
      endif()
    endforeach()
  endforeach()

  if("90a" IN_LIST FLASHCORE_CUDA_ARCHS)
    list(APPEND defs "FC_BUILT_SM90=1")
  endif()
  if("89" IN_LIST FLASHCORE_CUDA_ARCHS)
    list(APPEND defs "FC_BUILT_SM89=1")
  endif()

  file(CONFIGURE OUTPUT "${list_file}" CONTENT
"/* Written by CMake (cmake/kernel_list.cmake): the launchers this build compiles, one line per
 * kernel file. FC_FWD_KERNEL(family, prefix, head_dim, dtype, DTYPE) names
 * fc_<prefix>_hdim<head_dim>_<dtype>; FC_BWD_KERNEL likewise. The includer defines both macros. */
${list}")
  set(FLASHCORE_KERNEL_SOURCES "${sources}" PARENT_SCOPE)
  set(FLASHCORE_SM90_SOURCES "${sm90_sources}" PARENT_SCOPE)
  set(FLASHCORE_KERNEL_DEFS "${defs}" PARENT_SCOPE)
  set(FLASHCORE_KERNEL_LIST "${list}" PARENT_SCOPE)
endfunction()

# Script mode (cmake -P this file): the default build's lists unless given, written out.
if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  foreach(var IN ITEMS CUDA_ARCHS HEAD_DIMS DTYPES)
    if(NOT DEFINED FLASHCORE_${var})
      set(FLASHCORE_${var} "${FLASHCORE_DEFAULT_${var}}")
    endif()
  endforeach()
  if(NOT FLASHCORE_KERNEL_LIST_FILE)
    message(FATAL_ERROR "kernel_list.cmake: pass -DFLASHCORE_KERNEL_LIST_FILE=<path of kernel_list.h>")
  endif()
  get_filename_component(_fc_source_dir "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
  flashcore_kernel_list("${_fc_source_dir}" "${FLASHCORE_KERNEL_LIST_FILE}")
  # The same defines as the build's compile definitions, for a compiler's @file (ci/fuzz.sh).
  if(FLASHCORE_KERNEL_DEFS_FILE)
    list(TRANSFORM FLASHCORE_KERNEL_DEFS PREPEND "-D")
    list(JOIN FLASHCORE_KERNEL_DEFS "\n" _fc_defs)
    file(CONFIGURE OUTPUT "${FLASHCORE_KERNEL_DEFS_FILE}" CONTENT "${_fc_defs}\n")
  endif()
endif()
