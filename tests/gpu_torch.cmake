# gpu_torch.cmake - the GPU check's PyTorch stage (tools/gpu_check_torch.py, which tools/gpu_check.sh runs on a lent
# GPU machine) end to end on the CPU, with its comparison made to fail once; 77 (skip) without torch and
# transformers. Not under the sanitizers (an instrumented .so cannot be loaded into an uninstrumented python).
if(ZS_SANITIZE)
  return()
endif()
add_test(NAME gpu_check_torch_cpu COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gpu_check_torch.sh $<TARGET_FILE_DIR:zeroshard>)
file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/ompi-session/gpu_check_torch_cpu)
# about a minute on two cores of its own, CPU-bound: beside other work (tools/test_loaded.sh) it takes 2-3 times
# that and more, so the backstop is the suite's usual 600 s (180 s was crossed at a load average of 7)
set_tests_properties(gpu_check_torch_cpu PROPERTIES LABELS "python;tools" SKIP_RETURN_CODE 77 TIMEOUT 600
  ENVIRONMENT "${ZS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${CMAKE_CURRENT_BINARY_DIR}/ompi-session/gpu_check_torch_cpu")
