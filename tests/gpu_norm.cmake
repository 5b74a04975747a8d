# gpu_norm.cmake - the gradient norm's fixed order (test_device.c holds its bits on every device) and its kept
# scratch on the emulated GPU; the stage-3 step's zero-fills of the device arena; zs-bench norm run small.

# the norm's scratch: kept from call to call, grown only for a larger launch, freed at the device's close
zs_emu_test(test_norm_emu test_norm.c)
target_include_directories(test_norm_emu BEFORE PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/cuda_emu)
add_test(NAME norm_cuda_emu COMMAND test_norm_emu)
set_tests_properties(norm_cuda_emu PROPERTIES TIMEOUT 60 LABELS "cuda;kernels;device")

