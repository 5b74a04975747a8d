# tests/scale_hybrid.cmake - issue 27 (past one node): the hybrid lane's tests, included from tests/CMakeLists.txt.
# Hybrid sharding at 4 ranks on 2 forced nodes, shard groups of 2: memory, deterministic and normal mode
# against flat, checkpoints across layouts, refusals (tests/hybrid_mlp.sh).
add_test(NAME hybrid_mlp COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/hybrid_mlp.sh $<TARGET_FILE:zs-train-mlp>
         $<TARGET_FILE:zs-params-cmp> $<TARGET_FILE:zs-estimate>)
# included after tests/CMakeLists.txt's blanket settings: the same environment and session directory here
file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/ompi-session/hybrid_mlp)
set_tests_properties(hybrid_mlp PROPERTIES TIMEOUT 600 ENVIRONMENT
                     "${ZS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${CMAKE_CURRENT_BINARY_DIR}/ompi-session/hybrid_mlp")
