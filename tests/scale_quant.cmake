# tests/scale_quant.cmake - issue 27 (past one node): the quant lane's tests, included from tests/CMakeLists.txt.
