/* cuda_launch.h - ZS_LAUNCH(kernel, grid, threads, stream)(args...), the one spelling of a kernel launch in
 * the .cu files of kernels/: kernel<<<grid, threads, 0, stream>>>(args...) under nvcc, and tests/cuda_emu's launcher when
 * a host compiler builds the file against that CPU stand-in (which defines ZS_KERNEL first), so CI runs the
 * kernels where no GPU is. */
#ifndef ZS_CUDA_LAUNCH_H
#define ZS_CUDA_LAUNCH_H

#ifndef ZS_KERNEL
#define ZS_KERNEL(kernel, grid, threads, stream) kernel<<<(grid), (threads), 0, (stream)>>>
#endif

/* The thread's last error is cleared first: a launch reports its error only through cudaGetLastError, which
 * would otherwise also return what any earlier call on the thread left there (a not-ready cudaEventQuery, a
 * refused cudaHostRegister), and the launch would fail for it. A fault that broke the context stays. */
#define ZS_LAUNCH(kernel, grid, threads, stream) (void)cudaGetLastError(), ZS_KERNEL(kernel, grid, threads, stream)

#endif /* ZS_CUDA_LAUNCH_H */
