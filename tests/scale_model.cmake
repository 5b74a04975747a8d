# tests/scale_model.cmake - issue 27 (past one node): the model lane's tests, included from tests/CMakeLists.txt.
# The step-time model (zs-estimate --time) against hand-computed cases, its orderings, and bad options.
add_test(NAME scale_model COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/scale_model.py $<TARGET_FILE:zs-estimate>)
set_tests_properties(scale_model PROPERTIES TIMEOUT 60 ENVIRONMENT "${ZS_TEST_ENV}")
