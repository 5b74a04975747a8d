# tests/scale_model.cmake - issue 27 (past one node): the model lane's tests, included from tests/CMakeLists.txt.
