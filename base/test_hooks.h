/* Every environment variable the library reads only for its tests, one macro per hook: what it fakes,
 * and which file reads it. Programs must never set these; tests/README.md says which tests use them. */
#ifndef ZS_BASE_TEST_HOOKS_H
#define ZS_BASE_TEST_HOOKS_H

/* ---------------------------------------------------------------- ckpt/ */

/* R:N: rank R dies (SIGKILL) halfway through writing its file of the checkpoint at global step N.
 * Read by ckpt/ckpt.c. */
#define ZS_TEST_HOOK_CKPT_CRASH "ZS_TEST_CKPT_CRASH"
/* FILE: every step of a save or load (mkdir, fsync, rename, link, ...) is appended to FILE, so a test can
 * check their order. Read by ckpt/ckpt_dir.c. */
#define ZS_TEST_HOOK_CKPT_TRACE "ZS_TEST_CKPT_TRACE"
/* RANK:ACTION:K: that rank's K-th save or load step is killed, stopped, fails with EIO or with ENOSPC.
 * Read by ckpt/ckpt_dir.c. */
#define ZS_TEST_HOOK_CKPT_FAULT "ZS_TEST_CKPT_FAULT"
/* any value: publishing takes the fallback for file systems without renameat2(RENAME_EXCHANGE).
 * Read by ckpt/ckpt_dir.c. */
#define ZS_TEST_HOOK_CKPT_NO_EXCHANGE "ZS_TEST_CKPT_NO_EXCHANGE"

/* ---------------------------------------------------------------- comm/ */

/* N: the first collective's sequence number, so a short test crosses 2^32. Read by comm/comm_guard.c. */
#define ZS_TEST_HOOK_COMM_SEQ "ZS_TEST_COMM_SEQ"
/* N: pretend MPI_TAG_UB is N (the standard's minimum is 32767). Read by comm/comm_guard.c. */
#define ZS_TEST_HOOK_TAG_UB "ZS_TEST_TAG_UB"
/* SITE:SEQ:RANK[,...]: operation SEQ fails on global rank RANK at SITE (new, attach, progress), or the
 * rank is stopped (stop) or killed (die) there. Read by comm/comm_guard.c; the sites are in comm/comm_impl.h
 * and acted on in comm/comm.c. */
#define ZS_TEST_HOOK_COMM_FAULT "ZS_TEST_COMM_FAULT"
/* alloc:N:R or grow:N:R: global rank R's N-th shared-memory allocation (growth) fails locally.
 * Read by comm/shm.c. */
#define ZS_TEST_HOOK_SHM_FAULT "ZS_TEST_SHM_FAULT"
/* BYTES: the NCCL staging buffer's piece per rank (a multiple of 4), so a short test walks its chunks in several
 * pieces. Read by comm/comm_nccl.c. */
#define ZS_TEST_HOOK_NCCL_PIECE "ZS_TEST_NCCL_PIECE"

/* ---------------------------------------------------------------- device/ */

/* separate: the "cpu" device becomes the separate CPU device, whose memory the host reaches only through
 * the device's copies (a GPU's data path without a GPU). Read by device/device.c. */
#define ZS_TEST_HOOK_DEVICE "ZS_TEST_DEVICE"
/* 1: the separate device refuses every pin, as a GPU over the locked-memory limit does.
 * Read by device/device_cpu.c. */
#define ZS_TEST_HOOK_PIN_FAIL "ZS_TEST_PIN_FAIL"
/* a PCI bus id: the separate device claims to sit there, to drive the placement near it.
 * Read by device/device_cpu.c. */
#define ZS_TEST_HOOK_DEVICE_PCI "ZS_TEST_DEVICE_PCI"

/* ---------------------------------------------------------------- offload/ */

/* KIND:WHAT:OFFSET, KIND read or write: the optimizer swap file's I/O at that byte offset fails with WHAT
 * (ENOSPC, EIO) or, with HANG, never completes, as on a hung disk. Read by offload/nvme_optim.c. */
#define ZS_TEST_HOOK_SWAP_FAULT "ZS_TEST_SWAP_FAULT"
/* 1: every swap file behaves as on a file system that refuses O_DIRECT (the buffered fallback).
 * Read by offload/swap_open.c. */
#define ZS_TEST_HOOK_SWAP_BUFFERED "ZS_TEST_SWAP_BUFFERED"

/* ---------------------------------------------------------------- runtime/ */

/* STEP:RANK: that rank sends itself SIGTERM at global step STEP, as a preempting scheduler would.
 * Read by runtime/preempt.c. */
#define ZS_TEST_HOOK_SIGTERM "ZS_TEST_SIGTERM"
/* R:B1,B2,...: rank R sees an overflow (an Inf in its gradients) at accumulation boundaries B1, B2, ...
 * (1 = the first), as overflowed fp16 gradients would. Read by runtime/step.c. */
#define ZS_TEST_HOOK_OVERFLOW "ZS_TEST_OVERFLOW"

#endif
