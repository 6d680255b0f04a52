# install_consumer.cmake - ctest c_install_consumer (cmake -P): installs the built C library
# under a fresh prefix (cmake --install), then builds examples/c/attention.c against that prefix
# twice, through find_package(flashcore) and through pkg-config, and runs both builds. Each run
# must compute attention correctly (exit 0) or, without a GPU, print what fc_sdpa_support says
# and exit 77; any failed step fails the test. The prefix differs from the build's
# CMAKE_INSTALL_PREFIX, so the pkg-config build also checks that flashcore.pc is relocatable.
# Arguments (-D): BUILD_DIR, SOURCE_DIR, WORK_DIR, GENERATOR, C_COMPILER.
foreach(var BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR C_COMPILER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "install_consumer.cmake needs -D${var}=...")
  endif()
endforeach()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
endfunction()

# The example's run: 0 (checked on a GPU) or 77 (no GPU; it says so) pass.
function(run_example what exe)
  execute_process(COMMAND "${CMAKE_COMMAND}" -E env "LD_LIBRARY_PATH=${WORK_DIR}/prefix/lib" "${exe}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(STRIP "${out}" out)
  if(rc EQUAL 0 OR rc EQUAL 77)
    message(STATUS "${what}: ${out}")
  else()
    message(FATAL_ERROR "${what} exited ${rc}:\n${out}\n${err}")
  endif()
endfunction()

set(prefix "${WORK_DIR}/prefix")
file(REMOVE_RECURSE "${WORK_DIR}")
run_step("cmake --install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}")
foreach(path lib/libflashcore.so include/flashcore.h lib/cmake/flashcore/flashcoreConfig.cmake lib/pkgconfig/flashcore.pc)
  if(NOT EXISTS "${prefix}/${path}")
    message(FATAL_ERROR "cmake --install did not install ${path}")
  endif()
endforeach()

# Through find_package(flashcore): examples/c/CMakeLists.txt.
run_step("configuring examples/c with find_package(flashcore)"
  "${CMAKE_COMMAND}" -S "${SOURCE_DIR}/examples/c" -B "${WORK_DIR}/cmake" -G "${GENERATOR}"
  "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_C_COMPILER=${C_COMPILER}")
run_step("building examples/c with find_package(flashcore)" "${CMAKE_COMMAND}" --build "${WORK_DIR}/cmake")
run_example("find_package(flashcore) build" "${WORK_DIR}/cmake/attention")

# Through pkg-config, with the flags it gives and nothing else (and libm).
find_program(PKG_CONFIG pkg-config)
if(NOT PKG_CONFIG)
  message(FATAL_ERROR "pkg-config is not installed: the pkg-config half of this test needs it")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" -E env "PKG_CONFIG_PATH=${prefix}/lib/pkgconfig"
                        "${PKG_CONFIG}" --cflags --libs flashcore
                RESULT_VARIABLE rc OUTPUT_VARIABLE flags ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs flashcore failed:\n${err}")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
file(MAKE_DIRECTORY "${WORK_DIR}/pkgconfig")
run_step("compiling examples/c/attention.c with pkg-config's flags"
  "${C_COMPILER}" "${SOURCE_DIR}/examples/c/attention.c" ${flags} -lm -o "${WORK_DIR}/pkgconfig/attention")
run_example("pkg-config build" "${WORK_DIR}/pkgconfig/attention")
