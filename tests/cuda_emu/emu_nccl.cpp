/* emu_nccl.cpp (tests/cuda_emu) - a stand-in for the few NCCL calls of comm/comm_nccl.c, over MPI, for the
 * emulated GPUs of emu_runtime.cpp: what nccl.h's dlopen/dlsym hand comm_nccl.c when ZS_CUDA_EMU_NCCL=1 (with
 * ZS_CUDA_EMU_GPUS=N, so ranks on one host get GPUs of their own, as NCCL requires). An operation is queued
 * on its stream like a kernel and that stream is then run through it at once, so every rank meets it in
 * program order, as a GPU's NCCL kernel would, and no rank blocks in MPI while a peer waits for it elsewhere;
 * the work it waits on (events) runs first, so a missing event still shows as stale data.
 * Limits: communicators are split from MPI_COMM_WORLD (every world rank must make one), sum in fp32 only for
 * ncclReduceScatter (MPI's order: the `nccl` mode is not bit-exact on a GPU either). */
#include "cuda_runtime.h"
#include "nccl.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <vector>

struct emu_nccl_comm {
    MPI_Comm mpi;
    int rank, size;
};

namespace {

struct p2p {
    bool send;
    void *buf;
    size_t bytes;
    int peer;
    ncclComm_t comm;
};

int group_depth;
std::vector<p2p> group_ops;
cudaStream_t group_stream;
bool group_bad;

size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    }
    return 0;
}

/* queued on s, then s run through it */
ncclResult_t launch(cudaStream_t s, std::function<void()> op)
{
    emu_enqueue(s, std::move(op));
    return cudaStreamSynchronize(s) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

ncclResult_t run_group(void)
{
    std::vector<p2p> ops;

    ops.swap(group_ops);
    if (group_bad) {
        group_bad = false;
        return ncclInvalidArgument;
    }
    if (ops.empty())
        return ncclSuccess;
    return launch(group_stream, [ops]() {
        std::vector<MPI_Request> req(ops.size());
        for (size_t k = 0; k < ops.size(); k++) {
            const p2p &o = ops[k];
            if (o.send)
                MPI_Isend(o.buf, (int)o.bytes, MPI_BYTE, o.peer, 0, o.comm->mpi, &req[k]);
            else
                MPI_Irecv(o.buf, (int)o.bytes, MPI_BYTE, o.peer, 0, o.comm->mpi, &req[k]);
        }
        MPI_Waitall((int)req.size(), req.data(), MPI_STATUSES_IGNORE);
    });
}

ncclResult_t add_p2p(bool send, const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                     cudaStream_t s)
{
    size_t bytes = count * type_size(t);

    if (!c || peer < 0 || peer >= c->size || bytes > 0x7fffffff || (bytes && !emu_device_visible(buf)))
        return ncclInvalidArgument;
    if (group_ops.empty())
        group_stream = s;
    else if (s != group_stream)
        group_bad = true; /* one stream per group here */
    group_ops.push_back(p2p{ send, (void *)buf, bytes, peer, c });
    return group_depth ? ncclSuccess : run_group();
}

ncclResult_t emu_get_unique_id(ncclUniqueId *id)
{
    memset(id, 0, sizeof(*id));
    snprintf(id->internal, sizeof(id->internal), "cuda_emu");
    return ncclSuccess;
}

ncclResult_t emu_comm_init_rank(ncclComm_t *out, int n, ncclUniqueId id, int rank)
{
    emu_nccl_comm *c = new emu_nccl_comm;

    *out = nullptr;
    MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &c->mpi);
    MPI_Comm_rank(c->mpi, &c->rank);
    MPI_Comm_size(c->mpi, &c->size);
    if (c->rank != rank || c->size != n) {
        fprintf(stderr, "cuda_emu: ncclCommInitRank: rank %d of %d, but MPI_COMM_WORLD has %d of %d\n", rank, n,
                c->rank, c->size);
        MPI_Comm_free(&c->mpi);
        delete c;
        return ncclInvalidArgument;
    }
    *out = c;
    return ncclSuccess;
}

ncclResult_t emu_comm_destroy(ncclComm_t c)
{
    if (!c)
        return ncclInvalidArgument;
    MPI_Comm_free(&c->mpi);
    delete c;
    return ncclSuccess;
}

ncclResult_t emu_reduce_scatter(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                                ncclComm_t c, cudaStream_t s)
{
    size_t bytes = count * 4;

    if (!c || t != ncclFloat32 || op != ncclSum || count > 0x7fffffff ||
        !emu_device_visible(send) || !emu_device_visible(recv))
        return ncclInvalidArgument;
    return launch(s, [=]() {
        std::vector<char> in((const char *)send, (const char *)send + bytes * (size_t)c->size); /* may alias recv */
        MPI_Reduce_scatter_block(in.data(), recv, (int)count, MPI_FLOAT, MPI_SUM, c->mpi);
    });
}

ncclResult_t emu_all_gather(const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t c,
                            cudaStream_t s)
{
    size_t bytes = count * type_size(t);

    if (!c || bytes > 0x7fffffff || !emu_device_visible(send) || !emu_device_visible(recv))
        return ncclInvalidArgument;
    return launch(s, [=]() {
        bool in_place = (const char *)send == (const char *)recv + bytes * (size_t)c->rank;
        MPI_Allgather(in_place ? MPI_IN_PLACE : send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, c->mpi);
    });
}

ncclResult_t emu_send(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s)
{
    return add_p2p(true, buf, count, t, peer, c, s);
}

ncclResult_t emu_recv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s)
{
    return add_p2p(false, buf, count, t, peer, c, s);
}

ncclResult_t emu_group_start(void)
{
    group_depth++;
    return ncclSuccess;
}

ncclResult_t emu_group_end(void)
{
    if (group_depth <= 0)
        return ncclInvalidArgument;
    return --group_depth ? ncclSuccess : run_group();
}

const char *emu_error_string(ncclResult_t r)
{
    return r == ncclSuccess ? "no error" : r == ncclInvalidArgument ? "invalid argument (cuda_emu)" : "error (cuda_emu)";
}

bool enabled(void)
{
    const char *e = getenv("ZS_CUDA_EMU_NCCL");

    return e && !strcmp(e, "1");
}

int handle; /* what dlopen hands out */

} // namespace

extern "C" void *zs_emu_nccl_open(const char *name)
{
    return enabled() && !strcmp(name, "libnccl.so.2") ? &handle : nullptr;
}

extern "C" void *zs_emu_nccl_sym(void *lib, const char *name)
{
    static const struct {
        const char *name;
        void *fn;
    } table[] = {
        { "ncclGetUniqueId", (void *)emu_get_unique_id }, { "ncclCommInitRank", (void *)emu_comm_init_rank },
        { "ncclCommDestroy", (void *)emu_comm_destroy }, { "ncclReduceScatter", (void *)emu_reduce_scatter },
        { "ncclAllGather", (void *)emu_all_gather }, { "ncclSend", (void *)emu_send }, { "ncclRecv", (void *)emu_recv },
        { "ncclGroupStart", (void *)emu_group_start }, { "ncclGroupEnd", (void *)emu_group_end },
        { "ncclGetErrorString", (void *)emu_error_string },
    };

    if (lib != &handle)
        return nullptr;
    for (const auto &t : table)
        if (!strcmp(t.name, name))
            return t.fn;
    return nullptr;
}
