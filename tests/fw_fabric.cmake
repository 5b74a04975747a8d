# fw_fabric.cmake - Lightning Fabric on ZeroShard (tests/fw_fabric.sh): the fortunes example under ddp and
# stages 0-3, resume from fabric.save in a fresh process, LoRA, misuse; skipped without lightning.
add_test(NAME fw_fabric COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fw_fabric.sh all $<TARGET_FILE_DIR:zeroshard>)
set_tests_properties(fw_fabric PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
