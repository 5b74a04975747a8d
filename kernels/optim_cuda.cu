/* optim_cuda.cu - the optimizer kernels on a GPU: every tensor of a launch in one kernel (up to
 * ZS_CUDA_TENSORS per kernel), each element through optim_elem.h, the bodies the CPU kernels use. Built
 * with --fmad=false -prec-div=true -prec-sqrt=true -ftz=false (CMakeLists.txt), so an element gets the CPU
 * scalar reference's bits; tests/test_device.c holds them equal. */
#include <cuda_runtime.h>

#include "cuda_launch.h" /* defines: ZS_LAUNCH */
#include "optim_elem.h" /* defines: zs_adam_elem, zs_sgd_elem, zs_lion_elem, zs_adagrad_elem */
#include "optim_launch.h" /* defines: struct zs_optim_launch, zs_cuda_optim_launch */

/* The tensor list travels by value as the kernel's parameter (under the 4 KiB every GPU accepts), so a
 * launch needs no device allocation and no copy of its own. */
#define ZS_CUDA_TENSORS 32
enum { THREADS = 256, PER_THREAD = 4, BLOCK_ELEMS = THREADS * PER_THREAD };

struct tensor_arg {
    void *param;
    const void *grad;
    float *master, *s1, *s2;
    int64_t n;
    int64_t first_block; /* the tensor's first block in the grid */
};

struct launch_arg {
    struct zs_optim_step s;
    int32_t count;
    struct tensor_arg t[ZS_CUDA_TENSORS];
};

__device__ __forceinline__ float load_elem(const void *p, int64_t i, int dt)
{
    if (dt == ZS_DTYPE_BF16)
        return zs_cvt_bf16_f32(((const uint16_t *)p)[i]);
    if (dt == ZS_DTYPE_FP16)
        return zs_cvt_f16_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* One element, as the CPU template's loop body does it: the fp32 value (the master of a 16-bit parameter)
 * is updated, then a 16-bit working copy rounded from it. The state goes through registers. */
template <int OPT, int PDT, int GDT>
__device__ __forceinline__ void optim_elem(const struct zs_optim_step *s, const struct tensor_arg &t, int64_t i)
{
    float *master = PDT == ZS_DTYPE_FP32 ? (float *)t.param : t.master;
    float gi = load_elem(t.grad, i, GDT), p = master[i], r, a = 0.0f, b = 0.0f;

    if (OPT == ZS_KOPT_ADAM || OPT == ZS_KOPT_ADAMW) {
        a = t.s1[i];
        b = t.s2[i];
        r = zs_adam_elem(s, gi, p, &a, &b, OPT == ZS_KOPT_ADAMW);
        t.s1[i] = a;
        t.s2[i] = b;
    } else if (OPT == ZS_KOPT_SGD) {
        int form = !t.s1 ? ZS_SGD_PLAIN : s->first ? ZS_SGD_FIRST : ZS_SGD_MOMENTUM;
        if (form == ZS_SGD_MOMENTUM)
            a = t.s1[i];
        r = zs_sgd_elem(s, gi, p, &a, form);
        if (form != ZS_SGD_PLAIN)
            t.s1[i] = a;
    } else {
        a = t.s1[i];
        r = OPT == ZS_KOPT_LION ? zs_lion_elem(s, gi, p, &a) : zs_adagrad_elem(s, gi, p, &a);
        t.s1[i] = a;
    }
    master[i] = r;
    if (PDT == ZS_DTYPE_BF16)
        ((uint16_t *)t.param)[i] = zs_cvt_f32_bf16(r);
    else if (PDT == ZS_DTYPE_FP16)
        ((uint16_t *)t.param)[i] = zs_cvt_f32_f16(r);
}

/* Each block takes BLOCK_ELEMS consecutive elements of one tensor, threads striding by THREADS so loads
 * coalesce; which tensor is a short scan of the list. */
template <int OPT, int PDT, int GDT>
__global__ void __launch_bounds__(THREADS) optim_kernel(const struct launch_arg a)
{
    int64_t blk = blockIdx.x;
    int32_t k = 0;

    while (k + 1 < a.count && blk >= a.t[k + 1].first_block)
        k++;
    const struct tensor_arg &t = a.t[k];
    int64_t base = (blk - t.first_block) * BLOCK_ELEMS + threadIdx.x;
    for (int j = 0; j < PER_THREAD; j++) {
        int64_t i = base + (int64_t)j * THREADS;
        if (i < t.n)
            optim_elem<OPT, PDT, GDT>(&a.s, t, i);
    }
}

typedef void (*kernel_fn)(const struct launch_arg);

template <int OPT>
static kernel_fn pick_dtypes(int pdt, int gdt)
{
    if (pdt == ZS_DTYPE_FP32 && gdt == ZS_DTYPE_FP32)
        return optim_kernel<OPT, ZS_DTYPE_FP32, ZS_DTYPE_FP32>;
    if (pdt == ZS_DTYPE_BF16)
        return gdt == ZS_DTYPE_BF16 ? optim_kernel<OPT, ZS_DTYPE_BF16, ZS_DTYPE_BF16>
                                    : gdt == ZS_DTYPE_FP32 ? optim_kernel<OPT, ZS_DTYPE_BF16, ZS_DTYPE_FP32> : NULL;
    if (pdt == ZS_DTYPE_FP16)
        return gdt == ZS_DTYPE_FP16 ? optim_kernel<OPT, ZS_DTYPE_FP16, ZS_DTYPE_FP16>
                                    : gdt == ZS_DTYPE_FP32 ? optim_kernel<OPT, ZS_DTYPE_FP16, ZS_DTYPE_FP32> : NULL;
    return NULL;
}

static kernel_fn pick(int opt, int pdt, int gdt)
{
    switch (opt) {
    case ZS_KOPT_ADAM: return pick_dtypes<ZS_KOPT_ADAM>(pdt, gdt);
    case ZS_KOPT_ADAMW: return pick_dtypes<ZS_KOPT_ADAMW>(pdt, gdt);
    case ZS_KOPT_SGD: return pick_dtypes<ZS_KOPT_SGD>(pdt, gdt);
    case ZS_KOPT_LION: return pick_dtypes<ZS_KOPT_LION>(pdt, gdt);
    case ZS_KOPT_ADAGRAD: return pick_dtypes<ZS_KOPT_ADAGRAD>(pdt, gdt);
    }
    return NULL;
}

/* Empty tensors are left out; a list longer than ZS_CUDA_TENSORS, or whose tensors change step (parameter
 * groups), goes in several kernels on the stream. */
extern "C" int zs_cuda_optim_launch(const struct zs_optim_launch *l, void *stream)
{
    kernel_fn fn = pick(l->opt, l->pdt, l->gdt);
    struct launch_arg a;
    int32_t i = 0;

    if (!fn)
        return (int)cudaErrorInvalidValue;
    while (i < l->count) {
        const struct zs_optim_step *s = NULL; /* one kernel per run of tensors with the same step */
        int64_t blocks = 0;
        a.count = 0;
        for (; i < l->count && a.count < ZS_CUDA_TENSORS; i++) {
            const struct zs_optim_tensor *t = &l->t[i];
            if (t->n <= 0)
                continue;
            if (s && s != (t->step ? t->step : l->step))
                break;
            s = t->step ? t->step : l->step;
            a.t[a.count] = (struct tensor_arg){ t->bufs.param, t->bufs.grad, t->bufs.master, t->bufs.s1, t->bufs.s2,
                                                t->n, blocks };
            blocks += (t->n + BLOCK_ELEMS - 1) / BLOCK_ELEMS;
            a.count++;
        }
        if (!a.count)
            break;
        if (blocks > 0x7fffffff)
            return (int)cudaErrorInvalidConfiguration;
        a.s = *s;
        ZS_LAUNCH(fn, (unsigned)blocks, THREADS, (cudaStream_t)stream)(a);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            return (int)e;
    }
    return 0;
}
