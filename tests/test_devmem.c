/* test_devmem.c [CASE] - where device-side memory lives: the device arena's sub-allocator (alignment, overflow,
 * exhaustion, coalescing, against a shadow map under random traffic), the arena on the separate test device
 * (aligned blocks, zero-filled unless the caller writes them whole; a request beyond the plan is a named error),
 * the PCI-to-NUMA lookup on topologies written here in XML, and the engine on the separate device: its buffers come from the arena, a stage-3 fetch
 * beyond the gathered region fails by name, the host pool is pinned through the device (or stays pageable on
 * every rank that is refused, ZS_TEST_PIN_FAIL, while training goes on), and a named PCI device moves the
 * threads near it. CASE: "unit" (no MPI ranks needed), "engine" (the separate device, under mpirun at 1-2 ranks)
 * or "cuda" (the engine part on the GPU: arena, pool pinned by cudaHostRegister, placement; 77 without a GPU);
 * "fill" (the arena's zero-fill on the GPU read back through copies, as "unit" does on the separate device);
 * "cuda emu" adds, on the emulated GPU (tests/cuda_emu), a refused pin (ZS_CUDA_EMU_PIN_FAIL) and steps after it. */
#include <errno.h>
#include <hwloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>

#include "device/arena.h"     /* defines: zs_suballoc_*, zs_dev_arena_* */
#include "check.h"
#include "device/device.h"    /* defines: zs_device_open, zs_device_separate_pinned */
#include "core/ctx.h"
#include "base/error.h"     /* defines: zs_last_error */
#include "core/host_pool.h" /* defines: zs_host_pool_base, zs_host_pool_size */
#include "device/placement.h" /* defines: zs_place_near_pci, zs_place_parse_busid */
#include "zeroshard.h"

/* ---------------------------------------------------------------- the sub-allocator */

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void test_suballoc_edges(void)
{
    struct zs_suballoc a;
    uint64_t off[4], o;

    CHECK(zs_suballoc_init(&a, 4096, 3) == -EINVAL, "alignment 3 accepted");
    CHECK(zs_suballoc_init(&a, 4000, 256) == -EINVAL, "size not a multiple of the alignment accepted");
    CHECK(zs_suballoc_init(&a, 4096, 256) == 0, "init");
    /* 1, 255, 256 and 257 bytes: each at a multiple of 256, taking 256, 256, 256 and 512 */
    const uint64_t ask[4] = { 1, 255, 256, 257 };
    for (int i = 0; i < 4; i++)
        CHECK(zs_suballoc_alloc(&a, ask[i], &off[i]) == 0 && off[i] % 256 == 0, "alloc %llu", (unsigned long long)ask[i]);
    CHECK(off[0] == 0 && off[1] == 256 && off[2] == 512 && off[3] == 768, "offsets %llu %llu %llu %llu",
          (unsigned long long)off[0], (unsigned long long)off[1], (unsigned long long)off[2], (unsigned long long)off[3]);
    CHECK(a.used == 1280, "used %llu, expected 1280", (unsigned long long)a.used);
    /* sizes whose rounding wraps must not turn into small blocks */
    CHECK(zs_suballoc_alloc(&a, UINT64_MAX, &o) == -EOVERFLOW, "UINT64_MAX bytes not refused as overflow");
    CHECK(zs_suballoc_alloc(&a, UINT64_MAX - 100, &o) == -EOVERFLOW, "UINT64_MAX-100 bytes not refused as overflow");
    CHECK(zs_suballoc_alloc(&a, 4096, &o) == -ENOSPC, "more than is free handed out");
    CHECK(zs_suballoc_alloc(&a, 4096 - 1280, &o) == 0 && o == 1280, "the exact rest not handed out");
    CHECK(zs_suballoc_alloc(&a, 1, &o) == -ENOSPC, "a block from a full region");
    CHECK(zs_suballoc_free(&a, 1280, 4096 - 1280) == 0, "free the rest");
    /* misuse is refused, never merged into the free list */
    CHECK(zs_suballoc_free(&a, 1280, 256) == -EINVAL, "double free accepted");
    CHECK(zs_suballoc_free(&a, 100, 256) == -EINVAL, "misaligned free accepted");
    CHECK(zs_suballoc_free(&a, 4096, 256) == -EINVAL, "free past the end accepted");
    CHECK(zs_suballoc_free(&a, 3840, 512) == -EINVAL, "free running past the end accepted");
    CHECK(zs_suballoc_free(&a, 0, UINT64_MAX) != 0, "free of a wrapping size accepted");
    /* coalescing: free the middle two, then the ends; the whole region is one block again */
    CHECK(zs_suballoc_free(&a, off[1], ask[1]) == 0 && zs_suballoc_free(&a, off[2], ask[2]) == 0, "free middle");
    CHECK(zs_suballoc_largest_free(&a) == 4096 - 1280 || zs_suballoc_largest_free(&a) == 4096 - 1280,
          "largest free %llu", (unsigned long long)zs_suballoc_largest_free(&a));
    CHECK(zs_suballoc_alloc(&a, 512, &o) == 0 && o == 256, "first fit into the merged middle hole: %llu",
          (unsigned long long)o);
    CHECK(zs_suballoc_free(&a, o, 512) == 0, "free it again");
    CHECK(zs_suballoc_free(&a, off[0], ask[0]) == 0 && zs_suballoc_free(&a, off[3], ask[3]) == 0, "free ends");
    CHECK(a.used == 0 && a.nfree == 1 && zs_suballoc_largest_free(&a) == 4096, "not one free span: %d spans, used %llu",
          a.nfree, (unsigned long long)a.used);
    zs_suballoc_fini(&a);
}

/* Random allocations and frees against a byte map: no block overlaps another, every offset is aligned, and the
 * allocator's count of used bytes is the map's. */
static void test_suballoc_random(void)
{
    enum { SIZE = 1 << 16, ALIGN = 64, N = 200 };
    static unsigned char owner[SIZE];
    struct { uint64_t off, bytes; bool live; } blk[N] = { { 0 } };
    struct zs_suballoc a;
    int bad = 0;

    memset(owner, 0, sizeof(owner));
    CHECK(zs_suballoc_init(&a, SIZE, ALIGN) == 0, "init");
    for (int it = 0; it < 20000 && !bad; it++) {
        int k = (int)(next_rand() % N);
        if (blk[k].live) {
            uint64_t len = blk[k].bytes ? (blk[k].bytes + ALIGN - 1) / ALIGN * ALIGN : ALIGN;
            if (zs_suballoc_free(&a, blk[k].off, blk[k].bytes))
                bad = 1;
            memset(owner + blk[k].off, 0, len);
            blk[k].live = false;
            continue;
        }
        uint64_t bytes = next_rand() % 3000, off, len = bytes ? (bytes + ALIGN - 1) / ALIGN * ALIGN : ALIGN;
        int rc = zs_suballoc_alloc(&a, bytes, &off);
        if (rc == -ENOSPC)
            continue;
        if (rc || off % ALIGN || off + len > SIZE) {
            bad = 2;
            break;
        }
        for (uint64_t i = off; i < off + len; i++)
            if (owner[i])
                bad = 3;
        memset(owner + off, 1, len);
        blk[k].off = off;
        blk[k].bytes = bytes;
        blk[k].live = true;
    }
    uint64_t mapped = 0;
    for (int i = 0; i < SIZE; i++)
        mapped += owner[i];
    CHECK(!bad, "random traffic: %s", bad == 1 ? "a free refused" : bad == 2 ? "misplaced block" : "overlapping blocks");
    CHECK(mapped == a.used, "used %llu, map %llu", (unsigned long long)a.used, (unsigned long long)mapped);
    for (int k = 0; k < N; k++)
        if (blk[k].live)
            CHECK(zs_suballoc_free(&a, blk[k].off, blk[k].bytes) == 0, "final free");
    CHECK(a.used == 0 && a.nfree == 1, "not whole again: %d spans", a.nfree);
    zs_suballoc_fini(&a);
}

/* ---------------------------------------------------------------- the arena on the separate device */

/* Whether `bytes` at device address p, read back through the device's copy, are all `v`: the count that are not. */
static size_t differ(struct zs_device *d, const void *p, size_t bytes, unsigned char v)
{
    unsigned char back[4096];
    size_t n = 0;

    memset(back, v ^ 0x55, sizeof(back));
    if (bytes > sizeof(back) || zs_device_copy(d, back, false, p, true, bytes))
        return bytes ? bytes : 1;
    for (size_t i = 0; i < bytes; i++)
        n += back[i] != v;
    return n;
}

/* The zero-fill read back through the device's copies, not its counter: blocks dirtied, given back (the two
 * coalesce) and handed out again, one spanning both, read as zeros; one asked for without zeroing keeps its last
 * owner's bytes. Every access is the device's copy on its compute stream, after the fill queued there. */
static void test_arena_refill(struct zs_device *d, const char *what)
{
    struct zs_dev_arena a;
    const uint64_t size = 4096;
    const char *const name = "parameters";
    unsigned char dirt[4096];
    void *p, *q, *r;

    memset(dirt, 0xab, sizeof(dirt));
    CHECK(zs_dev_arena_open(&a, d, &size, &name, 1) == ZS_OK, "%s: arena: %s", what, zs_last_error());
    p = zs_dev_arena_alloc(&a, 0, 1000, true);
    q = zs_dev_arena_alloc(&a, 0, 1000, true);
    CHECK(p && q && (char *)q - (char *)p == 1024, "%s: blocks %p %p not 1024 apart", what, p, q);
    CHECK(p && q && !differ(d, p, 1000, 0) && !differ(d, q, 1000, 0), "%s: fresh blocks not zero-filled", what);
    CHECK(p && q && !zs_device_copy(d, p, true, dirt, false, 1000) && !zs_device_copy(d, q, true, dirt, false, 1000) &&
          !differ(d, q, 1000, 0xab), "%s: dirtying two blocks: %s", what, zs_last_error());
    CHECK(p && q && !zs_dev_arena_free(&a, 0, p, 1000) && !zs_dev_arena_free(&a, 0, q, 1000), "%s: free: %s", what,
          zs_last_error());
    r = zs_dev_arena_alloc(&a, 0, 2000, true); /* first fit: where both were */
    size_t bad = r == p ? differ(d, r, 2000, 0) : 2000;
    CHECK(r == p && !bad, "%s: %zu of 2000 bytes of a block reused over two dirtied ones not zero-filled", what, bad);
    CHECK(r && !zs_device_copy(d, r, true, dirt, false, 2000) && !zs_dev_arena_free(&a, 0, r, 2000), "%s: refill and "
          "free: %s", what, zs_last_error());
    r = zs_dev_arena_alloc(&a, 0, 2000, false);
    CHECK(r == p && !differ(d, r, 2000, 0xab), "%s: a block handed out without zeroing was changed", what);
    CHECK(a.zeroed[0] == 4000, "%s: zero-filled bytes: %llu", what, (unsigned long long)a.zeroed[0]);
    zs_dev_arena_close(&a);
}

static void test_arena_separate(void)
{
    struct zs_device d;
    struct zs_dev_arena a;
    const uint64_t sizes[3] = { 10000, 0, 1024 };
    const char *const names[3] = { "parameters", "gradients", "gathered parameters" };
    unsigned char host[1024];

    setenv("ZS_TEST_DEVICE", "separate", 1);
    CHECK(zs_device_open(&d, "cpu", "test", NULL, ZS_KPATH_SCALAR, 0, 1) == ZS_OK, "open: %s", zs_last_error());
    unsetenv("ZS_TEST_DEVICE");
    CHECK(zs_dev_arena_open(&a, &d, sizes, names, 3) == ZS_OK, "arena: %s", zs_last_error());
    CHECK(zs_dev_arena_size(&a) == 10240 + 1024, "size %llu", (unsigned long long)zs_dev_arena_size(&a));
    void *p = zs_dev_arena_alloc(&a, 0, 100, true), *q = zs_dev_arena_alloc(&a, 0, 100, true);
    CHECK(p && q && (uintptr_t)p % 256 == 0 && (uintptr_t)q % 256 == 0 && (char *)q - (char *)p == 256,
          "blocks %p %p not 256 apart and aligned", p, q);
    CHECK(!zs_dev_arena_alloc(&a, 1, 1, true), "a block from a region the plan left empty");
    CHECK(strstr(zs_last_error(), "gradients region") && strstr(zs_last_error(), "1 bytes"), "message: %s",
          zs_last_error());
    CHECK(!zs_dev_arena_alloc(&a, 0, 20000, true), "20000 bytes from a 10240-byte region");
    CHECK(strstr(zs_last_error(), "20000 bytes") && strstr(zs_last_error(), "10240 bytes"), "message: %s",
          zs_last_error());
    void *g = zs_dev_arena_alloc(&a, 2, sizeof(host), true);
    CHECK(g && zs_dev_arena_free(&a, 2, g, sizeof(host)) == ZS_OK, "free");
    CHECK(zs_dev_arena_free(&a, 2, g, sizeof(host)) != ZS_OK, "double free accepted");
    CHECK(zs_dev_arena_free(&a, 0, g, sizeof(host)) != ZS_OK, "a block freed into another region");
    zs_dev_arena_close(&a);
    test_arena_refill(&d, "separate device");
    zs_device_close(&d);
}

/* ---------------------------------------------------------------- PCI -> NUMA on an XML topology */

/* Two packages, each a NUMA node with one core; a GPU behind a bridge under package 1, a NIC under package 0. */
static const char topo_xml[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
    "<topology version=\"2.0\">\n"
    " <object type=\"Machine\" os_index=\"0\" cpuset=\"0x3\" complete_cpuset=\"0x3\" allowed_cpuset=\"0x3\""
    "  nodeset=\"0x3\" complete_nodeset=\"0x3\" allowed_nodeset=\"0x3\" gp_index=\"1\">\n"
    "  <object type=\"Package\" os_index=\"0\" cpuset=\"0x1\" complete_cpuset=\"0x1\" nodeset=\"0x1\""
    "   complete_nodeset=\"0x1\" gp_index=\"2\">\n"
    "   <object type=\"NUMANode\" os_index=\"0\" cpuset=\"0x1\" complete_cpuset=\"0x1\" nodeset=\"0x1\""
    "    complete_nodeset=\"0x1\" gp_index=\"3\" local_memory=\"1073741824\"/>\n"
    "   <object type=\"Core\" os_index=\"0\" cpuset=\"0x1\" complete_cpuset=\"0x1\" nodeset=\"0x1\""
    "    complete_nodeset=\"0x1\" gp_index=\"4\">\n"
    "    <object type=\"PU\" os_index=\"0\" cpuset=\"0x1\" complete_cpuset=\"0x1\" nodeset=\"0x1\""
    "     complete_nodeset=\"0x1\" gp_index=\"5\"/>\n"
    "   </object>\n"
    "   <object type=\"Bridge\" gp_index=\"6\" bridge_type=\"0-1\" depth=\"0\" bridge_pci=\"0000:[17-17]\">\n"
    "    <object type=\"PCIDev\" gp_index=\"7\" pci_busid=\"0000:17:00.0\" pci_type=\"0200 [15b3:1017] [15b3:0007] 00\""
    "     pci_link_speed=\"0.000000\"/>\n"
    "   </object>\n"
    "  </object>\n"
    "  <object type=\"Package\" os_index=\"1\" cpuset=\"0x2\" complete_cpuset=\"0x2\" nodeset=\"0x2\""
    "   complete_nodeset=\"0x2\" gp_index=\"8\">\n"
    "   <object type=\"NUMANode\" os_index=\"1\" cpuset=\"0x2\" complete_cpuset=\"0x2\" nodeset=\"0x2\""
    "    complete_nodeset=\"0x2\" gp_index=\"9\" local_memory=\"1073741824\"/>\n"
    "   <object type=\"Core\" os_index=\"1\" cpuset=\"0x2\" complete_cpuset=\"0x2\" nodeset=\"0x2\""
    "    complete_nodeset=\"0x2\" gp_index=\"10\">\n"
    "    <object type=\"PU\" os_index=\"1\" cpuset=\"0x2\" complete_cpuset=\"0x2\" nodeset=\"0x2\""
    "     complete_nodeset=\"0x2\" gp_index=\"11\"/>\n"
    "   </object>\n"
    "   <object type=\"Bridge\" gp_index=\"12\" bridge_type=\"0-1\" depth=\"0\" bridge_pci=\"0000:[3b-3b]\">\n"
    "    <object type=\"PCIDev\" gp_index=\"13\" pci_busid=\"0000:3b:00.0\" pci_type=\"0302 [10de:2330] [10de:16c1] a1\""
    "     pci_link_speed=\"0.000000\"/>\n"
    "   </object>\n"
    "  </object>\n"
    " </object>\n"
    "</topology>\n";

static void test_placement(void)
{
    hwloc_topology_t t;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    unsigned dom, bus, dev, fn;
    int numa = 7;

    CHECK(zs_place_parse_busid("00000000:3B:00.0", &dom, &bus, &dev, &fn) == 0 && dom == 0 && bus == 0x3b && dev == 0 &&
          fn == 0, "CUDA's form of a bus id");
    CHECK(zs_place_parse_busid("0000:3b:00", &dom, &bus, &dev, &fn) == -EINVAL, "no function accepted");
    CHECK(zs_place_parse_busid("0000:3b:00.0x", &dom, &bus, &dev, &fn) == -EINVAL, "trailing junk accepted");
    CHECK(!hwloc_topology_init(&t), "init");
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_ALL);
    CHECK(!hwloc_topology_set_xmlbuffer(t, topo_xml, (int)sizeof(topo_xml)), "xml: %s", strerror(errno));
    CHECK(!hwloc_topology_load(t), "load the XML topology");
    CHECK(zs_place_near_pci(t, "00000000:3B:00.0", set, &numa) == 0, "the GPU not found");
    CHECK(numa == 1, "the GPU's NUMA node: %d, expected 1", numa);
    CHECK(hwloc_bitmap_isset(set, 1) && !hwloc_bitmap_isset(set, 0) && hwloc_bitmap_weight(set) == 1,
          "the GPU's cpuset is not PU 1 alone");
    CHECK(zs_place_near_pci(t, "0000:17:00.0", set, &numa) == 0 && numa == 0 && hwloc_bitmap_isset(set, 0) &&
          !hwloc_bitmap_isset(set, 1), "the NIC: node %d", numa);
    CHECK(zs_place_near_pci(t, "0000:3c:00.0", set, &numa) == -ENOENT && numa == -1, "a missing device found");
    CHECK(zs_place_near_pci(t, "gpu0", set, &numa) == -EINVAL, "a bad id accepted");
    hwloc_topology_destroy(t);
    hwloc_bitmap_free(set);
}

/* ---------------------------------------------------------------- the engine on the separate device */

static void fill(void *arg, int32_t param, int64_t first, int64_t count, float *dst)
{
    for (int64_t i = 0; i < count; i++)
        dst[i] = 0.001f * (float)((first + i + param * 7) % 97);
}

static const char *devname = "separate"; /* or "cuda" (the GPU) */

/* Three units of 1000 elements on the device, stage 3 with both offloads on the host. */
static zs_status open_engine(zs_ctx **ctx, int32_t *unit, const char *extra)
{
    char json[1024];
    zs_status st;
    bool cuda = !strcmp(devname, "cuda");

    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 1,"
             "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
             "\"zero_optimization\": {\"stage\": 3, \"stage3_param_persistence_threshold\": 0,"
             "\"stage3_max_live_parameters\": 1000, \"stage3_prefetch_bucket_size\": 0,"
             "\"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": {\"device\": \"cpu\"}%s},"
             "\"zeroshard\": {\"device\": \"%s\"}}", extra, cuda ? "cuda" : "cpu");
    zs_init_opts o = { .config_json = json, .use_comm = 1, .comm = MPI_COMM_WORLD, .quiet = 1 };
    if (!cuda)
        setenv("ZS_TEST_DEVICE", "separate", 1);
    st = zs_init(ctx, &o);
    unsetenv("ZS_TEST_DEVICE");
    for (int u = 0; !st && u < 3; u++) {
        char name[16];
        int32_t p;
        snprintf(name, sizeof(name), "u%d", u);
        st = zs_unit_add(*ctx, name, &unit[u]);
        snprintf(name, sizeof(name), "u%d.w", u);
        if (!st)
            st = zs_param_add_init(*ctx, unit[u], name, 1000, fill, NULL, &p);
    }
    return st ? st : zs_setup(*ctx);
}

/* One micro-batch: every unit fetched and released, a gradient of ones, a step. */
static zs_status one_step(zs_ctx *ctx, const int32_t *unit)
{
    static float ones[1024];
    zs_status st = ZS_OK;

    for (int i = 0; i < 1024; i++)
        ones[i] = 1.0f;
    for (int u = 2; !st && u >= 0; u--) {
        void *g = NULL;
        st = zs_unit_fetch(ctx, unit[u], NULL);
        if (!st)
            st = zs_grad_buffer(ctx, unit[u], &g);
        if (!st)
            st = zs_copy_from_host(ctx, g, ones, 1000 * sizeof(float));
        if (!st)
            st = zs_grad_ready(ctx, unit[u]);
        if (!st)
            st = zs_unit_release(ctx, unit[u]);
    }
    return st ? st : zs_step(ctx);
}

static void test_engine(int rank)
{
    zs_ctx *ctx = NULL;
    int32_t unit[3];
    int base = zs_device_separate_pin_count();

    zs_status st = open_engine(&ctx, unit, "");

    CHECK(!st, "set-up: %s", zs_last_error());
    if (st) {
        zs_finalize(ctx);
        return;
    }
    CHECK(ctx->dev_arena.open && zs_dev_arena_used(&ctx->dev_arena) > 0, "the engine's buffers not from the arena");
    CHECK(ctx->pool_pinned, "rank %d: the engine did not pin the host pool", rank);
    if (!strcmp(devname, "separate"))
        CHECK(zs_device_separate_pinned(zs_host_pool_base(ctx->host), zs_host_pool_size(ctx->host)),
              "rank %d: the host pool is not pinned through the device", rank);
    /* the device itself says so: a second registration of the pool is refused (cudaErrorHostMemoryAlreadyRegistered) */
    zs_status again = ctx->dev.ops->host_register(&ctx->dev, zs_host_pool_base(ctx->host), 4096);
    if (!again)
        ctx->dev.ops->host_unregister(&ctx->dev, zs_host_pool_base(ctx->host));
    CHECK(again != ZS_OK, "rank %d: the device pins the pool's first page again, so it was not pinned", rank);
    if (rank == 0)
        printf("placement: %s\n", ctx->place.desc);
    CHECK(one_step(ctx, unit) == ZS_OK, "a step: %s", zs_last_error());
    /* held at once, the three units need three units of bytes; the gathered region holds the cap (one unit) and one more */
    CHECK(zs_unit_fetch(ctx, unit[0], NULL) == ZS_OK && zs_unit_fetch(ctx, unit[1], NULL) == ZS_OK, "two fetches: %s",
          zs_last_error());
    st = zs_unit_fetch(ctx, unit[2], NULL);
    CHECK(st == ZS_ERR_NOMEM, "a third held unit beyond the plan: status %d", st);
    CHECK(strstr(zs_last_error(), "gathered parameters region") && strstr(zs_last_error(), "do not fit"),
          "message: %s", zs_last_error());
    zs_unit_release(ctx, unit[0]);
    zs_unit_release(ctx, unit[1]);
    uint64_t used = zs_dev_arena_used(&ctx->dev_arena);
    CHECK(zs_finalize(ctx) == ZS_OK, "finalize");
    CHECK(used > 0 && zs_device_separate_pin_count() == base, "pins left behind: %d (before: %d)",
          zs_device_separate_pin_count(), base); /* the separate device's registry; 0 = 0 on the GPU */
}

/* Rank 1 (or the only rank) is refused every pin: it warns and stays pageable; every rank trains on. */
static void test_pin_refused(int rank, int world)
{
    zs_ctx *ctx = NULL;
    int32_t unit[3];
    bool refuse = rank == (world > 1 ? 1 : 0);

    if (refuse) { /* the separate device's knob, and the CUDA emulator's */
        setenv("ZS_TEST_PIN_FAIL", "1", 1);
        setenv("ZS_CUDA_EMU_PIN_FAIL", "1", 1);
    }
    zs_status st = open_engine(&ctx, unit, "");
    unsetenv("ZS_TEST_PIN_FAIL");
    unsetenv("ZS_CUDA_EMU_PIN_FAIL");
    CHECK(!st, "set-up with a refused pin: %s", zs_last_error());
    if (!st) {
        CHECK(ctx->pool_pinned == !refuse, "rank %d: pool pinned %d", rank, ctx->pool_pinned);
        CHECK(one_step(ctx, unit) == ZS_OK && one_step(ctx, unit) == ZS_OK, "steps: %s", zs_last_error());
    }
    zs_finalize(ctx);
}

/* The caller's thread as the kernel binds it (the real topology, read back): PU 1 alone. */
static bool bound_to_pu1(void)
{
    hwloc_topology_t t;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    bool ok = set && !hwloc_topology_init(&t);

    if (ok) {
        ok = !hwloc_topology_load(t) && !hwloc_get_cpubind(t, set, HWLOC_CPUBIND_THREAD) && hwloc_bitmap_isset(set, 1) &&
             hwloc_bitmap_weight(set) == 1;
        hwloc_topology_destroy(t);
    }
    hwloc_bitmap_free(set);
    return ok;
}

/* ZS_TEST_DEVICE_PCI names the device's bus id and HWLOC_XMLFILE the topology above (HWLOC_THISSYSTEM: bind on
 * this machine): the engine finds NUMA node 1 and moves its threads to the core there. */
static void test_engine_placement(int rank)
{
    char path[64];
    zs_ctx *ctx = NULL;
    int32_t unit[3];
    FILE *f;

    snprintf(path, sizeof(path), "devmem_topo_%d.xml", rank);
    f = fopen(path, "w");
    CHECK(f && fwrite(topo_xml, 1, sizeof(topo_xml) - 1, f) == sizeof(topo_xml) - 1 && !fclose(f), "write %s", path);
    setenv("ZS_TEST_DEVICE_PCI", "00000000:3B:00.0", 1);
    setenv("HWLOC_XMLFILE", path, 1);
    setenv("HWLOC_THISSYSTEM", "1", 1);
    zs_status st = open_engine(&ctx, unit, "");
    unsetenv("ZS_TEST_DEVICE_PCI");
    unsetenv("HWLOC_XMLFILE");
    unsetenv("HWLOC_THISSYSTEM");
    remove(path);
    CHECK(!st, "set-up: %s", zs_last_error());
    if (!st) {
        CHECK(ctx->place.numa == 1, "rank %d: NUMA node %d, expected 1 (%s)", rank, ctx->place.numa, ctx->place.desc);
        CHECK(strstr(ctx->place.desc, "PCI 00000000:3B:00.0, NUMA node 1") && strstr(ctx->place.desc, "core 1-1"),
              "placement: %s", ctx->place.desc);
        CHECK(bound_to_pu1(), "rank %d: the caller's thread is not bound to PU 1, the core near the device", rank);
        CHECK(one_step(ctx, unit) == ZS_OK, "a step: %s", zs_last_error());
    }
    zs_finalize(ctx);
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "unit";
    bool cuda = !strcmp(which, "cuda") || !strcmp(which, "fill");
    int rank = 0, world = 1;

    if (!strcmp(which, "unit")) {
        test_suballoc_edges();
        test_suballoc_random();
        test_arena_separate();
        test_placement();
        return zs_test_summary("devmem unit");
    }
    if (cuda && zs_device_cuda_ops.count() <= 0) {
        printf("SKIP: no GPU visible (or no CUDA backend in this build)\n");
        return 77;
    }
    if (!strcmp(which, "fill")) { /* the arena's zero-fill on the GPU, read back (no MPI ranks needed) */
        struct zs_device d;
        CHECK(zs_device_open(&d, "cuda", "test", NULL, ZS_KPATH_SCALAR, 0, 1) == ZS_OK, "open: %s", zs_last_error());
        test_arena_refill(&d, "cuda");
        zs_device_close(&d);
        return zs_test_summary("devmem fill");
    }
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    devname = cuda ? "cuda" : "separate";
    test_engine(rank);
    if (!cuda) { /* the test hooks of the separate device: a refused pin, a named PCI device on an XML topology */
        test_pin_refused(rank, world);
        test_engine_placement(rank);
    } else if (argc > 2 && !strcmp(argv[2], "emu")) { /* tests/cuda_emu refuses a pin on request */
        test_pin_refused(rank, world);
    }
    int failed = zs_test_fail, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    if (rank == 0)
        return zs_test_summary("devmem engine") || any;
    return failed ? 1 : 0;
}
