# tests/scale_netns.cmake - issue 27 (past one node): the netns lane's tests, included from tests/CMakeLists.txt.
