# tests/scale_hybrid.cmake - issue 27 (past one node): the hybrid lane's tests, included from tests/CMakeLists.txt.
