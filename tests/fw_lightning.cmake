# fw_lightning.cmake - the Lightning Trainer on ZeroShard (zeroshard.lightning.ZeroShardStrategy through
# examples/pytorch/fortunes_lightning.py): parity with ddp, a checkpoint resumed bit for bit, the rest of the
# strategy (misuse named, epoch schedulers, configure_model at stage 3, trainer.save_checkpoint).
foreach(mode parity resume surface cuda)
  add_test(NAME fw_lightning_${mode}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fw_lightning.sh ${mode} $<TARGET_FILE_DIR:zeroshard>)
  set_tests_properties(fw_lightning_${mode} PROPERTIES SKIP_RETURN_CODE 77)
endforeach()
