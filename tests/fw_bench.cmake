# fw_bench.cmake - bench/fortunes_table.py (the walk-through's table) run briefly on two rows; tests/fw_bench.sh
add_test(NAME fw_bench_smoke COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fw_bench.sh smoke $<TARGET_FILE_DIR:zeroshard>)
set_tests_properties(fw_bench_smoke PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 180)
