# tests/scale_hybrid.cmake - issue 27 (past one node): the hybrid lane's tests, included from tests/CMakeLists.txt.
# Hybrid sharding at 4 ranks on 2 forced nodes, shard groups of 2: memory, deterministic and normal mode
# against flat, checkpoints across layouts, refusals (tests/hybrid_mlp.sh).
add_test(NAME hybrid_mlp COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/hybrid_mlp.sh $<TARGET_FILE:zs-train-mlp>
         $<TARGET_FILE:zs-params-cmp> $<TARGET_FILE:zs-estimate>)
# included after tests/CMakeLists.txt's blanket settings: the same environment and session directory here
file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/ompi-session/hybrid_mlp)
set_tests_properties(hybrid_mlp PROPERTIES TIMEOUT 600 ENVIRONMENT
                     "${ZS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${CMAKE_CURRENT_BINARY_DIR}/ompi-session/hybrid_mlp")

# ZeRO++ hpZ (zero_hpz_partition_size 2) at 4 ranks on 2 forced nodes: the flat run's bits, the memory term, the
# traffic moved inside the node, checkpoints and refusals (tests/hpz_mlp.sh). The optimized pass only: the C paths
# it takes are hpz_reload's too (hpz_reload_separate in both passes, hpz_reload on host memory in the sanitizers').
if(NOT ZS_SANITIZE)
  add_test(NAME hpz_mlp COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/hpz_mlp.sh $<TARGET_FILE:zs-train-mlp>
           $<TARGET_FILE:zs-estimate>)
  file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/ompi-session/hpz_mlp)
  set_tests_properties(hpz_mlp PROPERTIES TIMEOUT 600 ENVIRONMENT
                       "${ZS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${CMAKE_CURRENT_BINARY_DIR}/ompi-session/hpz_mlp")
  set_property(TEST hpz_mlp APPEND PROPERTY LABELS sharding) # (zs_label_all has no ^hpz_ line yet)
endif()

# hpZ's secondary copy after a checkpoint load and a parameter write in the middle of a run (tests/hpz_reload.c),
# on the separate test device (CPU memory the host can only copy, late copies: the slices in the device arena, the
# secondary group's gathers host-staged) in both passes; on host memory in the sanitizer pass (the optimized pass
# runs that path in hpz_mlp)
zs_test(hpz_reload)
set(hpz_reload_runs hpz_reload_separate)
if(ZS_SANITIZE)
  list(APPEND hpz_reload_runs hpz_reload)
endif()
foreach(t ${hpz_reload_runs})
  if(t STREQUAL hpz_reload_separate)
    add_test(NAME ${t} COMMAND ${ZS_MPIRUN} 4 -x ZS_FAKE_NODE_SIZE=2 -x ZS_TEST_DEVICE=separate $<TARGET_FILE:hpz_reload>)
  else()
    add_test(NAME ${t} COMMAND ${ZS_MPIRUN} 4 -x ZS_FAKE_NODE_SIZE=2 $<TARGET_FILE:hpz_reload>)
  endif()
  file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/ompi-session/${t})
  set_tests_properties(${t} PROPERTIES TIMEOUT 600 ENVIRONMENT
                       "${ZS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${CMAKE_CURRENT_BINARY_DIR}/ompi-session/${t}")
  set_property(TEST ${t} APPEND PROPERTY LABELS sharding ckpt)
endforeach()

# The sum across shard groups failing on one rank (a comm fault on its replica comm): the step names the sum and
# the failed request is back in the pool, not left in flight (tests/hybrid_sum_fault.c). The fault is a failing
# MPI call: its replica peers end at the comm's timeout, short here (only rank 2's outcome is checked).
zs_test(hybrid_sum_fault)
add_test(NAME hybrid_sum_fault COMMAND ${ZS_MPIRUN} 4 -x ZS_FAKE_NODE_SIZE=2 -x ZS_TIMEOUT=10
         $<TARGET_FILE:hybrid_sum_fault>)
file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/ompi-session/hybrid_sum_fault)
set_tests_properties(hybrid_sum_fault PROPERTIES TIMEOUT 600 LABELS sharding ENVIRONMENT
                     "${ZS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${CMAKE_CURRENT_BINARY_DIR}/ompi-session/hybrid_sum_fault")

# More than two replicas without network namespaces: 6 and 8 ranks on forced nodes of 2, shard groups of 2 (3 and 4
# replicas), normal mode at stages 1 and 3 within 1e-5 of the flat run at the same ranks (tests/hybrid_replicas.sh);
# at 2x2 the replicas' all-reduce count equals the group's share, so a mix-up of the two shows only here or in netns4.
add_test(NAME hybrid_replicas COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/hybrid_replicas.sh $<TARGET_FILE:zs-train-mlp>
         $<TARGET_FILE:zs-params-cmp>)
file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/ompi-session/hybrid_replicas)
set_tests_properties(hybrid_replicas PROPERTIES TIMEOUT 600 LABELS sharding ENVIRONMENT
                     "${ZS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${CMAKE_CURRENT_BINARY_DIR}/ompi-session/hybrid_replicas")
