/* ckpt_format.h - the on-disk checkpoint format: the manifest (JSON) and the per-rank data files.
 * Shared by the engine's collective save/load (ckpt/ckpt.c) and the zs-ckpt tool.
 *
 * A checkpoint directory DIR holds tags DIR/<tag>/ (tag "global_step<N>" or the program's own) and a text
 * file DIR/latest naming the newest tag. A tag directory holds manifest.json and one data file per saving
 * rank, "rank<RRRRR>.bin" (5 digits), and optionally the program's extra file (zs_ckpt_opts.extra_name),
 * listed in "files" by rank 0 with no segment in it, so its checksum is verified like the others. Data files
 * are raw little-endian fp32 runs ("segments") with no header.
 *
 * manifest.json:
 * {
 *   "format": "zeroshard-checkpoint", "version": 1,
 *   "global_step": 10, "micro_step": 20, "world_size": 4, "stage": 3,
 *   "param_dtype": "fp32" | "bf16" | "fp16",   (the training dtype; saved data are always fp32 masters)
 *   "optimizer": "adamw",                       (config optimizer type, lower case)
 *   "loss_scaler": {"scale": 65536.0, "skipped_steps": 0, "hysteresis": 2, "last_overflow": -1, "iter": 10},
 *   "optimizer_steps": 10, "schedule_steps": 10,   (optional: updates since the moments and the learning-rate
 *                                                schedule started; absent, global_step less skipped_steps)
 *   "config": { ...the run's DeepSpeed config object, as loaded... },
 *   "units": [ {"name": "layer0", "numel": 1040,
 *               "params": [ {"name": "layer0.w", "offset": 0, "numel": 1024, "shape": [32, 32]}, ... ]} ],
 *   "groups": [ {"set": 3, "lr": 0.001, "weight_decay": 0.0, "betas": [0.9, 0.999], "eps": 1e-8,
 *                "momentum": 0.0, "dampening": 0.0, "nesterov": false, "lr_used": 0.0009}, ... ],
 *   "files": [ {"name": "rank00000.bin", "rank": 0, "bytes": 12288, "crc32c": "1a2b3c4d"} ],
 *   "segments": [ {"unit": 0, "kind": "param", "begin": 0, "count": 256, "file": 0, "offset": 0}, ... ]
 * }
 * micro_step counts the micro-batches trained, at least global_step: a window ended early (zs_window_end) leaves
 * it short of global_step x gradient_accumulation_steps, so a load restores it as written.
 * units[].numel is the unit's flat length (alignment gaps between parameters included, no shard padding).
 * A parameter occupies [offset, offset + numel) of its unit. A segment holds elements [begin, begin+count)
 * of one unit's flat array of one kind, stored at byte `offset` of file `file` (count * 4 bytes).
 * Kinds: "param" (fp32 master weights), "exp_avg", "exp_avg_sq" (the optimizer's two state arrays, for
 * every optimizer: their meaning is the optimizer's). For every unit and every kind present, the segments
 * cover [0, numel) exactly once. crc32c is CRC32C (offload/swap.h zs_crc32c) of the whole file, 8 lower-case
 * hex digits. Parameter names are unique.
 * Parameter groups (optional; written when the run has any, ckpt_groups.c): "groups" holds each group's
 * values (set: the zs_group_field bits the group gave itself; lr_used, optional: the lr of the last step)
 * and a parameter may carry "group" (an index into groups; default 0) and "frozen" (default false). A unit
 * whose parameters are all frozen has param segments only. A manifest without them (an older one) has every
 * parameter in group 0 and none frozen. */
#ifndef ZS_CKPT_FORMAT_H
#define ZS_CKPT_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ZS_CKPT_FORMAT "zeroshard-checkpoint"
#define ZS_CKPT_VERSION 1
#define ZS_CKPT_MANIFEST "manifest.json"
#define ZS_CKPT_LATEST "latest"
#define ZS_CKPT_LOCK "save.lock" /* in DIR: held (flock) by the job saving into DIR; names its host and pid */
#define ZS_CKPT_MAX_DIMS 8

enum zs_ckpt_kind { ZS_CKPT_PARAM = 0, ZS_CKPT_EXP_AVG = 1, ZS_CKPT_EXP_AVG_SQ = 2, ZS_CKPT_NKINDS = 3 };

struct zs_ckpt_param {
    char *name;
    int32_t unit;
    int64_t offset, numel;
    int32_t ndim;
    int64_t shape[ZS_CKPT_MAX_DIMS];
    int32_t group;  /* its parameter group (0 without "groups") */
    bool frozen;
};

/* A parameter group's values (as zs_group_opts) and the lr its last step used. */
struct zs_ckpt_group {
    uint32_t set;
    double lr, weight_decay, beta1, beta2, eps, momentum, dampening;
    bool nesterov, stepped;
    double lr_used;  /* when stepped */
};

struct zs_ckpt_unit {
    char *name;
    int64_t numel;
    int32_t first_param, nparams; /* index range in zs_ckpt_manifest.params */
};

struct zs_ckpt_file {
    char *name;   /* plain file name inside the tag directory: no '/', not "." or "..", not empty */
    int32_t rank;
    uint64_t bytes;
    uint32_t crc32c;
};

struct zs_ckpt_seg {
    int32_t unit, kind, file;
    int64_t begin, count;  /* elements */
    uint64_t offset;       /* bytes into the file */
};

struct zs_ckpt_scaler {
    double scale;
    int64_t skipped_steps, hysteresis, last_overflow, iter;
};

struct zs_ckpt_manifest {
    int32_t version;
    int64_t global_step, micro_step;
    int32_t world_size, stage;
    char *param_dtype, *optimizer;
    struct zs_ckpt_scaler scaler;
    int64_t optim_steps, sched_steps; /* -1 when the manifest has none (global_step - skipped_steps then) */
    char *config_json;            /* the "config" object re-serialised compactly (may be NULL) */
    struct zs_ckpt_unit *units;
    int32_t nunits;
    struct zs_ckpt_param *params;
    int32_t nparams;
    struct zs_ckpt_file *files;
    int32_t nfiles;
    struct zs_ckpt_seg *segs;
    int64_t nsegs;
    struct zs_ckpt_group *groups; /* NULL (ngroups 0) when the manifest has none */
    int32_t ngroups;
    bool has_kind[ZS_CKPT_NKINDS]; /* kinds that have segments (param always) */
};

const char *zs_ckpt_kind_name(int kind); /* "param", "exp_avg", "exp_avg_sq" */
/* A name that stays inside its directory: not empty, no '/', not "." or "..", no control characters. Used
 * for data file names and for the tag in DIR/latest. */
bool zs_ckpt_name_ok(const char *name);

/* Parses and validates a manifest held in memory (len bytes, not necessarily NUL-terminated). Every
 * field is type- and range-checked: file indices, unit indices, segment extents inside the file's
 * declared bytes and inside the unit, complete non-overlapping coverage per unit and kind, parameter
 * extents inside their unit, shape product equal to numel, unique parameter names, safe file names.
 * On failure returns -1 with a message naming `what` (the manifest's path, for messages) and the field
 * (e.g. "ckpt/global_step10/manifest.json: segments[3].offset: 4096 + 1024 bytes beyond file
 * rank00001.bin (4096 bytes)"). Never reads out of bounds, whatever the input. */
int zs_ckpt_manifest_parse(struct zs_ckpt_manifest *m, const char *text, size_t len, const char *what,
                           char *err, size_t errlen);
/* The same, knowing that the data files hold at most data_bytes in all: every table is bounded by that
 * and by the files' declared bytes (one unit element or segment per 4 bytes) before it is made. */
int zs_ckpt_manifest_parse_bounded(struct zs_ckpt_manifest *m, const char *text, size_t len, const char *what,
                                   uint64_t data_bytes, char *err, size_t errlen);
/* Whether every parameter of m's unit u is frozen (its segments are of kind param only). */
bool zs_ckpt_unit_frozen(const struct zs_ckpt_manifest *m, int32_t u);

/* Reads DIR/manifest.json and parses it (as above), bounded by the bytes of the other files in DIR; a
 * manifest much larger than those files can need is refused unread. */
int zs_ckpt_manifest_load(struct zs_ckpt_manifest *m, const char *tag_dir, char *err, size_t errlen);
void zs_ckpt_manifest_free(struct zs_ckpt_manifest *m);
/* Serialises m to JSON text (malloc'd, NUL-terminated; caller frees). config_json, when not NULL, is
 * embedded as the "config" object. NULL on allocation failure (or when config_json is not a JSON object). */
char *zs_ckpt_manifest_dump(const struct zs_ckpt_manifest *m);

/* Reads elements [begin, begin+count) of unit `unit`, kind `kind` into dst (fp32), from whichever
 * segments overlap, with pread on the files of tag_dir (opened lazily and cached in the reader).
 * A file shorter than the manifest says, or a read error, fails naming the file and byte offset.
 * The reader keeps a pointer to m: m must outlive it. */
struct zs_ckpt_reader;
int zs_ckpt_reader_open(struct zs_ckpt_reader **r, const struct zs_ckpt_manifest *m, const char *tag_dir,
                        char *err, size_t errlen);
int zs_ckpt_read_range(struct zs_ckpt_reader *r, int32_t unit, int kind, int64_t begin, int64_t count,
                       float *dst, char *err, size_t errlen);
void zs_ckpt_reader_close(struct zs_ckpt_reader *r);

/* Checks every file's size and CRC32C against the manifest (streaming, bounded memory). 0 or -1 with a
 * message naming the first bad file ("...: rank00001.bin: crc32c 0x... != manifest 0x..."). */
int zs_ckpt_verify(const struct zs_ckpt_manifest *m, const char *tag_dir, char *err, size_t errlen);
/* The same for files[file] alone, so a tool can report each file as it goes. */
int zs_ckpt_verify_file(const struct zs_ckpt_manifest *m, const char *tag_dir, int32_t file, char *err,
                        size_t errlen);

/* The tag DIR/latest names (a plain name, trailing newline dropped) into tag. */
int zs_ckpt_read_latest(const char *dir, char *tag, size_t taglen, char *err, size_t errlen);
/* Resolves DIR to a tag directory: DIR itself when it holds a manifest, else DIR/<contents of
 * DIR/latest> (the tag must be a plain name). out receives the path. */
int zs_ckpt_resolve(const char *dir, char *out, size_t outlen, char *err, size_t errlen);

#endif /* ZS_CKPT_FORMAT_H */
