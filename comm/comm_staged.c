/* comm_staged.c - host-staged collectives on device buffers (see comm_staged.h). */
#include "comm_staged.h"
#include "error.h" /* defines: zs_fail, zs_error_prefix */

static size_t esz(zs_dtype dt) { return dt == ZS_DTYPE_FP32 ? 4 : 2; }

void zs_staged_init(struct zs_staged *s, struct zs_comm *comm, struct zs_device *dev)
{
    *s = (struct zs_staged){ .comm = comm, .dev = dev };
}

void zs_staged_free(struct zs_staged *s)
{
    if (s->host) {
        if (s->pinned)
            s->dev->ops->host_unregister(s->dev, s->host);
        zs_comm_release(s->comm, s->host);
    }
    s->host = NULL;
    s->cap = 0;
    s->pinned = false;
}

/* At least `bytes` of host scratch. Every rank asks for the same sizes in the same order, so the shared
 * heap's collective allocation lines up; zs_comm_alloc_agreed makes a refusal on one rank a refusal on all. */
static zs_status reserve(struct zs_staged *s, size_t bytes)
{
    if (bytes <= s->cap)
        return ZS_OK;
    zs_staged_free(s);
    s->host = zs_comm_alloc_agreed(s->comm, bytes, true);
    if (!s->host)
        return zs_fail(ZS_ERR_NOMEM, "host-staged collectives: %zu bytes of host scratch", bytes);
    s->cap = bytes;
    /* pinned, so the copies down and up are DMA at full speed (cudaHostRegister on a GPU). Only this rank can
     * fail here while its peers go on into the collective, so a refusal is not an error: the scratch stays
     * pageable, which the copies (cudaMemcpyDefault) handle, only slower. */
    s->pinned = s->dev->ops->host_register(s->dev, s->host, bytes) == ZS_OK;
    return ZS_OK;
}

/* The device copy, finished before the host touches the data (down) or the scratch is reused (up). */
static zs_status move(struct zs_staged *s, void *dst, const void *src, size_t bytes, enum zs_copy_dir dir,
                      struct zs_dev_stream *stream)
{
    zs_status st = s->dev->ops->copy(s->dev, dst, src, bytes, dir, stream);

    if (!st)
        st = s->dev->ops->stream_sync(s->dev, stream);
    if (st)
        zs_error_prefix("host-staged collective, copy %s", dir == ZS_COPY_D2H ? "down" : "up");
    return st;
}

/* Down to the host; a rank that failed still takes the operation's place, and every rank's wait fails. */
static zs_status down(struct zs_staged *s, void *dst, const void *src, size_t bytes, struct zs_dev_stream *stream)
{
    zs_status st = move(s, dst, src, bytes, ZS_COPY_D2H, stream);

    if (st)
        zs_comm_fail_next(s->comm);
    return st;
}

/* req by address: the launch that sets it is a sibling argument, evaluated in no fixed order */
static zs_status settle(struct zs_staged *s, zs_status moved, zs_status launched, struct zs_comm_req **req)
{
    if (!launched)
        launched = zs_comm_wait(s->comm, *req);
    return moved ? moved : launched;
}

zs_status zs_staged_reduce_scatter(struct zs_staged *s, const void *buf, zs_dtype dt_in, void *out, zs_dtype dt_out,
                                   int64_t count, float scale, struct zs_dev_stream *stream)
{
    size_t in = (size_t)count * (size_t)zs_comm_size(s->comm) * esz(dt_in), res = (size_t)count * esz(dt_out);
    size_t at = (in + 63) / 64 * 64; /* the result's place: 16-bit input of odd length must not misalign fp32 */
    struct zs_comm_req *req = NULL;
    zs_status st, moved;
    char *h;

    if ((st = reserve(s, at + res)))
        return st; /* agreed: no rank goes on */
    h = s->host;
    moved = down(s, h, buf, in, stream);
    st = settle(s, moved, zs_comm_reduce_scatter_dt(s->comm, h, dt_in, h + at, dt_out, count, scale, &req), &req);
    return st ? st : move(s, out, h + at, res, ZS_COPY_H2D, stream);
}

zs_status zs_staged_all_gather(struct zs_staged *s, void *buf, zs_dtype dt, int64_t count,
                               struct zs_dev_stream *stream)
{
    size_t chunk = (size_t)count * esz(dt), all = chunk * (size_t)zs_comm_size(s->comm);
    size_t mine = chunk * (size_t)zs_comm_rank(s->comm);
    struct zs_comm_req *req = NULL;
    zs_status st, moved;
    char *h;

    if ((st = reserve(s, all)))
        return st;
    h = s->host;
    /* only this rank's chunk goes down: the others come from their owners */
    moved = down(s, h + mine, (const char *)buf + mine, chunk, stream);
    st = settle(s, moved, zs_comm_all_gather_dt(s->comm, h, dt, count, &req), &req);
    return st ? st : move(s, buf, h, all, ZS_COPY_H2D, stream);
}

zs_status zs_staged_all_reduce(struct zs_staged *s, void *buf, zs_dtype dt, int64_t count, float scale,
                               struct zs_dev_stream *stream)
{
    size_t all = (size_t)count * (size_t)zs_comm_size(s->comm) * esz(dt);
    struct zs_comm_req *req = NULL;
    zs_status st, moved;
    char *h;

    if ((st = reserve(s, all)))
        return st;
    h = s->host;
    moved = down(s, h, buf, all, stream);
    st = settle(s, moved, zs_comm_all_reduce_dt(s->comm, h, dt, count, scale, &req), &req);
    return st ? st : move(s, buf, h, all, ZS_COPY_H2D, stream);
}
