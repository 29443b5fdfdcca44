# cmake -DBUILD=dir -DTARGET=t [-DEXPECT=regex] -P check.cmake
# Builds one snippet. Without EXPECT it must build; with EXPECT the build
# must fail and its output match EXPECT (the reason the snippet names).
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD} --target ${TARGET}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT DEFINED EXPECT OR EXPECT STREQUAL "")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${TARGET} (correct use) does not compile:\n${out}")
  endif()
  return()
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled; it must not (${EXPECT})")
endif()
if(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "${TARGET} failed to compile, but not for the expected reason (${EXPECT}):\n${out}")
endif()
message(STATUS "${TARGET} does not compile, as expected (${EXPECT})")
