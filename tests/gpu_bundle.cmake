# gpu_bundle.cmake - the bundle that the lent GPU machine runs (tools/gpu_bundle.sh, tools/gpu_check.sh): packed
# from this build (a fixture, so the two checks share one packing), run with Debian's Open MPI, hwloc, liburing,
# jansson and OpenBLAS hidden in a mount namespace, and gpu_check.sh's verdicts without a GPU and with an
# nvidia-smi that lists one. Each skips (77) naming why where the build has no CUDA backend or unshare fails.
# Not under the sanitizers: the bundle is a release artifact, and instrumented programs would carry the
# sanitizer runtimes into it and double the suite's longest packing for nothing the plain build does not show.
if(ZS_SANITIZE)
  return()
endif()
set(zs_bundle_check_dir ${CMAKE_CURRENT_BINARY_DIR}/gpu-bundle-check)
foreach(m pack masked fakegpu)
  add_test(NAME gpu_bundle_${m} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gpu_bundle.sh ${m} ${PROJECT_BINARY_DIR}
           ${zs_bundle_check_dir})
  file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/ompi-session/gpu_bundle_${m})
  # seconds each (packing gzips about 100 MB): 120 s is the backstop
  set_tests_properties(gpu_bundle_${m} PROPERTIES LABELS cuda SKIP_RETURN_CODE 77 TIMEOUT 120
    ENVIRONMENT "${ZS_TEST_ENV};OMPI_MCA_orte_tmpdir_base=${CMAKE_CURRENT_BINARY_DIR}/ompi-session/gpu_bundle_${m}")
endforeach()
set_tests_properties(gpu_bundle_pack PROPERTIES FIXTURES_SETUP zs_gpu_bundle)
set_tests_properties(gpu_bundle_masked gpu_bundle_fakegpu PROPERTIES FIXTURES_REQUIRED zs_gpu_bundle)
