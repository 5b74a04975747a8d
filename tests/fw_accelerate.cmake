# fw_accelerate.cmake - zeroshard.accelerate against Accelerate (fw_accelerate.sh, fw_accelerate.py): the parity of
# the fortunes example under Accelerate's Accelerator and ZeroShard's at stages 0-3, save_state / load_state
# resumed bit for bit in a fresh job, and what ZeroShard does not do refused by name.
foreach(mode parity resume misuse)
  add_test(NAME fw_accelerate_${mode}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fw_accelerate.sh ${mode} $<TARGET_FILE_DIR:zeroshard>)
  set_tests_properties(fw_accelerate_${mode} PROPERTIES SKIP_RETURN_CODE 77)
endforeach()
