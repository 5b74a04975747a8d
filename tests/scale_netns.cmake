# tests/scale_netns.cmake - issue 27 (past one node): the netns lane's tests, included from tests/CMakeLists.txt.
# 4 nodes x 2 ranks in network namespaces on a bridge: the oracle across nodes, the layout Open MPI and
# ZeroShard see, a node lost mid-run named, and the hybrid / quantized configs (SKIP while refused).
add_test(NAME netns4 COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/netns4.sh $<TARGET_FILE:zs-train-mlp>
         $<TARGET_FILE:zs-params-cmp> $<TARGET_FILE:zs-config-check>)
# included after tests/CMakeLists.txt's blanket settings: the test environment (mpirun as root, leak checks
# off under ASan, its own Open MPI session directory) set here
file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/ompi-session/netns4)
set_tests_properties(netns4 PROPERTIES TIMEOUT 420 SKIP_RETURN_CODE 77
  ENVIRONMENT "${ZS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${CMAKE_CURRENT_BINARY_DIR}/ompi-session/netns4")
