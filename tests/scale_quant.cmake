# tests/scale_quant.cmake - issue 27 (past one node): the quant lane's tests, included from tests/CMakeLists.txt.
# The block-quantization kernels: the fast path against the scalar reference bit for bit, and the bound.
zs_test(test_quant)
add_test(NAME quant_kernels COMMAND test_quant)
# The traffic counter (zs_traffic, the examples' traffic line) on a flat stage-3 run at 4 ranks in two forced
# nodes, and with every peer over MPI, against the bytes the algorithm must send, derived from the model.
add_test(NAME quant_traffic COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/quant_traffic.sh $<TARGET_FILE:zs-train-mlp>)
# The quantized collectives (comm/comm_quant.h) at 4 ranks in one run: two forced nodes of 2 (all-gather bits,
# reduce-scatter within the bound, bytes across), one node (comm.h's exact bits), and unequal nodes refused.
zs_test(test_quant_comm)
add_test(NAME quant_comm_np4 COMMAND ${ZS_MPIRUN} 4 $<TARGET_FILE:test_quant_comm>)
# zs-bench quant at a tiny size: the subcommand runs and its fast path keeps the reference's bits (no timing asserted).
add_test(NAME quant_bench COMMAND $<TARGET_FILE:zs-bench> quant --size 64K --reps 2 --block 100)
# tests/CMakeLists.txt gives every test it knows its environment (ZS_TEST_ENV: mpirun as root, no leak check of
# MPI's own allocations under ASan) and an Open MPI session directory before this file is included: the same here.
set(quant_tests quant_kernels quant_traffic quant_comm_np4 quant_bench)
foreach(t ${quant_tests})
  set(base ${CMAKE_CURRENT_BINARY_DIR}/ompi-session/${t})
  file(MAKE_DIRECTORY ${base})
  set_tests_properties(${t} PROPERTIES ENVIRONMENT "${ZS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${base}" TIMEOUT 600)
endforeach()
# ZeRO++'s keys in the engine: quantized stage 3 within 2e-2 of the unquantized loss and a quarter of its
# cross-node bytes at two forced nodes, the exact run's bits on one node, and a stage that does not apply refused.
add_test(NAME quant_engine COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/quant_engine.sh $<TARGET_FILE:zs-train-mlp>)
set(base ${CMAKE_CURRENT_BINARY_DIR}/ompi-session/quant_engine)
file(MAKE_DIRECTORY ${base})
set_tests_properties(quant_engine PROPERTIES ENVIRONMENT "${ZS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${base}" TIMEOUT 600)
# A parameter shard that one rank cannot read from NVMe, with and without quantized weights at two forced nodes:
# the other ranks end the fetch naming that rank at once, the quantized gather's phases too (not at the timeout).
add_test(NAME quant_fault COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/quant_fault.sh $<TARGET_FILE:zs-train-mlp>)
set(base ${CMAKE_CURRENT_BINARY_DIR}/ompi-session/quant_fault)
file(MAKE_DIRECTORY ${base})
set_tests_properties(quant_fault PROPERTIES ENVIRONMENT "${ZS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${base}" TIMEOUT 600)
