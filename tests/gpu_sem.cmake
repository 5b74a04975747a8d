# gpu_sem.cmake - CUDA's error and device semantics in tests/cuda_emu, and the engine where they decide the
# outcome. Included at the end of tests/CMakeLists.txt, so each test sets its own environment, deadline and labels.

# the emulator's semantics themselves: per-thread last error and current device, a refused pin, an operation
# that waits for a condition, a sticky kernel fault (no MPI)
add_executable(test_cuda_emu_sem test_cuda_emu_sem.cpp cuda_emu/emu_runtime.cpp cuda_emu/emu_memory.cpp)
set_target_properties(test_cuda_emu_sem PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON)
target_include_directories(test_cuda_emu_sem BEFORE PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/cuda_emu)
target_include_directories(test_cuda_emu_sem PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(test_cuda_emu_sem PRIVATE -Wall -Wextra -Wno-unused-parameter)
if(ZS_WERROR)
  target_compile_options(test_cuda_emu_sem PRIVATE -Werror)
endif()
if(ZS_SANITIZE)
  target_compile_options(test_cuda_emu_sem PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer)
  target_link_options(test_cuda_emu_sem PRIVATE -fsanitize=address,undefined)
endif()
target_link_libraries(test_cuda_emu_sem PRIVATE Threads::Threads)
add_test(NAME cuda_emu_sem COMMAND test_cuda_emu_sem)

# test_devmem's GPU case on the emulated GPU, with a pin refused on purpose and steps after it
zs_emu_test(test_devmem_emu test_devmem.c)
add_test(NAME devmem_cuda_emu_np2 COMMAND ${ZS_MPIRUN} 2 $<TARGET_FILE:test_devmem_emu> cuda emu)

# the engine: stage 3 with overlap_comm (not-ready event queries, then kernels), steps from another thread on
# the rank's own GPU, a kernel fault reported
zs_emu_test(test_cuda_sem test_cuda_sem.c)
add_test(NAME cuda_sem_overlap_np2 COMMAND ${ZS_MPIRUN} 2 $<TARGET_FILE:test_cuda_sem> overlap)
add_test(NAME cuda_sem_thread_np2 COMMAND ${ZS_MPIRUN} 2 -x ZS_CUDA_EMU_GPUS=2 $<TARGET_FILE:test_cuda_sem> thread)
# the same over the emulated NCCL (comm/comm_nccl.c's own runtime calls, its stream and staging on the rank's GPU)
add_test(NAME cuda_sem_thread_nccl_np2 COMMAND ${ZS_MPIRUN} 2 -x ZS_CUDA_EMU_GPUS=2 -x ZS_CUDA_EMU_NCCL=1
         $<TARGET_FILE:test_cuda_sem> thread)
add_test(NAME cuda_sem_fault_np1 COMMAND ${ZS_MPIRUN} 1 $<TARGET_FILE:test_cuda_sem> fault)
# what include/zeroshard.h documents about the calling thread's current device: each rank on its own GPU, the other
# one current before each call; the rank's GPU after zs_init and the calls that work on the GPU, unchanged after
# the queries
target_include_directories(test_cuda_sem BEFORE PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/cuda_emu)
add_test(NAME cuda_sem_current_np2 COMMAND ${ZS_MPIRUN} 2 -x ZS_CUDA_EMU_GPUS=2 $<TARGET_FILE:test_cuda_sem> current)

foreach(t cuda_emu_sem devmem_cuda_emu_np2 cuda_sem_overlap_np2 cuda_sem_thread_np2 cuda_sem_thread_nccl_np2
          cuda_sem_fault_np1 cuda_sem_current_np2)
  file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/ompi-session/${t})
  set_tests_properties(${t} PROPERTIES TIMEOUT 120 LABELS "cuda;device"
    ENVIRONMENT "${ZS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${CMAKE_CURRENT_BINARY_DIR}/ompi-session/${t}")
endforeach()
