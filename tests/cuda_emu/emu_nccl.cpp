/* emu_nccl.cpp (tests/cuda_emu) - a stand-in for the few NCCL calls of comm/comm_nccl.c, over MPI, for the
 * emulated GPUs of emu_runtime.cpp: what nccl.h's dlopen/dlsym hand comm_nccl.c when ZS_CUDA_EMU_NCCL=1 (with
 * ZS_CUDA_EMU_GPUS=N, so ranks on one host get GPUs of their own, as NCCL requires). As on a GPU, a call only
 * queues the operation on its stream and returns; when the stream reaches it, its MPI part is posted
 * (nonblocking), and the stream moves past it only once that completes, that is once every rank has reached
 * it: a stopped or dead peer hangs whoever synchronizes, and only ncclCommAbort ends the wait. MPI is called
 * from the thread that runs the queue, the one that synchronizes or queries (MPI_THREAD_FUNNELED suffices).
 * Data passes through buffers of the operation's own, so an aborted one never writes into freed memory.
 * Knobs: ZS_CUDA_EMU_NCCL_FAULT=R:N makes world rank R's N-th operation fail asynchronously (ncclRemoteError
 * from ncclCommGetAsyncError; the operation never completes), as a peer's or the network's failure does.
 * ZS_CUDA_EMU_NCCL_ID_FAIL=R makes world rank R's ncclGetUniqueId fail (ncclSystemError), as it does where
 * NCCL finds no usable network interface. ZS_CUDA_EMU_NCCL_OLD=1 hides ncclCommInitRankConfig, as NCCL older
 * than 2.14 lacks it: the communicator is then a blocking one, whose set-up waits for every rank. Each is read
 * at the call, so a test may set it late or on one rank only.
 * Limits: communicators are duplicated from MPI_COMM_WORLD (every world rank must make one), sum in fp32 only
 * for ncclReduceScatter (MPI's order: the `nccl` mode is not bit-exact on a GPU either). */
#include "cuda_runtime.h"
#include "nccl.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <memory>
#include <vector>

struct emu_nccl_comm {
    MPI_Comm mpi = MPI_COMM_NULL;
    int rank = 0, size = 0;
    MPI_Request init = MPI_REQUEST_NULL; /* the non-blocking init's duplicate, until it completes */
    bool blocking = true;
    bool aborted = false;
    ncclResult_t async = ncclSuccess;    /* what ncclCommGetAsyncError says */
};

namespace {

/* One operation's MPI requests and its own copies of the data. */
struct pending {
    std::vector<MPI_Request> req;
    std::vector<char> in, out;
    bool posted = false;
};

/* Kept for the life of the process: an aborted operation's requests may still complete into its buffers, and
 * its queued lambdas still name its communicator. */
std::vector<std::shared_ptr<pending>> orphans;
std::vector<std::unique_ptr<emu_nccl_comm>> comms;

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
long long launched; /* operations this process has queued, for the fault knob */
unsigned long long inits; /* communicators this process has begun to make (zs_emu_nccl_inits) */

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

bool fault_here(void)
{
    const char *e = getenv("ZS_CUDA_EMU_NCCL_FAULT");
    int r = -1, me = -1;
    long long n = 0;

    if (!e || sscanf(e, "%d:%lld", &r, &n) != 2)
        return false;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    return r == me && n == launched;
}

/* Queued on s: when the stream reaches it, post() starts its MPI part; the stream moves past it once that
 * completes (or the communicator is aborted), and land() copies the result out. */
ncclResult_t launch(ncclComm_t c, cudaStream_t s, std::function<void(pending &)> post,
                    std::function<void(pending &)> land)
{
    auto p = std::make_shared<pending>();
    bool fault;

    if (c->aborted || c->init != MPI_REQUEST_NULL)
        return ncclInvalidUsage;
    launched++;
    fault = fault_here();
    emu_enqueue_until(s, [c, p, post, fault]() {
        int flag = 0;
        if (c->aborted)
            return true;
        if (!p->posted) {
            post(*p);
            p->posted = true;
            if (fault)
                c->async = ncclRemoteError;
        }
        if (c->async != ncclSuccess && c->async != ncclInProgress)
            return false; /* failed: never completes, as NCCL's kernel would not */
        MPI_Testall((int)p->req.size(), p->req.data(), &flag, MPI_STATUSES_IGNORE);
        return flag != 0;
    }, [c, p, land]() {
        if (c->aborted)
            orphans.push_back(p);
        else
            land(*p);
    });
    if (c->blocking)
        return ncclSuccess;
    c->async = c->async == ncclSuccess ? ncclInProgress : c->async; /* queued in the background: poll */
    return ncclInProgress;
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
    auto post = [ops](pending &p) {
        size_t at = 0;
        for (const p2p &o : ops)
            at += o.bytes;
        p.in.resize(at);
        p.out.resize(at);
        p.req.resize(ops.size());
        at = 0;
        for (size_t k = 0; k < ops.size(); k++) {
            const p2p &o = ops[k];
            if (o.send) {
                memcpy(p.in.data() + at, o.buf, o.bytes);
                MPI_Isend(p.in.data() + at, (int)o.bytes, MPI_BYTE, o.peer, 0, o.comm->mpi, &p.req[k]);
            } else {
                MPI_Irecv(p.out.data() + at, (int)o.bytes, MPI_BYTE, o.peer, 0, o.comm->mpi, &p.req[k]);
            }
            at += o.bytes;
        }
    };
    auto land = [ops](pending &p) {
        size_t at = 0;
        for (const p2p &o : ops) {
            if (!o.send)
                memcpy(o.buf, p.out.data() + at, o.bytes);
            at += o.bytes;
        }
    };
    return launch(ops[0].comm, group_stream, post, land);
}

ncclResult_t add_p2p(bool send, const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                     cudaStream_t s)
{
    size_t bytes = count * type_size(t);

    if (!c || peer < 0 || peer >= c->size || bytes > 0x7fffffff || (bytes && !emu_device_visible(buf)))
        return ncclInvalidArgument;
    if (group_ops.empty())
        group_stream = s;
    else if (s != group_stream || c != group_ops[0].comm)
        group_bad = true; /* one stream and one communicator per group here */
    group_ops.push_back(p2p{ send, (void *)buf, bytes, peer, c });
    return group_depth ? ncclSuccess : run_group();
}

/* Whether the knob `name`'s value is this process's world rank. */
bool rank_knob(const char *name)
{
    const char *e = getenv(name);
    int me = -1;

    if (!e || !*e)
        return false;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    return atoi(e) == me;
}

ncclResult_t emu_get_unique_id(ncclUniqueId *id)
{
    if (rank_knob("ZS_CUDA_EMU_NCCL_ID_FAIL"))
        return ncclSystemError;
    memset(id, 0, sizeof(*id));
    snprintf(id->internal, sizeof(id->internal), "cuda_emu");
    return ncclSuccess;
}

/* The duplicate of MPI_COMM_WORLD is made nonblocking: a rank that never comes leaves it in progress. */
ncclResult_t init(ncclComm_t *out, int n, int rank, bool blocking)
{
    auto c = std::make_unique<emu_nccl_comm>();
    int wr, ws;

    *out = nullptr;
    inits++;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    MPI_Comm_size(MPI_COMM_WORLD, &ws);
    if (wr != rank || ws != n) {
        fprintf(stderr, "cuda_emu: ncclCommInitRank: rank %d of %d, but MPI_COMM_WORLD has %d of %d\n", rank, n,
                wr, ws);
        return ncclInvalidArgument;
    }
    c->rank = rank;
    c->size = n;
    c->blocking = blocking;
    MPI_Comm_idup(MPI_COMM_WORLD, &c->mpi, &c->init);
    if (blocking)
        MPI_Wait(&c->init, MPI_STATUS_IGNORE);
    else
        c->async = ncclInProgress;
    *out = c.get();
    comms.push_back(std::move(c));
    return blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t emu_comm_init_rank(ncclComm_t *out, int n, ncclUniqueId id, int rank)
{
    return init(out, n, rank, true);
}

ncclResult_t emu_comm_init_rank_config(ncclComm_t *out, int n, ncclUniqueId id, int rank, ncclConfig_t *cfg)
{
    return init(out, n, rank, !cfg || cfg->blocking != 0);
}

ncclResult_t emu_get_async_error(ncclComm_t c, ncclResult_t *r)
{
    int flag = 0;

    if (!c || !r)
        return ncclInvalidArgument;
    if (c->init != MPI_REQUEST_NULL && !c->aborted) {
        MPI_Test(&c->init, &flag, MPI_STATUS_IGNORE);
        if (!flag) {
            *r = ncclInProgress;
            return ncclSuccess;
        }
    }
    if (c->async == ncclInProgress)
        c->async = ncclSuccess; /* the queued operations are on their stream */
    *r = c->async;
    return ncclSuccess;
}

/* Pending operations end without landing, so their streams move on; the error stays. The MPI side (an
 * unfinished duplicate, posted requests) is abandoned, as a peer may never match it. */
ncclResult_t emu_comm_abort(ncclComm_t c)
{
    if (!c)
        return ncclInvalidArgument;
    c->aborted = true;
    return ncclSuccess;
}

ncclResult_t emu_comm_destroy(ncclComm_t c)
{
    if (!c || c->aborted || c->init != MPI_REQUEST_NULL)
        return ncclInvalidUsage;
    MPI_Comm_free(&c->mpi);
    c->aborted = true; /* the object stays: nothing may use it now */
    return ncclSuccess;
}

ncclResult_t emu_reduce_scatter(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                                ncclComm_t c, cudaStream_t s)
{
    size_t bytes = count * 4;

    if (!c || t != ncclFloat32 || op != ncclSum || count > 0x7fffffff ||
        !emu_device_visible(send) || !emu_device_visible(recv))
        return ncclInvalidArgument;
    return launch(c, s, [=](pending &p) {
        p.in.assign((const char *)send, (const char *)send + bytes * (size_t)c->size);
        p.out.resize(bytes);
        p.req.resize(1);
        MPI_Ireduce_scatter_block(p.in.data(), p.out.data(), (int)count, MPI_FLOAT, MPI_SUM, c->mpi, &p.req[0]);
    }, [=](pending &p) { memcpy(recv, p.out.data(), bytes); });
}

ncclResult_t emu_all_gather(const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t c,
                            cudaStream_t s)
{
    size_t bytes = count * type_size(t);

    if (!c || bytes > 0x7fffffff || !emu_device_visible(send) || !emu_device_visible(recv))
        return ncclInvalidArgument;
    return launch(c, s, [=](pending &p) {
        p.in.assign((const char *)send, (const char *)send + bytes);
        p.out.resize(bytes * (size_t)c->size);
        p.req.resize(1);
        MPI_Iallgather(p.in.data(), (int)bytes, MPI_BYTE, p.out.data(), (int)bytes, MPI_BYTE, c->mpi, &p.req[0]);
    }, [=](pending &p) { memcpy(recv, p.out.data(), p.out.size()); });
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
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument (cuda_emu)";
    case ncclInvalidUsage: return "invalid usage (cuda_emu)";
    case ncclRemoteError: return "remote process exited or there was a network error (cuda_emu)";
    case ncclInProgress: return "NCCL operation in progress (cuda_emu)";
    case ncclSystemError: return "unhandled system error (cuda_emu)";
    default: return "error (cuda_emu)";
    }
}

bool enabled(void)
{
    const char *e = getenv("ZS_CUDA_EMU_NCCL");

    return e && !strcmp(e, "1");
}

int handle; /* what dlopen hands out */

} // namespace

/* For the tests: whether (and how often) the engine made an NCCL communicator. */
extern "C" unsigned long long zs_emu_nccl_inits(void)
{
    return inits;
}

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
        { "ncclCommInitRankConfig", (void *)emu_comm_init_rank_config },
        { "ncclCommGetAsyncError", (void *)emu_get_async_error }, { "ncclCommAbort", (void *)emu_comm_abort },
    };

    const char *old = getenv("ZS_CUDA_EMU_NCCL_OLD");

    if (lib != &handle || (old && !strcmp(old, "1") && !strcmp(name, "ncclCommInitRankConfig")))
        return nullptr;
    for (const auto &t : table)
        if (!strcmp(t.name, name))
            return t.fn;
    return nullptr;
}
