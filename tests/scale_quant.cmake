# tests/scale_quant.cmake - issue 27 (past one node): the quant lane's tests, included from tests/CMakeLists.txt.
# The block-quantization kernels: the fast path against the scalar reference bit for bit, and the bound.
zs_test(test_quant)
add_test(NAME quant_kernels COMMAND test_quant)
