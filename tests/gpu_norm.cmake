# gpu_norm.cmake - the gradient norm's fixed order (test_device.c holds its bits on every device) and its kept
# scratch on the emulated GPU; the stage-3 step's zero-fills of the device arena; zs-bench norm run small.

# the norm's scratch: kept from call to call, grown only for a larger launch, freed at the device's close
zs_emu_test(test_norm_emu test_norm.c)
target_include_directories(test_norm_emu BEFORE PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/cuda_emu)
add_test(NAME norm_cuda_emu COMMAND test_norm_emu)
set_tests_properties(norm_cuda_emu PROPERTIES TIMEOUT 60 LABELS "cuda;kernels;device")

# A stage-3 step zero-fills none of the gathered units it takes from the device arena (the all-gather writes
# them whole), on the separate CPU test device at 2 ranks and on the emulated GPU at 1.
zs_test(test_arena_zero)
add_test(NAME arena_zero_np2 COMMAND ${ZS_MPIRUN} 2 $<TARGET_FILE:test_arena_zero> separate)
zs_emu_test(test_arena_zero_emu test_arena_zero.c)
add_test(NAME arena_zero_cuda_emu_np1 COMMAND ${ZS_MPIRUN} 1 $<TARGET_FILE:test_arena_zero_emu> cuda)
foreach(t arena_zero_np2 arena_zero_cuda_emu_np1)
  file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/ompi-session/${t})
  set_tests_properties(${t} PROPERTIES TIMEOUT 120
    ENVIRONMENT "${ZS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${CMAKE_CURRENT_BINARY_DIR}/ompi-session/${t}")
endforeach()
# The arena's zero-fill read back through the device's copies on the emulated GPU (a block dirtied, given back and
# handed out again reads as zeros); `devmem` does the same on the separate CPU test device.
add_test(NAME arena_fill_cuda_emu COMMAND test_devmem_emu fill)
set_tests_properties(arena_fill_cuda_emu PROPERTIES TIMEOUT 60 LABELS "cuda;device"
                     ENVIRONMENT "${ZS_TEST_ENV}")
set_tests_properties(arena_zero_np2 PROPERTIES LABELS "device;comm")
set_tests_properties(arena_zero_cuda_emu_np1 PROPERTIES LABELS "cuda;device;comm")

# zs-bench norm, small: it runs, and the threaded norm keeps the reference's bits (its exit status)
add_test(NAME bench_norm_cpu COMMAND $<TARGET_FILE:zs-bench> norm --device cpu --size 1M --reps 3)
set_tests_properties(bench_norm_cpu PROPERTIES TIMEOUT 60 LABELS "bench;kernels")
