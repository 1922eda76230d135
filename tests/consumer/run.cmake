# Installs the built moejit into BUILD_DIR/consumer-prefix, builds the
# consumer project against it with find_package, runs it, then compiles the
# same program through pkg-config's flags.
set(prefix ${BUILD_DIR}/consumer-prefix)
set(cbuild ${BUILD_DIR}/consumer-build)
file(REMOVE_RECURSE ${prefix} ${cbuild})
function(run_step)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
run_step(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
run_step(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${cbuild} -G ${GENERATOR}
         -DCMAKE_PREFIX_PATH=${prefix})
run_step(${CMAKE_COMMAND} --build ${cbuild})
run_step(${cbuild}/consumer)
# pkg-config route
file(GLOB pcdirs ${prefix}/lib*/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "${pcdirs}")
execute_process(COMMAND pkg-config --cflags --libs moejit OUTPUT_VARIABLE flags RESULT_VARIABLE rc
                OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config does not know moejit")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
run_step(cc ${SOURCE_DIR}/tests/consumer/main.c ${flags} -o ${cbuild}/consumer-pc)
file(GLOB libdirs ${prefix}/lib*)
# keep the caller's path too: libmoejit's own dependencies (libyaml) may live there
string(REPLACE ";" ":" libdirs "${libdirs}")
set(ENV{LD_LIBRARY_PATH} "${libdirs}:$ENV{LD_LIBRARY_PATH}")
run_step(${cbuild}/consumer-pc)
