# gpu_nccl.cmake - NCCL under the watchdog's deadline, its staging in fixed pieces, on the emulated NCCL (a GPU
# per rank). Included last from tests/CMakeLists.txt (zs_emu_test, ZS_MPIRUN and ZS_TEST_ENV are defined).
set(zs_gpu_nccl_tests)
# A rank that arrives after the deadline (stop; coll: through comm/coll.c's request; init: at NCCL's set-up)
# and an asynchronous NCCL error (async): the waiting rank's call fails naming the operation and the rank,
# within ZS_TIMEOUT=3; a hang is the ctest TIMEOUT.
zs_emu_test(test_nccl_deadline test_nccl_deadline.c)
foreach(c stop async coll init)
  add_test(NAME nccl_deadline_${c}_np2 COMMAND ${ZS_MPIRUN} 2 $<TARGET_FILE:test_nccl_deadline> ${c})
  list(APPEND zs_gpu_nccl_tests nccl_deadline_${c}_np2)
endforeach()
# A rank that exits before the all-gather (mpirun --enable-recovery keeps the job): the waiting rank names it
# within seconds, long before its 30 s timeout.
add_test(NAME nccl_deadline_die_np2 COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe --enable-recovery
         ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:test_nccl_deadline> die)
list(APPEND zs_gpu_nccl_tests nccl_deadline_die_np2)
# The ordered and nccl modes walking their chunks in many 4 KiB pieces of the staging buffer: the same bits.
add_test(NAME nccl_pieces_emu_np2 COMMAND ${ZS_MPIRUN} 2 $<TARGET_FILE:test_nccl_emu>)
list(APPEND zs_gpu_nccl_tests nccl_pieces_emu_np2)
# "auto" by the ranks' PCI bus ids: a GPU each though each rank sees one (per-rank CUDA_VISIBLE_DEVICES) takes
# NCCL; two ranks on one GPU keep the host-staged transport.
zs_emu_test(test_nccl_auto test_nccl_auto.c)
add_test(NAME nccl_auto_own_gpu_np2 COMMAND ${ZS_MPIRUN} 2 $<TARGET_FILE:test_nccl_auto> nccl)
add_test(NAME nccl_auto_shared_gpu_np2 COMMAND ${ZS_MPIRUN} 2 $<TARGET_FILE:test_nccl_auto> staged)
# hybrid sharding on GPUs of their own: no NCCL communicator nor staging buffer (its collectives are host-staged),
# none in the memory report or the estimate; "ordered" refused naming the key
add_test(NAME nccl_auto_hybrid_np2 COMMAND ${ZS_MPIRUN} 2 $<TARGET_FILE:test_nccl_auto> hybrid)
list(APPEND zs_gpu_nccl_tests nccl_auto_own_gpu_np2 nccl_auto_shared_gpu_np2 nccl_auto_hybrid_np2)

# TIMEOUT is only the backstop for a hang (the deadlines under test are ZS_TIMEOUT's): the slowest of these takes
# 10 s alone, most of it sleeps and deadlines, and a loaded machine stretches the rest; 60 s was crossed there.
foreach(t ${zs_gpu_nccl_tests})
  file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/ompi-session/${t})
  set_tests_properties(${t} PROPERTIES TIMEOUT 300 LABELS "cuda;comm"
    ENVIRONMENT "${ZS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${CMAKE_CURRENT_BINARY_DIR}/ompi-session/${t};ZS_CUDA_EMU_GPUS=2;ZS_CUDA_EMU_NCCL=1;ZS_TIMEOUT=3")
endforeach()
set_property(TEST nccl_deadline_async_np2 APPEND PROPERTY ENVIRONMENT ZS_CUDA_EMU_NCCL_FAULT=0:1)
set_property(TEST nccl_deadline_die_np2 APPEND PROPERTY ENVIRONMENT ZS_TIMEOUT=30)
# mpirun --enable-recovery exits 0 whatever the survivor returns: its summary line decides
set_tests_properties(nccl_deadline_die_np2 PROPERTIES PASS_REGULAR_EXPRESSION "nccl_deadline die: rank 0: [1-9][0-9]* passed, 0 failed")
set_property(TEST nccl_pieces_emu_np2 APPEND PROPERTY ENVIRONMENT ZS_TEST_NCCL_PIECE=4096)
# after the loop: ZS_CUDA_EMU_GPUS=1 replaces its 2
set_property(TEST nccl_auto_own_gpu_np2 APPEND PROPERTY ENVIRONMENT ZS_CUDA_EMU_GPUS=1 ZS_CUDA_EMU_BUS=local)
set_property(TEST nccl_auto_shared_gpu_np2 APPEND PROPERTY ENVIRONMENT ZS_CUDA_EMU_GPUS=1)

# NCCL's set-up when one rank cannot take part (tests/test_nccl_boot.c): rank 0's ncclGetUniqueId fails, or rank 1's
# staging cudaMalloc; "auto" keeps the host-staged transport on every rank, "ordered" fails on every rank naming the
# rank that failed, well within ZS_TIMEOUT=120 (before, the peers waited out the deadline); the same with NCCL < 2.14's
# blocking set-up (ZS_CUDA_EMU_NCCL_OLD=1), which has no deadline, and its set-up where nothing fails.
zs_emu_test(test_nccl_boot test_nccl_boot.c)
set(zs_nccl_boot_tests)
foreach(c id_auto id_ordered stage_auto stage_ordered stage_ordered_old none_auto_old)
  string(REPLACE "_" ";" args ${c})
  list(GET args 0 which)
  list(GET args 1 mode)
  add_test(NAME nccl_boot_${c}_np2 COMMAND ${ZS_MPIRUN} 2 $<TARGET_FILE:test_nccl_boot> ${which} ${mode})
  file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/ompi-session/nccl_boot_${c}_np2)
  set_tests_properties(nccl_boot_${c}_np2 PROPERTIES TIMEOUT 300 LABELS "cuda;comm"
    ENVIRONMENT "${ZS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${CMAKE_CURRENT_BINARY_DIR}/ompi-session/nccl_boot_${c}_np2;ZS_CUDA_EMU_GPUS=2;ZS_CUDA_EMU_NCCL=1;ZS_TIMEOUT=120")
  if(c MATCHES "_old$")
    set_property(TEST nccl_boot_${c}_np2 APPEND PROPERTY ENVIRONMENT ZS_CUDA_EMU_NCCL_OLD=1)
  endif()
endforeach()

# nccl.h from a plain directory (NCCL's pip wheel: `ncclGroupStart();`) under -Werror: a scratch configure and
# comm/comm_nccl.c alone, so it fails where CMake includes the header as a normal one.
if(ZS_HAVE_CUDA)
  add_test(NAME nccl_header COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/nccl_header.sh ${PROJECT_SOURCE_DIR}
           ${ZS_NCCL_INCLUDE_DIR})
  set_tests_properties(nccl_header PROPERTIES TIMEOUT 120 LABELS cuda SKIP_RETURN_CODE 77)
endif()
