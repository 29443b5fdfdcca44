# Warnings for overlap's own targets only; never global flags.
# OVERLAP_WERROR turns them into errors. Off by default, so that a newer
# compiler's new warnings never stop a user's build; CI turns it on for GCC
# and Clang (.ci/run) through the environment variable of the same name.
if(DEFINED ENV{OVERLAP_WERROR})
  set(overlap_werror_default $ENV{OVERLAP_WERROR})
else()
  set(overlap_werror_default OFF)
endif()
option(OVERLAP_WERROR "Treat compiler warnings in overlap's own targets as errors" ${overlap_werror_default})

function(overlap_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra -Wshadow -Wconversion -Wno-sign-conversion>
    $<$<AND:$<BOOL:${OVERLAP_WERROR}>,$<CXX_COMPILER_ID:GNU,Clang>>:-Werror>)
endfunction()
