# CMake generated Testfile for 
# Source directory: /work/main/tests/engine
# Build directory: /work/main/build/dev/tests/engine
# 
# This file includes the relevant testing commands required for 
# testing this directory and lists subdirectories to be tested as well.
include("/work/main/build/dev/tests/engine/engine_tests[1]_include.cmake")
