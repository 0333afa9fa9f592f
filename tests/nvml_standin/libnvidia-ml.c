/*
 * A stand-in libnvidia-ml.so.1 for tests: the real pynvml bindings load it and see the GPUs,
 * processes, topology and Xid events described by the JSON file named by $NODUS_FAKE_NVML.
 *
 * The file is read again on every call that reads state (and parsed again when its bytes
 * changed), so a test can rewrite it while a daemon runs. Write it atomically (temp file +
 * rename; tests/nvml_standin/build.py has write_state). A rewrite that does not parse or does
 * not fit the schema is reported once on stderr and ignored: the last good state stays (so
 * does it when the file goes away after nvmlInit).
 *
 * Schema (keys starting with "_" are ignored anywhere; any other unknown key is an error):
 * {
 *   "driver_version": "550.54.15",          default "550.54.15"
 *   "cuda_driver_version": 12040,           default 12040
 *   "gpus": [{                              default []
 *     "index": 0,                           default: position; the indices must be 0..n-1
 *                                           (n <= 64) in any order
 *     "uuid": "GPU-...",                    default "GPU-5afe0000-0000-4000-8000-<index:012x>"
 *     "name": "NVIDIA H100 80GB HBM3",      default "NVIDIA H100 80GB HBM3"
 *     "pci_bus_id": "00000000:17:00.0",     default "00000000:<0x10+index:02X>:00.0";
 *                                           returned normalised as %08X:%02X:%02X.%X
 *     "pci_device_id": int,                 default 0x233010DE
 *     "pci_subsystem_id": int,              default 0x16C110DE
 *     "minor_number": int,                  default index
 *     "memory_total": bytes,                default 85520809984
 *     "memory_used": bytes,                 default 0 (free = total - used)
 *     "utilization_gpu": pct,               default 0
 *     "utilization_memory": pct,            default 0
 *     "power_mw": int,                      default 70000
 *     "energy_mj": int,                     default 0 (total energy counter)
 *     "temperature_c": int,                 default 35
 *     "mig_mode": 0 | 1 | null,             default 0; null: NOT_SUPPORTED
 *     "mig_pending": 0 | 1,                 default mig_mode
 *     "numa_node": int | null,              default 0; null: NOT_SUPPORTED
 *     "supported_events": int,              default 0x19F (ecc 1/2, pstate, xid, clock,
 *                                           power source, mig config)
 *     "processes": [{"pid": int, "used_memory": bytes | null,
 *                    "gpu_instance_id": int, "compute_instance_id": int}],
 *                                           default []; null memory: NVML_VALUE_NOT_AVAILABLE;
 *                                           instance ids default 0xFFFFFFFF
 *     "missing": false                      true: every call on this GPU (handle lookup
 *                                           included) returns NVML_ERROR_GPU_IS_LOST (15)
 *   }],
 *   "topology": [[level, ...], ...],        n x n, by GPU index; levels 0, 10, 20, 30, 40, 50;
 *                                           default 0 on the diagonal, 50 elsewhere
 *   "nvlink": [[i, j], ...],                unordered pairs of GPU indices
 *   "events": [{"gpu": index, "type": "xid" | name | int mask bit, "data": int, "seq": int,
 *               "gpu_instance_id": int, "compute_instance_id": int}]
 *                                           type names: single_bit_ecc, double_bit_ecc,
 *                                           pstate, xid, clock, power_source_change,
 *                                           mig_config_change; instance ids default 0xFFFFFFFF
 * }
 *
 * Behaviour:
 * - nvmlInit* fails with DRIVER_NOT_LOADED (9) when $NODUS_FAKE_NVML is unset or unreadable,
 *   UNKNOWN (999) when the file is not valid; init is reference counted like NVML's.
 * - A handle names a GPU index. A GPU marked missing, or whose index left the file, answers
 *   GPU_IS_LOST (15). Handle by index past the count: INVALID_ARGUMENT (2); by an unknown
 *   UUID or bus id: NOT_FOUND (6).
 * - Process lists follow NVML: SUCCESS with count 0 when there are none, and
 *   INSUFFICIENT_SIZE (7) with the needed count while the caller's array is too small.
 * - P2P: for NVLINK (2) OK iff the pair is in "nvlink", else NOT_SUPPORTED (5); for READ (0),
 *   WRITE (1), ATOMICS (3) and PCI (4) OK iff an nvlink pair or topology level <= 30, else
 *   IOH_TOPOLOGY_NOT_SUPPORTED (3). A device with itself, or another index: INVALID_ARGUMENT.
 * - Events: each event set delivers every event (lowest seq first) whose (gpu, seq) it has
 *   not delivered yet, for devices registered in that set with a mask covering the event's
 *   type, whether the event was in the file before registration or not. Otherwise
 *   nvmlEventSetWait_v2 polls the file every 5 ms until the timeout and returns TIMEOUT (10).
 *   nvmlShutdown ends a wait in progress with UNINITIALIZED (1). Registering a type outside
 *   the GPU's supported_events: NOT_SUPPORTED (3).
 * - Graphics and MPS process lists are always empty.
 *
 * All state sits behind one mutex; a wait sleeps without holding it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ NVML types */

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

enum {
    NVML_P2P_CAPS_INDEX_READ = 0,
    NVML_P2P_CAPS_INDEX_WRITE = 1,
    NVML_P2P_CAPS_INDEX_NVLINK = 2,
    NVML_P2P_CAPS_INDEX_ATOMICS = 3,
    NVML_P2P_CAPS_INDEX_PCI = 4,
};

enum {
    NVML_P2P_STATUS_OK = 0,
    NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED = 3,
    NVML_P2P_STATUS_NOT_SUPPORTED = 5,
};

#define NVML_TEMPERATURE_GPU 0
#define NVML_MEMORY_V2 0x02000028u

struct nvmlDevice_st {
    unsigned index;
};
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t is 68 bytes");
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t is 24 bytes");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t is 40 bytes");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t is 24 bytes");
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t is 32 bytes");

/* ------------------------------------------------------------------ JSON */

typedef enum { J_NULL, J_BOOL, J_INT, J_DOUBLE, J_STRING, J_ARRAY, J_OBJECT } jtype;

typedef struct jval {
    jtype t;
    int b;
    long long i;
    double d;
    char *s;
    size_t n;
    struct jval *items;
    char **keys;
} jval;

typedef struct {
    const char *start, *p, *end;
    char err[200];
} jparser;

static void jfree(jval *v)
{
    size_t k;
    if (v->t == J_STRING)
        free(v->s);
    if (v->t == J_ARRAY || v->t == J_OBJECT) {
        for (k = 0; k < v->n; k++) {
            jfree(&v->items[k]);
            if (v->keys)
                free(v->keys[k]);
        }
        free(v->items);
        free(v->keys);
    }
    memset(v, 0, sizeof *v);
}

static int jfail(jparser *ps, const char *what)
{
    if (!ps->err[0])
        snprintf(ps->err, sizeof ps->err, "JSON: %s at offset %ld", what,
                 (long)(ps->p - ps->start));
    return -1;
}

static void jskip_ws(jparser *ps)
{
    while (ps->p < ps->end &&
           (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int jhex4(jparser *ps, unsigned *out)
{
    unsigned v = 0;
    int k;
    if (ps->end - ps->p < 4)
        return jfail(ps, "short \\u escape");
    for (k = 0; k < 4; k++) {
        char c = *ps->p++;
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return jfail(ps, "bad \\u escape");
    }
    *out = v;
    return 0;
}

static int jparse_string(jparser *ps, char **out)
{
    size_t cap = 16, len = 0;
    char *buf;
    if (ps->p >= ps->end || *ps->p != '"')
        return jfail(ps, "expected string");
    ps->p++;
    buf = malloc(cap);
    if (!buf)
        return jfail(ps, "out of memory");
    for (;;) {
        unsigned char c;
        char tmp[4];
        size_t tn = 0, k;
        if (ps->p >= ps->end) {
            free(buf);
            return jfail(ps, "unterminated string");
        }
        c = (unsigned char)*ps->p++;
        if (c == '"')
            break;
        if (c < 0x20) {
            free(buf);
            return jfail(ps, "control character in string");
        }
        if (c != '\\') {
            tmp[tn++] = (char)c;
        } else {
            unsigned cp;
            if (ps->p >= ps->end) {
                free(buf);
                return jfail(ps, "unterminated escape");
            }
            c = (unsigned char)*ps->p++;
            switch (c) {
            case '"': tmp[tn++] = '"'; break;
            case '\\': tmp[tn++] = '\\'; break;
            case '/': tmp[tn++] = '/'; break;
            case 'b': tmp[tn++] = '\b'; break;
            case 'f': tmp[tn++] = '\f'; break;
            case 'n': tmp[tn++] = '\n'; break;
            case 'r': tmp[tn++] = '\r'; break;
            case 't': tmp[tn++] = '\t'; break;
            case 'u':
                if (jhex4(ps, &cp)) {
                    free(buf);
                    return -1;
                }
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    unsigned lo;
                    if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u') {
                        free(buf);
                        return jfail(ps, "lone surrogate");
                    }
                    ps->p += 2;
                    if (jhex4(ps, &lo)) {
                        free(buf);
                        return -1;
                    }
                    if (lo < 0xDC00 || lo > 0xDFFF) {
                        free(buf);
                        return jfail(ps, "bad surrogate pair");
                    }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    free(buf);
                    return jfail(ps, "lone surrogate");
                }
                if (cp == 0) {
                    free(buf);
                    return jfail(ps, "NUL in string");
                }
                if (cp < 0x80) {
                    tmp[tn++] = (char)cp;
                } else if (cp < 0x800) {
                    tmp[tn++] = (char)(0xC0 | (cp >> 6));
                    tmp[tn++] = (char)(0x80 | (cp & 0x3F));
                } else if (cp < 0x10000) {
                    tmp[tn++] = (char)(0xE0 | (cp >> 12));
                    tmp[tn++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    tmp[tn++] = (char)(0x80 | (cp & 0x3F));
                } else {
                    tmp[tn++] = (char)(0xF0 | (cp >> 18));
                    tmp[tn++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                    tmp[tn++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    tmp[tn++] = (char)(0x80 | (cp & 0x3F));
                }
                break;
            default:
                free(buf);
                return jfail(ps, "bad escape");
            }
        }
        if (len + tn + 1 > cap) {
            char *nb;
            cap = cap * 2 + tn;
            nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                return jfail(ps, "out of memory");
            }
            buf = nb;
        }
        for (k = 0; k < tn; k++)
            buf[len++] = tmp[k];
    }
    buf[len] = '\0';
    *out = buf;
    return 0;
}

static int jparse_number(jparser *ps, jval *out)
{
    const char *s = ps->p;
    char tmp[64];
    size_t len;
    int is_int = 1;
    if (ps->p < ps->end && *ps->p == '-')
        ps->p++;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
        return jfail(ps, "bad number");
    if (*ps->p == '0')
        ps->p++;
    else
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            ps->p++;
    if (ps->p < ps->end && *ps->p == '.') {
        is_int = 0;
        ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
            return jfail(ps, "bad fraction");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        is_int = 0;
        ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-'))
            ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
            return jfail(ps, "bad exponent");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            ps->p++;
    }
    len = (size_t)(ps->p - s);
    if (len >= sizeof tmp)
        return jfail(ps, "number too long");
    memcpy(tmp, s, len);
    tmp[len] = '\0';
    if (is_int) {
        errno = 0;
        out->i = strtoll(tmp, NULL, 10);
        if (errno != ERANGE) {
            out->t = J_INT;
            out->d = (double)out->i;
            return 0;
        }
    }
    out->t = J_DOUBLE;
    out->d = strtod(tmp, NULL);
    return 0;
}

static int jparse_value(jparser *ps, jval *out, int depth);

static int jpush(jparser *ps, jval *v, size_t *cap, int with_keys)
{
    if (v->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 4;
        jval *ni = realloc(v->items, nc * sizeof *ni);
        if (!ni)
            return jfail(ps, "out of memory");
        v->items = ni;
        if (with_keys) {
            char **nk = realloc(v->keys, nc * sizeof *nk);
            if (!nk)
                return jfail(ps, "out of memory");
            v->keys = nk;
        }
        *cap = nc;
    }
    memset(&v->items[v->n], 0, sizeof v->items[v->n]);
    if (with_keys)
        v->keys[v->n] = NULL;
    v->n++;
    return 0;
}

static int jparse_value(jparser *ps, jval *out, int depth)
{
    memset(out, 0, sizeof *out);
    if (depth > 64)
        return jfail(ps, "nested too deep");
    jskip_ws(ps);
    if (ps->p >= ps->end)
        return jfail(ps, "unexpected end");
    switch (*ps->p) {
    case '{': {
        size_t cap = 0;
        out->t = J_OBJECT;
        ps->p++;
        jskip_ws(ps);
        if (ps->p < ps->end && *ps->p == '}') {
            ps->p++;
            return 0;
        }
        for (;;) {
            jskip_ws(ps);
            if (jpush(ps, out, &cap, 1))
                return -1;
            if (jparse_string(ps, &out->keys[out->n - 1]))
                return -1;
            jskip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':')
                return jfail(ps, "expected ':'");
            ps->p++;
            if (jparse_value(ps, &out->items[out->n - 1], depth + 1))
                return -1;
            jskip_ws(ps);
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                continue;
            }
            if (ps->p < ps->end && *ps->p == '}') {
                ps->p++;
                return 0;
            }
            return jfail(ps, "expected ',' or '}'");
        }
    }
    case '[': {
        size_t cap = 0;
        out->t = J_ARRAY;
        ps->p++;
        jskip_ws(ps);
        if (ps->p < ps->end && *ps->p == ']') {
            ps->p++;
            return 0;
        }
        for (;;) {
            if (jpush(ps, out, &cap, 0))
                return -1;
            if (jparse_value(ps, &out->items[out->n - 1], depth + 1))
                return -1;
            jskip_ws(ps);
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                continue;
            }
            if (ps->p < ps->end && *ps->p == ']') {
                ps->p++;
                return 0;
            }
            return jfail(ps, "expected ',' or ']'");
        }
    }
    case '"':
        out->t = J_STRING;
        return jparse_string(ps, &out->s);
    case 't':
        if (ps->end - ps->p >= 4 && !memcmp(ps->p, "true", 4)) {
            ps->p += 4;
            out->t = J_BOOL;
            out->b = 1;
            return 0;
        }
        return jfail(ps, "bad literal");
    case 'f':
        if (ps->end - ps->p >= 5 && !memcmp(ps->p, "false", 5)) {
            ps->p += 5;
            out->t = J_BOOL;
            return 0;
        }
        return jfail(ps, "bad literal");
    case 'n':
        if (ps->end - ps->p >= 4 && !memcmp(ps->p, "null", 4)) {
            ps->p += 4;
            out->t = J_NULL;
            return 0;
        }
        return jfail(ps, "bad literal");
    default:
        return jparse_number(ps, out);
    }
}

/* Parses the whole buffer; on failure *out holds nothing and err says why. */
static int jparse(const char *buf, size_t len, jval *out, char *err, size_t errlen)
{
    jparser ps;
    memset(&ps, 0, sizeof ps);
    ps.start = ps.p = buf;
    ps.end = buf + len;
    if (jparse_value(&ps, out, 0) == 0) {
        jskip_ws(&ps);
        if (ps.p == ps.end)
            return 0;
        jfail(&ps, "trailing data");
    }
    jfree(out);
    snprintf(err, errlen, "%s", ps.err);
    return -1;
}

/* ------------------------------------------------------------------ state */

#define MAX_GPUS 64
#define NO_INSTANCE 0xFFFFFFFFu

typedef struct {
    unsigned pid;
    unsigned long long mem;
    unsigned gi, ci;
} sproc;

typedef struct {
    unsigned index;
    char uuid[96];
    char name[96];
    char pci[32];
    char pci_legacy[16];
    unsigned domain, bus, dev, func;
    unsigned pci_device_id, pci_subsystem_id;
    unsigned minor;
    unsigned long long mem_total, mem_used;
    unsigned util_gpu, util_mem;
    unsigned power_mw;
    unsigned long long energy_mj;
    unsigned temperature;
    int mig_supported;
    unsigned mig_mode, mig_pending;
    int numa_supported;
    int numa_node;
    unsigned long long supported_events;
    int missing;
    size_t nprocs;
    sproc *procs;
} sgpu;

typedef struct {
    unsigned gpu;
    unsigned long long type, data;
    long long seq;
    unsigned gi, ci;
} sevent;

typedef struct {
    char driver[80];
    int cuda_version;
    size_t ngpus;
    sgpu *by_index[MAX_GPUS]; /* into gpus, by GPU index */
    sgpu *gpus;
    int topo[MAX_GPUS][MAX_GPUS];
    unsigned char nvlink[MAX_GPUS][MAX_GPUS];
    size_t nevents;
    sevent *events;
} sstate;

static void state_free(sstate *st)
{
    size_t k;
    if (!st)
        return;
    for (k = 0; k < st->ngpus; k++)
        free(st->gpus[k].procs);
    free(st->gpus);
    free(st->events);
    free(st);
}

typedef struct {
    char err[300];
} conv;

static int cfail(conv *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int cfail(conv *c, const char *fmt, ...)
{
    va_list ap;
    if (c->err[0])
        return -1;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return -1;
}

static const jval *jget(const jval *obj, const char *key)
{
    size_t k;
    for (k = 0; k < obj->n; k++)
        if (!strcmp(obj->keys[k], key))
            return &obj->items[k];
    return NULL;
}

/* Every key of obj must be one of allowed (NULL-terminated) or start with '_'. */
static int check_keys(conv *c, const jval *obj, const char *const *allowed, const char *where)
{
    size_t k;
    for (k = 0; k < obj->n; k++) {
        const char *const *a;
        int ok = obj->keys[k][0] == '_';
        for (a = allowed; !ok && *a; a++)
            ok = !strcmp(*a, obj->keys[k]);
        if (!ok)
            return cfail(c, "%s: unknown key \"%s\"", where, obj->keys[k]);
    }
    return 0;
}

static int as_int(conv *c, const jval *v, long long lo, long long hi, const char *where,
                  long long *out)
{
    if (v->t == J_INT) {
        *out = v->i;
    } else if (v->t == J_DOUBLE && v->d >= -9.2e18 && v->d <= 9.2e18 &&
               (double)(long long)v->d == v->d) {
        *out = (long long)v->d;
    } else {
        return cfail(c, "%s: expected an integer", where);
    }
    if (*out < lo || *out > hi)
        return cfail(c, "%s: %lld out of range [%lld, %lld]", where, *out, lo, hi);
    return 0;
}

static int get_u64(conv *c, const jval *obj, const char *key, const char *where,
                   unsigned long long dflt, unsigned long long *out)
{
    const jval *v = jget(obj, key);
    long long x;
    char w[160];
    if (!v) {
        *out = dflt;
        return 0;
    }
    snprintf(w, sizeof w, "%s.%s", where, key);
    if (as_int(c, v, 0, INT64_MAX, w, &x))
        return -1;
    *out = (unsigned long long)x;
    return 0;
}

static int get_u32(conv *c, const jval *obj, const char *key, const char *where, unsigned dflt,
                   unsigned *out)
{
    const jval *v = jget(obj, key);
    long long x;
    char w[160];
    if (!v) {
        *out = dflt;
        return 0;
    }
    snprintf(w, sizeof w, "%s.%s", where, key);
    if (as_int(c, v, 0, UINT32_MAX, w, &x))
        return -1;
    *out = (unsigned)x;
    return 0;
}

static int get_str(conv *c, const jval *obj, const char *key, const char *where, char *out,
                   size_t outlen)
{
    const jval *v = jget(obj, key);
    if (!v)
        return 0; /* out already holds the default */
    if (v->t != J_STRING)
        return cfail(c, "%s.%s: expected a string", where, key);
    if (strlen(v->s) >= outlen)
        return cfail(c, "%s.%s: longer than %zu bytes", where, key, outlen - 1);
    strcpy(out, v->s);
    return 0;
}

static int parse_bus_id(const char *s, unsigned *dom, unsigned *bus, unsigned *dev,
                        unsigned *func)
{
    char tail;
    if (sscanf(s, "%x:%x:%x.%x%c", dom, bus, dev, func, &tail) == 4)
        return 0;
    *dom = 0;
    if (sscanf(s, "%x:%x.%x%c", bus, dev, func, &tail) == 3)
        return 0;
    return -1;
}

static int event_type(conv *c, const jval *v, const char *where, unsigned long long *out)
{
    static const struct {
        const char *name;
        unsigned long long bit;
    } names[] = {
        {"single_bit_ecc", 0x1},  {"double_bit_ecc", 0x2},       {"pstate", 0x4},
        {"xid", 0x8},             {"clock", 0x10},               {"power_source_change", 0x80},
        {"mig_config_change", 0x100},
    };
    size_t k;
    long long x;
    if (v->t == J_STRING) {
        for (k = 0; k < sizeof names / sizeof names[0]; k++)
            if (!strcmp(names[k].name, v->s)) {
                *out = names[k].bit;
                return 0;
            }
        return cfail(c, "%s: unknown event type \"%s\"", where, v->s);
    }
    if (as_int(c, v, 1, INT64_MAX, where, &x))
        return -1;
    *out = (unsigned long long)x;
    return 0;
}

static int conv_gpu(conv *c, const jval *g, size_t pos, sgpu *out)
{
    static const char *const keys[] = {
        "index", "uuid", "name", "pci_bus_id", "pci_device_id", "pci_subsystem_id",
        "minor_number", "memory_total", "memory_used", "utilization_gpu", "utilization_memory",
        "power_mw", "energy_mj", "temperature_c", "mig_mode", "mig_pending", "numa_node",
        "supported_events", "processes", "missing", NULL,
    };
    char where[64];
    unsigned idx;
    const jval *v;
    long long x;
    size_t k;

    snprintf(where, sizeof where, "gpus[%zu]", pos);
    if (g->t != J_OBJECT)
        return cfail(c, "%s: expected an object", where);
    if (check_keys(c, g, keys, where))
        return -1;
    if (get_u32(c, g, "index", where, (unsigned)pos, &idx))
        return -1;
    if (idx >= MAX_GPUS)
        return cfail(c, "%s.index: %u is not below %d", where, idx, MAX_GPUS);
    out->index = idx;
    snprintf(out->uuid, sizeof out->uuid, "GPU-5afe0000-0000-4000-8000-%012x", idx);
    snprintf(out->name, sizeof out->name, "NVIDIA H100 80GB HBM3");
    snprintf(out->pci, sizeof out->pci, "00000000:%02X:00.0", 0x10 + idx);
    if (get_str(c, g, "uuid", where, out->uuid, sizeof out->uuid) ||
        get_str(c, g, "name", where, out->name, sizeof out->name) ||
        get_str(c, g, "pci_bus_id", where, out->pci, sizeof out->pci))
        return -1;
    if (parse_bus_id(out->pci, &out->domain, &out->bus, &out->dev, &out->func) ||
        out->bus > 0xFF || out->dev > 0x1F || out->func > 7)
        return cfail(c, "%s.pci_bus_id: \"%s\" is not DOMAIN:BUS:DEVICE.FUNCTION", where,
                     out->pci);
    snprintf(out->pci, sizeof out->pci, "%08X:%02X:%02X.%X", out->domain, out->bus, out->dev,
             out->func);
    snprintf(out->pci_legacy, sizeof out->pci_legacy, "%04X:%02X:%02X.%X",
             out->domain & 0xFFFF, out->bus, out->dev, out->func);
    if (get_u32(c, g, "pci_device_id", where, 0x233010DEu, &out->pci_device_id) ||
        get_u32(c, g, "pci_subsystem_id", where, 0x16C110DEu, &out->pci_subsystem_id) ||
        get_u32(c, g, "minor_number", where, idx, &out->minor) ||
        get_u64(c, g, "memory_total", where, 85520809984ULL, &out->mem_total) ||
        get_u64(c, g, "memory_used", where, 0, &out->mem_used) ||
        get_u32(c, g, "utilization_gpu", where, 0, &out->util_gpu) ||
        get_u32(c, g, "utilization_memory", where, 0, &out->util_mem) ||
        get_u32(c, g, "power_mw", where, 70000, &out->power_mw) ||
        get_u64(c, g, "energy_mj", where, 0, &out->energy_mj) ||
        get_u32(c, g, "temperature_c", where, 35, &out->temperature) ||
        get_u64(c, g, "supported_events", where, 0x19F, &out->supported_events))
        return -1;
    if (out->mem_used > out->mem_total)
        return cfail(c, "%s: memory_used exceeds memory_total", where);
    if (out->util_gpu > 100 || out->util_mem > 100)
        return cfail(c, "%s: utilization above 100", where);

    out->mig_supported = 1;
    out->mig_mode = 0;
    v = jget(g, "mig_mode");
    if (v && v->t == J_NULL) {
        out->mig_supported = 0;
    } else if (v) {
        if (as_int(c, v, 0, 1, where, &x))
            return -1;
        out->mig_mode = (unsigned)x;
    }
    if (get_u32(c, g, "mig_pending", where, out->mig_mode, &out->mig_pending))
        return -1;
    if (out->mig_pending > 1)
        return cfail(c, "%s.mig_pending: expected 0 or 1", where);

    out->numa_supported = 1;
    out->numa_node = 0;
    v = jget(g, "numa_node");
    if (v && v->t == J_NULL) {
        out->numa_supported = 0;
    } else if (v) {
        if (as_int(c, v, -1, 4096, where, &x))
            return -1;
        out->numa_node = (int)x;
    }

    v = jget(g, "missing");
    if (v && v->t != J_BOOL)
        return cfail(c, "%s.missing: expected true or false", where);
    out->missing = v ? v->b : 0;

    v = jget(g, "processes");
    if (v && v->t != J_ARRAY)
        return cfail(c, "%s.processes: expected an array", where);
    if (v && v->n) {
        static const char *const pkeys[] = {"pid", "used_memory", "gpu_instance_id",
                                            "compute_instance_id", NULL};
        out->procs = calloc(v->n, sizeof *out->procs);
        if (!out->procs)
            return cfail(c, "out of memory");
        out->nprocs = v->n;
        for (k = 0; k < v->n; k++) {
            const jval *p = &v->items[k], *m;
            sproc *sp = &out->procs[k];
            char pw[96];
            snprintf(pw, sizeof pw, "%s.processes[%zu]", where, k);
            if (p->t != J_OBJECT)
                return cfail(c, "%s: expected an object", pw);
            if (check_keys(c, p, pkeys, pw))
                return -1;
            if (!jget(p, "pid"))
                return cfail(c, "%s: needs a pid", pw);
            if (get_u32(c, p, "pid", pw, 0, &sp->pid) ||
                get_u32(c, p, "gpu_instance_id", pw, NO_INSTANCE, &sp->gi) ||
                get_u32(c, p, "compute_instance_id", pw, NO_INSTANCE, &sp->ci))
                return -1;
            m = jget(p, "used_memory");
            if (m && m->t == J_NULL)
                sp->mem = ~0ULL;
            else if (get_u64(c, p, "used_memory", pw, 0, &sp->mem))
                return -1;
        }
    }
    return 0;
}

static int conv_pair_index(conv *c, const sstate *st, const jval *v, const char *where,
                           unsigned *out)
{
    long long x;
    if (as_int(c, v, 0, (long long)st->ngpus - 1, where, &x))
        return -1;
    *out = (unsigned)x;
    return 0;
}

static sstate *conv_state(conv *c, const jval *root)
{
    static const char *const keys[] = {"driver_version", "cuda_driver_version", "gpus",
                                       "topology", "nvlink", "events", NULL};
    sstate *st;
    const jval *v;
    size_t k, m;
    unsigned cuda;

    if (root->t != J_OBJECT) {
        cfail(c, "the top level must be an object");
        return NULL;
    }
    if (check_keys(c, root, keys, "state"))
        return NULL;
    st = calloc(1, sizeof *st);
    if (!st) {
        cfail(c, "out of memory");
        return NULL;
    }
    snprintf(st->driver, sizeof st->driver, "550.54.15");
    if (get_str(c, root, "driver_version", "state", st->driver, sizeof st->driver) ||
        get_u32(c, root, "cuda_driver_version", "state", 12040, &cuda))
        goto bad;
    st->cuda_version = (int)cuda;

    v = jget(root, "gpus");
    if (v && v->t != J_ARRAY) {
        cfail(c, "gpus: expected an array");
        goto bad;
    }
    if (v && v->n) {
        if (v->n > MAX_GPUS) {
            cfail(c, "gpus: more than %d", MAX_GPUS);
            goto bad;
        }
        st->gpus = calloc(v->n, sizeof *st->gpus);
        if (!st->gpus) {
            cfail(c, "out of memory");
            goto bad;
        }
        for (k = 0; k < v->n; k++) {
            st->ngpus = k + 1; /* so state_free frees what conv_gpu allocated */
            if (conv_gpu(c, &v->items[k], k, &st->gpus[k]))
                goto bad;
        }
        for (k = 0; k < st->ngpus; k++) {
            unsigned idx = st->gpus[k].index;
            if (idx >= st->ngpus) {
                cfail(c, "gpus[%zu].index: %u, but there are %zu GPUs (indices are 0..n-1)",
                      k, idx, st->ngpus);
                goto bad;
            }
            if (st->by_index[idx]) {
                cfail(c, "gpus[%zu].index: %u appears twice", k, idx);
                goto bad;
            }
            st->by_index[idx] = &st->gpus[k];
        }
    }

    for (k = 0; k < MAX_GPUS; k++)
        for (m = 0; m < MAX_GPUS; m++)
            st->topo[k][m] = k == m ? 0 : 50;
    v = jget(root, "topology");
    if (v) {
        if (v->t != J_ARRAY || v->n != st->ngpus) {
            cfail(c, "topology: expected %zu rows", st->ngpus);
            goto bad;
        }
        for (k = 0; k < v->n; k++) {
            const jval *row = &v->items[k];
            if (row->t != J_ARRAY || row->n != st->ngpus) {
                cfail(c, "topology[%zu]: expected a row of %zu levels", k, st->ngpus);
                goto bad;
            }
            for (m = 0; m < row->n; m++) {
                long long x;
                char w[64];
                snprintf(w, sizeof w, "topology[%zu][%zu]", k, m);
                if (as_int(c, &row->items[m], 0, 50, w, &x))
                    goto bad;
                if (x % 10) {
                    cfail(c, "%s: %lld is not a topology level (0, 10, ..., 50)", w, x);
                    goto bad;
                }
                st->topo[k][m] = (int)x;
            }
        }
    }

    v = jget(root, "nvlink");
    if (v) {
        if (v->t != J_ARRAY) {
            cfail(c, "nvlink: expected an array of [i, j] pairs");
            goto bad;
        }
        for (k = 0; k < v->n; k++) {
            const jval *pair = &v->items[k];
            unsigned a, b;
            char w[64];
            snprintf(w, sizeof w, "nvlink[%zu]", k);
            if (pair->t != J_ARRAY || pair->n != 2) {
                cfail(c, "%s: expected [i, j]", w);
                goto bad;
            }
            if (conv_pair_index(c, st, &pair->items[0], w, &a) ||
                conv_pair_index(c, st, &pair->items[1], w, &b))
                goto bad;
            if (a == b) {
                cfail(c, "%s: a GPU paired with itself", w);
                goto bad;
            }
            st->nvlink[a][b] = st->nvlink[b][a] = 1;
        }
    }

    v = jget(root, "events");
    if (v && v->t != J_ARRAY) {
        cfail(c, "events: expected an array");
        goto bad;
    }
    if (v && v->n) {
        static const char *const ekeys[] = {"gpu",  "type",
                                            "data", "seq",
                                            "gpu_instance_id", "compute_instance_id",
                                            NULL};
        st->events = calloc(v->n, sizeof *st->events);
        if (!st->events) {
            cfail(c, "out of memory");
            goto bad;
        }
        st->nevents = v->n;
        for (k = 0; k < v->n; k++) {
            const jval *e = &v->items[k], *f;
            sevent *se = &st->events[k];
            char w[64];
            long long x;
            snprintf(w, sizeof w, "events[%zu]", k);
            if (e->t != J_OBJECT) {
                cfail(c, "%s: expected an object", w);
                goto bad;
            }
            if (check_keys(c, e, ekeys, w))
                goto bad;
            f = jget(e, "gpu");
            if (!f || conv_pair_index(c, st, f, w, &se->gpu)) {
                cfail(c, "%s.gpu: needs the index of a GPU", w);
                goto bad;
            }
            f = jget(e, "type");
            if (!f) {
                cfail(c, "%s: needs a type", w);
                goto bad;
            }
            if (event_type(c, f, w, &se->type))
                goto bad;
            f = jget(e, "seq");
            if (!f) {
                cfail(c, "%s: needs a seq", w);
                goto bad;
            }
            if (as_int(c, f, INT64_MIN, INT64_MAX, w, &x))
                goto bad;
            se->seq = x;
            for (m = 0; m < k; m++)
                if (st->events[m].gpu == se->gpu && st->events[m].seq == se->seq) {
                    cfail(c, "%s: gpu %u has seq %lld twice", w, se->gpu, se->seq);
                    goto bad;
                }
            if (get_u64(c, e, "data", w, 0, &se->data) ||
                get_u32(c, e, "gpu_instance_id", w, NO_INSTANCE, &se->gi) ||
                get_u32(c, e, "compute_instance_id", w, NO_INSTANCE, &se->ci))
                goto bad;
        }
    }
    return st;
bad:
    state_free(st);
    return NULL;
}

/* ------------------------------------------------------------------ globals */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_refcount;
static char *g_path;
static char *g_raw;      /* the file's bytes when last read (good or not) */
static size_t g_raw_len;
static sstate *g_state;  /* the last good state */
static struct nvmlDevice_st g_dev[MAX_GPUS];

struct delivered {
    unsigned gpu;
    long long seq;
};

struct nvmlEventSet_st {
    struct nvmlEventSet_st *next;
    unsigned long long mask[MAX_GPUS];
    size_t ndelivered, cap;
    struct delivered *delivered;
};
typedef struct nvmlEventSet_st *nvmlEventSet_t;

static struct nvmlEventSet_st *g_sets;

__attribute__((constructor)) static void standin_init(void)
{
    unsigned k;
    for (k = 0; k < MAX_GPUS; k++)
        g_dev[k].index = k;
}

static int read_file(const char *path, char **out, size_t *outlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    size_t cap = 4096, len = 0;
    char *buf;
    if (fd < 0)
        return -1;
    buf = malloc(cap);
    if (!buf) {
        close(fd);
        return -1;
    }
    for (;;) {
        ssize_t r;
        if (len == cap) {
            char *nb;
            if (cap >= (64u << 20)) {
                free(buf);
                close(fd);
                return -1;
            }
            nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                close(fd);
                return -1;
            }
            buf = nb;
            cap *= 2;
        }
        r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            free(buf);
            close(fd);
            return -1;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    *out = buf;
    *outlen = len;
    return 0;
}

/* Under g_lock: bring g_state up to date with the file. */
static nvmlReturn_t refresh(void)
{
    char *buf, err[200];
    size_t len;
    jval root;
    conv c;
    sstate *st;

    if (read_file(g_path, &buf, &len)) {
        if (g_state)
            return NVML_SUCCESS; /* keep the last good state */
        fprintf(stderr, "libnvidia-ml stand-in: cannot read %s: %s\n", g_path,
                strerror(errno));
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    if (g_raw && len == g_raw_len && !memcmp(buf, g_raw, len)) {
        free(buf);
        return g_state ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
    }
    free(g_raw);
    g_raw = buf;
    g_raw_len = len;
    if (jparse(buf, len, &root, err, sizeof err)) {
        fprintf(stderr, "libnvidia-ml stand-in: %s: %s%s\n", g_path, err,
                g_state ? " (keeping the previous state)" : "");
        return g_state ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
    }
    memset(&c, 0, sizeof c);
    st = conv_state(&c, &root);
    jfree(&root);
    if (!st) {
        fprintf(stderr, "libnvidia-ml stand-in: %s: %s%s\n", g_path, c.err,
                g_state ? " (keeping the previous state)" : "");
        return g_state ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
    }
    state_free(g_state);
    g_state = st;
    return NVML_SUCCESS;
}

/* Locks g_lock and refreshes the state; on SUCCESS the caller must unlock. */
static nvmlReturn_t begin(void)
{
    nvmlReturn_t r;
    pthread_mutex_lock(&g_lock);
    if (!g_refcount) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    r = refresh();
    if (r != NVML_SUCCESS)
        pthread_mutex_unlock(&g_lock);
    return r;
}

static nvmlReturn_t end(nvmlReturn_t r)
{
    pthread_mutex_unlock(&g_lock);
    return r;
}

static int handle_index(nvmlDevice_t d, unsigned *idx)
{
    uintptr_t p = (uintptr_t)d, base = (uintptr_t)&g_dev[0];
    if (!d || p < base || p >= (uintptr_t)&g_dev[MAX_GPUS] || (p - base) % sizeof g_dev[0])
        return -1;
    *idx = (unsigned)((p - base) / sizeof g_dev[0]);
    return 0;
}

/* Under g_lock: the GPU that handle d names. */
static nvmlReturn_t gpu_of(nvmlDevice_t d, sgpu **out)
{
    unsigned idx;
    sgpu *g;
    if (handle_index(d, &idx))
        return NVML_ERROR_INVALID_ARGUMENT;
    g = idx < g_state->ngpus ? g_state->by_index[idx] : NULL;
    if (!g || g->missing)
        return NVML_ERROR_GPU_IS_LOST;
    *out = g;
    return NVML_SUCCESS;
}

#define BEGIN_GPU(dev, g)                                                                      \
    sgpu *g;                                                                                   \
    nvmlReturn_t r_;                                                                           \
    if ((r_ = begin()) != NVML_SUCCESS)                                                        \
        return r_;                                                                             \
    if ((r_ = gpu_of(dev, &g)) != NVML_SUCCESS)                                                \
        return end(r_);

static nvmlReturn_t copy_str(char *dst, unsigned len, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ init */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    nvmlReturn_t r;
    const char *path;
    (void)flags;
    pthread_mutex_lock(&g_lock);
    if (g_refcount) {
        g_refcount++;
        return end(NVML_SUCCESS);
    }
    path = getenv("NODUS_FAKE_NVML");
    if (!path || !*path) {
        fprintf(stderr, "libnvidia-ml stand-in: NODUS_FAKE_NVML is not set\n");
        return end(NVML_ERROR_DRIVER_NOT_LOADED);
    }
    free(g_path);
    g_path = strdup(path);
    if (!g_path)
        return end(NVML_ERROR_MEMORY);
    r = refresh();
    if (r == NVML_SUCCESS)
        g_refcount = 1;
    return end(r);
}

nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_lock);
    if (!g_refcount)
        return end(NVML_ERROR_UNINITIALIZED);
    if (--g_refcount == 0) {
        state_free(g_state);
        g_state = NULL;
        free(g_raw);
        g_raw = NULL;
        g_raw_len = 0;
    }
    return end(NVML_SUCCESS);
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

/* ------------------------------------------------------------------ system */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t r = begin();
    if (r != NVML_SUCCESS)
        return r;
    return end(copy_str(version, length, g_state->driver));
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    char buf[96];
    nvmlReturn_t r = begin();
    if (r != NVML_SUCCESS)
        return r;
    snprintf(buf, sizeof buf, "%d.%s", g_state->cuda_version / 1000, g_state->driver);
    return end(copy_str(version, length, buf));
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    nvmlReturn_t r;
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((r = begin()) != NVML_SUCCESS)
        return r;
    *cudaDriverVersion = g_state->cuda_version;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ------------------------------------------------------------------ devices */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    nvmlReturn_t r;
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((r = begin()) != NVML_SUCCESS)
        return r;
    *deviceCount = (unsigned)g_state->ngpus;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

static nvmlReturn_t handle_for(const sgpu *g, nvmlDevice_t *device)
{
    if (g->missing)
        return NVML_ERROR_GPU_IS_LOST;
    *device = &g_dev[g->index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t r;
    if (!device)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((r = begin()) != NVML_SUCCESS)
        return r;
    if (index >= g_state->ngpus)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    return end(handle_for(g_state->by_index[index], device));
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t r;
    size_t k;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((r = begin()) != NVML_SUCCESS)
        return r;
    for (k = 0; k < g_state->ngpus; k++)
        if (!strcmp(g_state->gpus[k].uuid, uuid))
            return end(handle_for(&g_state->gpus[k], device));
    return end(NVML_ERROR_NOT_FOUND);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    nvmlReturn_t r;
    unsigned dom, bus, dev, func;
    size_t k;
    if (!pciBusId || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (parse_bus_id(pciBusId, &dom, &bus, &dev, &func))
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((r = begin()) != NVML_SUCCESS)
        return r;
    for (k = 0; k < g_state->ngpus; k++) {
        const sgpu *g = &g_state->gpus[k];
        if (g->domain == dom && g->bus == bus && g->dev == dev && g->func == func)
            return end(handle_for(g, device));
    }
    return end(NVML_ERROR_NOT_FOUND);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    BEGIN_GPU(device, g);
    *index = g->index;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    if (!minorNumber)
        return NVML_ERROR_INVALID_ARGUMENT;
    BEGIN_GPU(device, g);
    *minorNumber = g->minor;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    BEGIN_GPU(device, g);
    return end(copy_str(name, length, g->name));
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    BEGIN_GPU(device, g);
    return end(copy_str(uuid, length, g->uuid));
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    BEGIN_GPU(device, g);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", g->pci_legacy);
    pci->domain = g->domain;
    pci->bus = g->bus;
    pci->device = g->dev;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
    snprintf(pci->busId, sizeof pci->busId, "%s", g->pci);
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    BEGIN_GPU(device, g);
    memory->total = g->mem_total;
    memory->used = g->mem_used;
    memory->free = g->mem_total - g->mem_used;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != NVML_MEMORY_V2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    BEGIN_GPU(device, g);
    memory->total = g->mem_total;
    memory->reserved = 0;
    memory->used = g->mem_used;
    memory->free = g->mem_total - g->mem_used;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    BEGIN_GPU(device, g);
    utilization->gpu = g->util_gpu;
    utilization->memory = g->util_mem;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    if (!power)
        return NVML_ERROR_INVALID_ARGUMENT;
    BEGIN_GPU(device, g);
    *power = g->power_mw;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device,
                                                 unsigned long long *energy)
{
    if (!energy)
        return NVML_ERROR_INVALID_ARGUMENT;
    BEGIN_GPU(device, g);
    *energy = g->energy_mj;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType,
                                      unsigned int *temp)
{
    if (!temp)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    BEGIN_GPU(device, g);
    *temp = g->temperature;
    return end(NVML_SUCCESS);
}

static nvmlReturn_t list_procs(const sproc *procs, size_t n, unsigned int *infoCount,
                               nvmlProcessInfo_t *infos)
{
    size_t k;
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (*infoCount < n) {
        *infoCount = (unsigned)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n && !infos)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (k = 0; k < n; k++) {
        infos[k].pid = procs[k].pid;
        infos[k].usedGpuMemory = procs[k].mem;
        infos[k].gpuInstanceId = procs[k].gi;
        infos[k].computeInstanceId = procs[k].ci;
    }
    *infoCount = (unsigned)n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                     unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    BEGIN_GPU(device, g);
    return end(list_procs(g->procs, g->nprocs, infoCount, infos));
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                     unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return nvmlDeviceGetComputeRunningProcesses_v3(device, infoCount, infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                      unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos)
{
    BEGIN_GPU(device, g);
    (void)g;
    return end(list_procs(NULL, 0, infoCount, infos));
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                        unsigned int *infoCount,
                                                        nvmlProcessInfo_t *infos)
{
    return nvmlDeviceGetGraphicsRunningProcesses_v3(device, infoCount, infos);
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                 int *pathInfo)
{
    sgpu *g2;
    if (!pathInfo)
        return NVML_ERROR_INVALID_ARGUMENT;
    BEGIN_GPU(device1, g1);
    if ((r_ = gpu_of(device2, &g2)) != NVML_SUCCESS)
        return end(r_);
    *pathInfo = g_state->topo[g1->index][g2->index];
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2, int p2pIndex,
                                    int *p2pStatus)
{
    sgpu *g2;
    int nvlink;
    if (!p2pStatus || p2pIndex < NVML_P2P_CAPS_INDEX_READ || p2pIndex > NVML_P2P_CAPS_INDEX_PCI)
        return NVML_ERROR_INVALID_ARGUMENT;
    BEGIN_GPU(device1, g1);
    if ((r_ = gpu_of(device2, &g2)) != NVML_SUCCESS)
        return end(r_);
    if (g1 == g2)
        return end(NVML_ERROR_INVALID_ARGUMENT);
    nvlink = g_state->nvlink[g1->index][g2->index];
    if (p2pIndex == NVML_P2P_CAPS_INDEX_NVLINK)
        *p2pStatus = nvlink ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED;
    else
        *p2pStatus = nvlink || g_state->topo[g1->index][g2->index] <= 30
                         ? NVML_P2P_STATUS_OK
                         : NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode)
{
    if (!currentMode || !pendingMode)
        return NVML_ERROR_INVALID_ARGUMENT;
    BEGIN_GPU(device, g);
    if (!g->mig_supported)
        return end(NVML_ERROR_NOT_SUPPORTED);
    *currentMode = g->mig_mode;
    *pendingMode = g->mig_pending;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    if (!node)
        return NVML_ERROR_INVALID_ARGUMENT;
    BEGIN_GPU(device, g);
    if (!g->numa_supported)
        return end(NVML_ERROR_NOT_SUPPORTED);
    *node = (unsigned)g->numa_node;
    return end(NVML_SUCCESS);
}

/* ------------------------------------------------------------------ events */

static int set_is_live(nvmlEventSet_t set)
{
    struct nvmlEventSet_st *s;
    for (s = g_sets; s; s = s->next)
        if (s == set)
            return 1;
    return 0;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    struct nvmlEventSet_st *s;
    nvmlReturn_t r;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((r = begin()) != NVML_SUCCESS)
        return r;
    s = calloc(1, sizeof *s);
    if (!s)
        return end(NVML_ERROR_MEMORY);
    s->next = g_sets;
    g_sets = s;
    *set = s;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    struct nvmlEventSet_st **pp;
    pthread_mutex_lock(&g_lock);
    if (!g_refcount)
        return end(NVML_ERROR_UNINITIALIZED);
    for (pp = &g_sets; *pp; pp = &(*pp)->next)
        if (*pp == set) {
            *pp = set->next;
            free(set->delivered);
            free(set);
            return end(NVML_SUCCESS);
        }
    return end(NVML_ERROR_INVALID_ARGUMENT);
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                              unsigned long long *eventTypes)
{
    if (!eventTypes)
        return NVML_ERROR_INVALID_ARGUMENT;
    BEGIN_GPU(device, g);
    *eventTypes = g->supported_events;
    return end(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                      nvmlEventSet_t set)
{
    BEGIN_GPU(device, g);
    if (!set_is_live(set))
        return end(NVML_ERROR_INVALID_ARGUMENT);
    if (eventTypes & ~g->supported_events)
        return end(NVML_ERROR_NOT_SUPPORTED);
    set->mask[g->index] |= eventTypes;
    return end(NVML_SUCCESS);
}

static int was_delivered(const struct nvmlEventSet_st *s, const sevent *e)
{
    size_t k;
    for (k = 0; k < s->ndelivered; k++)
        if (s->delivered[k].gpu == e->gpu && s->delivered[k].seq == e->seq)
            return 1;
    return 0;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                 unsigned int timeoutms)
{
    double deadline = now_ms() + timeoutms;
    if (!data)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (;;) {
        const sevent *best = NULL;
        nvmlReturn_t r = begin();
        size_t k;
        double left;
        struct timespec ts;
        if (r != NVML_SUCCESS)
            return r;
        if (!set_is_live(set))
            return end(NVML_ERROR_INVALID_ARGUMENT);
        for (k = 0; k < g_state->nevents; k++) {
            const sevent *e = &g_state->events[k];
            if (!(set->mask[e->gpu] & e->type) || was_delivered(set, e))
                continue;
            if (!best || e->seq < best->seq || (e->seq == best->seq && e->gpu < best->gpu))
                best = e;
        }
        if (best) {
            if (set->ndelivered == set->cap) {
                size_t nc = set->cap ? set->cap * 2 : 16;
                struct delivered *nd = realloc(set->delivered, nc * sizeof *nd);
                if (!nd)
                    return end(NVML_ERROR_MEMORY);
                set->delivered = nd;
                set->cap = nc;
            }
            set->delivered[set->ndelivered].gpu = best->gpu;
            set->delivered[set->ndelivered].seq = best->seq;
            set->ndelivered++;
            memset(data, 0, sizeof *data);
            data->device = &g_dev[best->gpu];
            data->eventType = best->type;
            data->eventData = best->data;
            data->gpuInstanceId = best->gi;
            data->computeInstanceId = best->ci;
            return end(NVML_SUCCESS);
        }
        end(NVML_SUCCESS);
        left = deadline - now_ms();
        if (left <= 0)
            return NVML_ERROR_TIMEOUT;
        if (left > 5)
            left = 5;
        ts.tv_sec = 0;
        ts.tv_nsec = (long)(left * 1e6);
        nanosleep(&ts, NULL);
    }
}

nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    return nvmlEventSetWait_v2(set, data, timeoutms);
}
