# tests/scale_hybrid.cmake - issue 27 (past one node): the hybrid lane's tests, included from tests/CMakeLists.txt.
# Hybrid sharding at 4 ranks on 2 forced nodes, shard groups of 2: memory, deterministic and normal mode
# against flat, checkpoints across layouts, refusals (tests/hybrid_mlp.sh).
add_test(NAME hybrid_mlp COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/hybrid_mlp.sh $<TARGET_FILE:zs-train-mlp>
         $<TARGET_FILE:zs-params-cmp> $<TARGET_FILE:zs-estimate>)
