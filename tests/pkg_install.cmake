# pkg_install.cmake - the package as pip installs it: `pip install ./python` into a fresh venv builds
# libzeroshard into the package, and examples/pytorch/fortunes_fabric.py runs on it under mpirun with no
# ZEROSHARD_LIB and no build tree (pkg_install.sh); 77 (skip) without torch, lightning, transformers,
# scikit-build-core or python3 -m venv.
add_test(NAME pkg_install COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/pkg_install.sh)
set_tests_properties(pkg_install PROPERTIES SKIP_RETURN_CODE 77)
