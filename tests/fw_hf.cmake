# fw_hf.cmake - the Hugging Face Trainer's own DeepSpeed integration on ZeroShard under zeroshard-run, through
# examples/pytorch/fortunes_hf.py (fw_hf.sh, fw_hf.py)
foreach(mode parity ckpt config cuda)
  add_test(NAME fw_hf_${mode} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fw_hf.sh ${mode} $<TARGET_FILE_DIR:zeroshard>)
  set_tests_properties(fw_hf_${mode} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
endforeach()
