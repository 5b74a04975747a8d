/* quant_cuda_emu.cpp (tests/cuda_emu) - kernels/quant_cuda.cu compiled by the host C++ compiler against the CUDA
 * stand-ins of this directory (-ffp-contract=off, as nvcc's --fmad=false), for the tests that run the CUDA
 * backend on the CPU. */
#include "../../kernels/quant_cuda.cu"
