# fw_accelerate.cmake - Accelerate's own DeepSpeed path on ZeroShard under zeroshard-run, through
# examples/pytorch/fortunes_accelerate.py (fw_accelerate.sh, fw_accelerate.py): parity with plain Accelerate,
# gradient_clipping "auto", gather_for_metrics with drop_last, save_state / load_state in a fresh job.
foreach(mode parity clip gather resume cuda)
  add_test(NAME fw_accelerate_${mode}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fw_accelerate.sh ${mode} $<TARGET_FILE_DIR:zeroshard>)
  set_tests_properties(fw_accelerate_${mode} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
endforeach()
