# Precompiled headers: one for Tandem's code (the C++ library, Abseil, gRPC,
# Protobuf) and one for its tests (the same plus GoogleTest/GoogleMock).
# A Tandem source file is ~300 lines but ~160,000 once its headers are in,
# so parsing them once per build instead of once per file roughly halves
# CI's build time. Every C++-only target reuses one of the two (REUSE_FROM);
# targets with CUDA or C sources keep their plain compile.
#
# GCC uses a precompiled header only when the macros it saw are defined the
# same way (GCC manual, "Using Precompiled Headers"), so every C++ file is
# compiled with -pthread (it defines _REENTRANT) and the test holder links
# GTest (GTEST_HAS_PTHREAD=1), as every test does. Where one still does not
# match, GCC includes the headers as text: slower, never wrong.
#
# Test files are compiled at -O1 (the code under test keeps -O3): a
# GoogleTest file spends most of its -O3 compile optimizing TEST bodies and
# matchers, which run once; -O1 plus the header takes a third of the time.
# A test whose own file does heavy arithmetic keeps -O3 with
# `set_target_properties(<t> PROPERTIES TANDEM_TEST_KEEP_O3 ON)` (and no
# precompiled header).
#
# With ccache, set `ccache -o sloppiness=pch_defines,time_macros` (the
# README's build notes) or those files are compiled without the cache.
option(TANDEM_PCH "Precompile the common headers" ON)

add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-pthread>)

set(TANDEM_PCH_HEADERS
  <algorithm> <atomic> <chrono> <condition_variable> <cstdint> <cstring>
  <deque> <fstream> <functional> <iostream> <map> <memory> <mutex>
  <optional> <set> <span> <sstream> <string> <string_view> <thread>
  <unordered_map> <utility> <variant> <vector>
  <absl/container/flat_hash_map.h> <absl/status/status.h>
  <absl/status/statusor.h> <absl/strings/str_cat.h>
  <absl/strings/str_format.h> <absl/synchronization/mutex.h>
  <absl/time/time.h> <google/protobuf/message.h> <grpcpp/grpcpp.h>)

# The optimization level of test files (appended, so it wins over -O3).
set(TANDEM_TEST_OPT $<$<OR:$<CONFIG:Release>,$<CONFIG:RelWithDebInfo>>:-O1>)

# tandem_enable_pch(): call once, after every component is added.
function(tandem_enable_pch)
  if(NOT TANDEM_PCH)
    return()
  endif()
  set(dir ${CMAKE_BINARY_DIR}/pch)
  file(WRITE ${dir}/pch_code.cc "// Holds Tandem's precompiled headers.\n")
  file(WRITE ${dir}/pch_test.cc "// Holds Tandem tests' precompiled headers.\n")
  add_library(tandem_pch_code STATIC ${dir}/pch_code.cc)
  target_link_libraries(tandem_pch_code PRIVATE gRPC::grpc++ protobuf::libprotobuf
    absl::status absl::strings absl::synchronization absl::time)
  target_precompile_headers(tandem_pch_code PRIVATE ${TANDEM_PCH_HEADERS})
  add_library(tandem_pch_test STATIC ${dir}/pch_test.cc)
  target_link_libraries(tandem_pch_test PRIVATE GTest::gtest GTest::gmock
    gRPC::grpc++ protobuf::libprotobuf absl::status absl::strings
    absl::synchronization absl::time)
  target_precompile_headers(tandem_pch_test PRIVATE ${TANDEM_PCH_HEADERS}
    <gtest/gtest.h> <gmock/gmock.h>)
  target_compile_options(tandem_pch_test PRIVATE ${TANDEM_TEST_OPT})

  _tandem_targets_under(${CMAKE_SOURCE_DIR} targets)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(NOT type MATCHES "^(STATIC_LIBRARY|SHARED_LIBRARY|OBJECT_LIBRARY|EXECUTABLE)$"
       OR t MATCHES "^tandem_pch_")
      continue()
    endif()
    get_target_property(sources ${t} SOURCES)
    set(cxx_only TRUE)
    foreach(s IN LISTS sources)
      if(s MATCHES "\\.(cu|c)$")
        set(cxx_only FALSE)
      endif()
    endforeach()
    if(NOT cxx_only)
      continue()
    endif()
    get_target_property(source_dir ${t} SOURCE_DIR)
    get_target_property(libs ${t} LINK_LIBRARIES)
    if(source_dir MATCHES "^${CMAKE_SOURCE_DIR}/(tests|bench)(/|$)" AND
       (libs MATCHES "GTest::|tandem_test_util" OR t STREQUAL "tandem_test_util"))
      # A header precompiled at -O1 must not meet an -O3 file (GCC 12
      # crashed on that mix): a TANDEM_TEST_KEEP_O3 target parses its own.
      get_target_property(keep_o3 ${t} TANDEM_TEST_KEEP_O3)
      if(NOT keep_o3)
        target_precompile_headers(${t} REUSE_FROM tandem_pch_test)
        target_compile_options(${t} PRIVATE ${TANDEM_TEST_OPT})
      endif()
    else()
      target_precompile_headers(${t} REUSE_FROM tandem_pch_code)
    endif()
  endforeach()
endfunction()

function(_tandem_targets_under dir out)
  get_property(here DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    _tandem_targets_under(${sub} below)
    list(APPEND here ${below})
  endforeach()
  set(${out} ${here} PARENT_SCOPE)
endfunction()
