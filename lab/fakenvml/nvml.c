/* Fake libnvidia-ml.so.1: answers the NVML C API from a JSON GPU spec (lab/specs/README.md),
 * with NVML's own error codes, so that the real nvidia-ml-py (and any NVML client) can be tested
 * without a GPU. Compute processes come from registration files (lab/fakenvml/README.md). */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvml_api.h"
#include "spec.h"

#define DEFAULT_SPEC "/etc/fake-nvml/spec.json"
#define DEFAULT_STATE_DIR "/run/fake-nvml"
#define MAX_PROCS 256
#define EXPORT __attribute__((visibility("default")))

struct nvmlDevice_st {
    int unused;
};

/* Handles point into this array and stay valid for the life of the process, so a handle kept
 * across nvmlShutdown / nvmlInit with another spec is checked, never dereferenced blindly. */
static struct nvmlDevice_st g_devices[FN_MAX_GPUS];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fn_spec *g_spec;  /* spec of the last successful init */
static int g_refcount;          /* nvmlInit calls not yet matched by nvmlShutdown */
static char g_state_dir[4096];
/* nvmlErrorString(NVML_ERROR_UNKNOWN) after an nvmlInit that failed on a malformed spec: the real text, then the
 * spec's error, so a client that asks the library for the text (topolaunch's gpu_topology does) shows the field. */
static char g_init_error[1200];

#define LOCKED(call)                        \
    do {                                    \
        pthread_mutex_lock(&g_lock);        \
        nvmlReturn_t locked_rc_ = (call);   \
        pthread_mutex_unlock(&g_lock);      \
        return locked_rc_;                  \
    } while (0)

static int unsupported(enum fn_feature f)
{
    return (g_spec->not_supported >> f) & 1u;
}

/* ---- init / shutdown ------------------------------------------------------------------------ */

static nvmlReturn_t do_init(void)
{
    const char *path = getenv("FAKE_NVML_SPEC");
    if (!path || !*path)
        path = DEFAULT_SPEC;
    struct fn_spec *spec = malloc(sizeof(*spec));
    if (!spec)
        return NVML_ERROR_MEMORY;
    char err[1024];
    int rc = fn_spec_load(path, spec, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "fake-nvml: %s\n", err);
        if (rc == NVML_ERROR_UNKNOWN)
            snprintf(g_init_error, sizeof(g_init_error), "Unknown Error: fake-nvml: %s", err);
        free(spec);
        return rc;
    }
    g_init_error[0] = '\0';
    free(g_spec);
    g_spec = spec;
    const char *dir = getenv("FAKE_NVML_STATE_DIR");
    snprintf(g_state_dir, sizeof(g_state_dir), "%s", dir && *dir ? dir : DEFAULT_STATE_DIR);
    g_refcount++;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    LOCKED(do_init());
}
EXPORT nvmlReturn_t nvmlInit_v2(void) { LOCKED(do_init()); }
EXPORT nvmlReturn_t nvmlInit(void) { LOCKED(do_init()); }

static nvmlReturn_t do_shutdown(void)
{
    if (g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    g_refcount--;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlShutdown(void) { LOCKED(do_shutdown()); }

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
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
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    case NVML_ERROR_UNKNOWN: return g_init_error[0] ? g_init_error : "Unknown Error";
    default: return "Unknown Error";
    }
}

/* ---- helpers -------------------------------------------------------------------------------- */

static nvmlReturn_t ready(void)
{
    return g_refcount > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

/* Handle -> GPU of the current spec, checking that it is one of ours and still exists. */
static nvmlReturn_t gpu_of(nvmlDevice_t h, const struct fn_gpu **g, int *index)
{
    if (g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    uintptr_t p = (uintptr_t)h, base = (uintptr_t)g_devices;
    if (p < base || p >= base + sizeof(g_devices) || (p - base) % sizeof(g_devices[0]) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    int i = (int)((p - base) / sizeof(g_devices[0]));
    if (i >= g_spec->count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *g = &g_spec->gpus[i];
    if (index)
        *index = i;
    return NVML_SUCCESS;
}

#define NO_FEATURE (-1)

/* The start of every device query: initialized, a handle of the current spec, the output pointers
 * given (outputs_ok), and the feature not listed in "not_supported" (NO_FEATURE: always supported). */
static nvmlReturn_t device_query(nvmlDevice_t h, int outputs_ok, int feature, const struct fn_gpu **g, int *index)
{
    nvmlReturn_t rc = gpu_of(h, g, index);
    if (rc)
        return rc;
    if (!outputs_ok)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (feature != NO_FEATURE && unsupported((enum fn_feature)feature))
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(char *dst, unsigned int length, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

static void fill_pci(nvmlPciInfo_t *pci, unsigned domain, unsigned bus, unsigned device, unsigned function)
{
    memset(pci, 0, sizeof(*pci));
    pci->domain = domain;
    pci->bus = bus;
    pci->device = device;
    pci->pciDeviceId = 0x10DE; /* NVIDIA vendor id in the low half; the device id is not modelled */
    snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.%X", domain, bus, device, function);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.%X", domain & 0xFFFF, bus & 0xFF,
             device & 0xFF, function & 0xF);
}

/* ---- registered compute processes ----------------------------------------------------------- */

struct proc {
    unsigned int pid;
    unsigned long long used;
};

/* Field 22 (starttime) of /proc/<pid>/stat, or -1 when the process is gone or a zombie. */
static long long proc_starttime(unsigned int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%u/stat", pid);
    FILE *fp = fopen(path, "r");
    if (!fp)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* comm may hold spaces and parentheses */
    if (!p || p[1] != ' ')
        return -1;
    p += 2;
    if (*p == 'Z' || *p == 'X')
        return -1; /* exited: a real driver has freed its memory */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return -1;
        p++;
    }
    char *end;
    long long t = strtoll(p, &end, 10);
    return end == p ? -1 : t;
}

static int parse_uint(const char *s, const char *end, unsigned long long *out)
{
    if (s == end)
        return -1;
    unsigned long long v = 0;
    for (; s < end; s++) {
        if (*s < '0' || *s > '9' || v > 0xFFFFFFFFFFFFFULL)
            return -1;
        v = v * 10 + (unsigned long long)(*s - '0');
    }
    *out = v;
    return 0;
}

static int by_pid(const void *a, const void *b)
{
    const struct proc *x = a, *y = b;
    return x->pid < y->pid ? -1 : x->pid > y->pid;
}

/* Live registrations on GPU gpu, sorted by pid. Files: <state dir>/<pid>.<gpu> = "<bytes> <starttime>" or
 * "<bytes> <starttime> <reported pid>": the process <pid> (alive with that starttime) is reported as <reported pid>,
 * as the driver reports a process of another PID namespace (a container's) by its pid in the driver's namespace,
 * which this /proc may not have. */
static int registered(int gpu, struct proc *out, int max)
{
    DIR *d = opendir(g_state_dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < max) {
        const char *dot = strchr(e->d_name, '.');
        unsigned long long pid, idx, used, start;
        if (!dot || parse_uint(e->d_name, dot, &pid) < 0 || parse_uint(dot + 1, dot + strlen(dot), &idx) < 0)
            continue;
        if (idx != (unsigned long long)gpu || pid == 0 || pid > 0xFFFFFFFFULL)
            continue;
        char path[4400], buf[128];
        snprintf(path, sizeof(path), "%s/%s", g_state_dir, e->d_name);
        FILE *fp = fopen(path, "r");
        if (!fp)
            continue;
        size_t len = fread(buf, 1, sizeof(buf) - 1, fp);
        fclose(fp);
        buf[len] = '\0';
        char *sp = strchr(buf, ' ');
        char *eol = buf + strcspn(buf, "\n");
        if (!sp || sp > eol)
            continue;
        char *sp2 = memchr(sp + 1, ' ', (size_t)(eol - sp - 1));
        unsigned long long reported = pid;
        if (parse_uint(buf, sp, &used) < 0 || parse_uint(sp + 1, sp2 ? sp2 : eol, &start) < 0
            || (sp2 && (parse_uint(sp2 + 1, eol, &reported) < 0 || reported == 0 || reported > 0xFFFFFFFFULL)))
            continue;
        if (proc_starttime((unsigned int)pid) != (long long)start)
            continue; /* dead, a zombie, or the pid now belongs to another process */
        out[n].pid = (unsigned int)reported;
        out[n].used = used;
        n++;
    }
    closedir(d);
    qsort(out, (size_t)n, sizeof(out[0]), by_pid);
    return n;
}

static unsigned long long registered_bytes(int gpu)
{
    struct proc procs[MAX_PROCS];
    int n = registered(gpu, procs, MAX_PROCS);
    unsigned long long sum = 0;
    for (int i = 0; i < n; i++)
        sum += procs[i].used;
    return sum;
}

/* ---- system --------------------------------------------------------------------------------- */

static nvmlReturn_t driver_version(char *version, unsigned int length)
{
    nvmlReturn_t rc = ready();
    return rc ? rc : copy_string(version, length, g_spec->driver_version);
}
EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    LOCKED(driver_version(version, length));
}

static nvmlReturn_t nvml_version(char *version, unsigned int length)
{
    nvmlReturn_t rc = ready();
    if (rc)
        return rc;
    char buf[128];
    snprintf(buf, sizeof(buf), "%d.%s", g_spec->cuda_driver_version / 1000, g_spec->driver_version);
    return copy_string(version, length, buf);
}
EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    LOCKED(nvml_version(version, length));
}

static nvmlReturn_t cuda_version(int *version)
{
    nvmlReturn_t rc = ready();
    if (rc)
        return rc;
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    *version = g_spec->cuda_driver_version;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) { LOCKED(cuda_version(version)); }
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { LOCKED(cuda_version(version)); }

/* ---- device lookup -------------------------------------------------------------------------- */

static nvmlReturn_t device_count(unsigned int *count)
{
    nvmlReturn_t rc = ready();
    if (rc)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)g_spec->count;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { LOCKED(device_count(count)); }
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { LOCKED(device_count(count)); }

static nvmlReturn_t handle_by_index(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t rc = ready();
    if (rc)
        return rc;
    if (!device || index >= (unsigned int)g_spec->count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_devices[index];
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    LOCKED(handle_by_index(index, device));
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    LOCKED(handle_by_index(index, device));
}

/* Accepts "domain:bus:device.function" or "bus:device.function", hex, any case. */
static nvmlReturn_t handle_by_bus_id(const char *bus_id, nvmlDevice_t *device)
{
    nvmlReturn_t rc = ready();
    if (rc)
        return rc;
    if (!bus_id || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned dom = 0, bus, dev, fn;
    char tail;
    if (sscanf(bus_id, "%x:%x:%x.%x%c", &dom, &bus, &dev, &fn, &tail) != 4) {
        dom = 0;
        if (sscanf(bus_id, "%x:%x.%x%c", &bus, &dev, &fn, &tail) != 3)
            return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (int i = 0; i < g_spec->count; i++) {
        const struct fn_gpu *g = &g_spec->gpus[i];
        if (g->domain == dom && g->bus == bus && g->device == dev && g->function == fn) {
            *device = &g_devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    LOCKED(handle_by_bus_id(pciBusId, device));
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    LOCKED(handle_by_bus_id(pciBusId, device));
}

static nvmlReturn_t handle_by_uuid(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t rc = ready();
    if (rc)
        return rc;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < g_spec->count; i++)
        if (strcmp(g_spec->gpus[i].uuid, uuid) == 0) {
            *device = &g_devices[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    LOCKED(handle_by_uuid(uuid, device));
}

/* ---- simple per-device values --------------------------------------------------------------- */

enum uint_field { F_INDEX, F_MINOR, F_MAX_GEN, F_MAX_WIDTH, F_CUR_GEN, F_CUR_WIDTH };

static nvmlReturn_t device_uint(nvmlDevice_t h, enum uint_field f, unsigned int *out)
{
    const struct fn_gpu *g;
    int i;
    nvmlReturn_t rc = device_query(h, out != NULL, f >= F_MAX_GEN ? FN_PCIE_LINK : NO_FEATURE, &g, &i);
    if (rc)
        return rc;
    switch (f) {
    case F_INDEX: *out = (unsigned int)i; break;
    case F_MINOR: *out = (unsigned int)i; break;
    case F_MAX_GEN: *out = (unsigned int)g->max_gen; break;
    case F_MAX_WIDTH: *out = (unsigned int)g->max_width; break;
    case F_CUR_GEN: *out = (unsigned int)g->cur_gen; break;
    case F_CUR_WIDTH: *out = (unsigned int)g->cur_width; break;
    }
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *v) { LOCKED(device_uint(d, F_INDEX, v)); }
EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *v) { LOCKED(device_uint(d, F_MINOR, v)); }
EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t d, unsigned int *v) { LOCKED(device_uint(d, F_MAX_GEN, v)); }
EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t d, unsigned int *v) { LOCKED(device_uint(d, F_MAX_WIDTH, v)); }
EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t d, unsigned int *v) { LOCKED(device_uint(d, F_CUR_GEN, v)); }
EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t d, unsigned int *v) { LOCKED(device_uint(d, F_CUR_WIDTH, v)); }

static nvmlReturn_t device_string(nvmlDevice_t h, int uuid, char *buf, unsigned int length)
{
    const struct fn_gpu *g;
    nvmlReturn_t rc = gpu_of(h, &g, NULL);
    return rc ? rc : copy_string(buf, length, uuid ? g->uuid : g->name);
}
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) { LOCKED(device_string(d, 0, name, length)); }
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) { LOCKED(device_string(d, 1, uuid, length)); }

static nvmlReturn_t pci_info(nvmlDevice_t h, nvmlPciInfo_t *pci)
{
    const struct fn_gpu *g;
    nvmlReturn_t rc = device_query(h, pci != NULL, NO_FEATURE, &g, NULL);
    if (rc)
        return rc;
    fill_pci(pci, g->domain, g->bus, g->device, g->function);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *pci) { LOCKED(pci_info(d, pci)); }
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *pci) { LOCKED(pci_info(d, pci)); }
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) { LOCKED(pci_info(d, pci)); }

static nvmlReturn_t memory_info(nvmlDevice_t h, nvmlMemory_t *m)
{
    const struct fn_gpu *g;
    int i;
    nvmlReturn_t rc = device_query(h, m != NULL, NO_FEATURE, &g, &i);
    if (rc)
        return rc;
    unsigned long long used = g->memory_reserved + registered_bytes(i);
    if (used > g->memory_total)
        used = g->memory_total;
    m->total = g->memory_total;
    m->used = used;
    m->free = g->memory_total - used;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) { LOCKED(memory_info(d, m)); }

/* v2 splits the driver's reservation out of "used": total = reserved + used + free. */
static nvmlReturn_t memory_info_v2(nvmlDevice_t h, nvmlMemory_v2_t *m)
{
    const struct fn_gpu *g;
    int i;
    nvmlReturn_t rc = device_query(h, m != NULL, NO_FEATURE, &g, &i);
    if (rc)
        return rc;
    if (m->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long used = registered_bytes(i);
    if (used > g->memory_total - g->memory_reserved)
        used = g->memory_total - g->memory_reserved;
    m->total = g->memory_total;
    m->reserved = g->memory_reserved;
    m->used = used;
    m->free = g->memory_total - g->memory_reserved - used;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) { LOCKED(memory_info_v2(d, m)); }

static nvmlReturn_t compute_capability(nvmlDevice_t h, int *major, int *minor)
{
    const struct fn_gpu *g;
    nvmlReturn_t rc = device_query(h, major != NULL && minor != NULL, NO_FEATURE, &g, NULL);
    if (rc)
        return rc;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor)
{
    LOCKED(compute_capability(d, major, minor));
}

static nvmlReturn_t persistence_mode(nvmlDevice_t h, int *mode)
{
    const struct fn_gpu *g;
    nvmlReturn_t rc = device_query(h, mode != NULL, FN_PERSISTENCE_MODE, &g, NULL);
    if (rc)
        return rc;
    *mode = g->persistence_mode ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, int *mode) { LOCKED(persistence_mode(d, mode)); }

static nvmlReturn_t mig_mode(nvmlDevice_t h, unsigned int *current, unsigned int *pending)
{
    const struct fn_gpu *g;
    nvmlReturn_t rc = device_query(h, current != NULL && pending != NULL, FN_MIG_MODE, &g, NULL);
    if (rc)
        return rc;
    *current = *pending = g->mig ? 1u : 0u;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending)
{
    LOCKED(mig_mode(d, current, pending));
}

static nvmlReturn_t virtualization_mode(nvmlDevice_t h, int *mode)
{
    const struct fn_gpu *g;
    nvmlReturn_t rc = device_query(h, mode != NULL, FN_VIRTUALIZATION_MODE, &g, NULL);
    if (rc)
        return rc;
    *mode = g_spec->virtualization_mode;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetVirtualizationMode(nvmlDevice_t d, int *mode) { LOCKED(virtualization_mode(d, mode)); }

/* ---- NUMA and CPU affinity ------------------------------------------------------------------ */

/* Copy a bit mask (64-bit words) into the caller's array of `size` unsigned longs. */
static void copy_mask(unsigned long *dst, unsigned int size, const unsigned long long *src, unsigned int src_words)
{
    for (unsigned int w = 0; w < size; w++)
        dst[w] = w < src_words ? (unsigned long)src[w] : 0;
}

static nvmlReturn_t memory_affinity(nvmlDevice_t h, unsigned int size, unsigned long *set, unsigned int scope)
{
    const struct fn_gpu *g;
    nvmlReturn_t rc = device_query(h, set != NULL && size > 0 && scope <= NVML_AFFINITY_SCOPE_SOCKET, FN_MEMORY_AFFINITY, &g, NULL);
    if (rc)
        return rc;
    unsigned long long mask[1024 / 64] = {0};
    if (g->numa_node >= 0)
        mask[g->numa_node / 64] = 1ULL << (g->numa_node % 64);
    copy_mask(set, size, mask, 1024 / 64);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t d, unsigned int size, unsigned long *set, unsigned int scope)
{
    LOCKED(memory_affinity(d, size, set, scope));
}

static nvmlReturn_t cpu_affinity(nvmlDevice_t h, unsigned int size, unsigned long *set, unsigned int scope)
{
    const struct fn_gpu *g;
    nvmlReturn_t rc = device_query(h, set != NULL && size > 0 && scope <= NVML_AFFINITY_SCOPE_SOCKET, FN_CPU_AFFINITY, &g, NULL);
    if (rc)
        return rc;
    copy_mask(set, size, g->cpu_mask, FN_MAX_CPUS / 64);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t d, unsigned int size, unsigned long *set)
{
    LOCKED(cpu_affinity(d, size, set, NVML_AFFINITY_SCOPE_NODE));
}
EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t d, unsigned int size, unsigned long *set, unsigned int scope)
{
    LOCKED(cpu_affinity(d, size, set, scope));
}

/* GPU memory as a NUMA node exists only on coherent systems (Grace); elsewhere NOT_SUPPORTED. */
static nvmlReturn_t numa_node_id(nvmlDevice_t h, unsigned int *node)
{
    const struct fn_gpu *g;
    nvmlReturn_t rc = device_query(h, node != NULL, FN_NUMA_NODE_ID, &g, NULL);
    if (rc)
        return rc;
    *node = (unsigned int)g->numa_node;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t d, unsigned int *node) { LOCKED(numa_node_id(d, node)); }

/* ---- pairs: topology and P2P ---------------------------------------------------------------- */

static nvmlReturn_t pair(nvmlDevice_t h1, nvmlDevice_t h2, int *a, int *b)
{
    const struct fn_gpu *g;
    nvmlReturn_t rc = gpu_of(h1, &g, a);
    if (rc)
        return rc;
    rc = gpu_of(h2, &g, b);
    if (rc)
        return rc;
    return *a == *b ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS; /* the diagonal is "X": no pair */
}

static nvmlReturn_t common_ancestor(nvmlDevice_t h1, nvmlDevice_t h2, int *level)
{
    int a, b;
    nvmlReturn_t rc = pair(h1, h2, &a, &b);
    if (rc)
        return rc;
    if (!level)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (unsupported(FN_TOPOLOGY_COMMON_ANCESTOR))
        return NVML_ERROR_NOT_SUPPORTED;
    *level = g_spec->topology[a][b];
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t d1, nvmlDevice_t d2, int *level)
{
    LOCKED(common_ancestor(d1, d2, level));
}

/* READ/WRITE/ATOMICS: the spec's status for the pair. NVLINK: OK where NVLink joins the pair, else
 * NOT_SUPPORTED. PCI: NOT_SUPPORTED where NVLink carries P2P (seen on H200), else the spec's status. */
static nvmlReturn_t p2p_status(nvmlDevice_t h1, nvmlDevice_t h2, int index, int *status)
{
    int a, b;
    nvmlReturn_t rc = pair(h1, h2, &a, &b);
    if (rc)
        return rc;
    if (!status || index < 0 || index >= NVML_P2P_CAPS_INDEX_UNKNOWN)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (unsupported(FN_P2P_STATUS))
        return NVML_ERROR_NOT_SUPPORTED;
    int linked = g_spec->nvlinked[a][b];
    switch (index) {
    case NVML_P2P_CAPS_INDEX_NVLINK:
        *status = linked ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED;
        break;
    case NVML_P2P_CAPS_INDEX_PCI:
        *status = linked ? NVML_P2P_STATUS_NOT_SUPPORTED : g_spec->p2p[a][b];
        break;
    default:
        *status = g_spec->p2p[a][b];
    }
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t d1, nvmlDevice_t d2, int index, int *status)
{
    LOCKED(p2p_status(d1, d2, index, status));
}

/* ---- NVLink --------------------------------------------------------------------------------- */

/* NOT_SUPPORTED on a GPU without NVLink; INVALID_ARGUMENT for a link the part does not have
 * (link >= nvlink_links, which defaults to nvlinks) or a missing output; links in
 * [nvlinks, nvlink_links) exist but are down: only their state can be read (need_up = 0). */
static nvmlReturn_t link_query(nvmlDevice_t h, unsigned int link, int outputs_ok, int need_up, const struct fn_gpu **g)
{
    nvmlReturn_t rc = gpu_of(h, g, NULL);
    if (rc)
        return rc;
    if (unsupported(FN_NVLINK) || (*g)->nvlink_links == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned int)(*g)->nvlink_links || !outputs_ok)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (need_up && (link >= (unsigned int)(*g)->nvlinks || (*g)->link_peer[link] == FN_PEER_NONE))
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

static nvmlReturn_t nvlink_state(nvmlDevice_t h, unsigned int link, int *active)
{
    const struct fn_gpu *g;
    nvmlReturn_t rc = link_query(h, link, active != NULL, 0, &g);
    if (rc)
        return rc;
    *active = link < (unsigned int)g->nvlinks ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, int *active)
{
    LOCKED(nvlink_state(d, link, active));
}

static nvmlReturn_t nvlink_version(nvmlDevice_t h, unsigned int link, unsigned int *version)
{
    const struct fn_gpu *g;
    nvmlReturn_t rc = link_query(h, link, version != NULL, 1, &g);
    if (rc)
        return rc;
    /* nvmlNvlinkVersion_t by architecture: Volta 2.0, Ampere 3.0, Hopper 4.0, Blackwell 5.0 */
    *version = g->cc_major <= 7 ? 2 : g->cc_major == 8 ? 4 : g->cc_major == 9 ? 6 : 7;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t d, unsigned int link, unsigned int *version)
{
    LOCKED(nvlink_version(d, link, version));
}

static nvmlReturn_t nvlink_remote_pci(nvmlDevice_t h, unsigned int link, nvmlPciInfo_t *pci)
{
    const struct fn_gpu *g;
    nvmlReturn_t rc = link_query(h, link, pci != NULL, 1, &g);
    if (rc)
        return rc;
    int peer = g->link_peer[link];
    if (peer == FN_PEER_SWITCH) {
        fill_pci(pci, 0xFFFFFFFFu, 0xFF, 0xFF, 0);
        pci->pciDeviceId = 0;
    } else {
        const struct fn_gpu *r = &g_spec->gpus[peer];
        fill_pci(pci, r->domain, r->bus, r->device, r->function);
    }
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *pci)
{
    LOCKED(nvlink_remote_pci(d, link, pci));
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *pci)
{
    LOCKED(nvlink_remote_pci(d, link, pci));
}

static nvmlReturn_t nvlink_remote_type(nvmlDevice_t h, unsigned int link, int *type)
{
    const struct fn_gpu *g;
    nvmlReturn_t rc = link_query(h, link, type != NULL, 1, &g);
    if (rc)
        return rc;
    *type = g->link_peer[link] == FN_PEER_SWITCH ? NVML_NVLINK_DEVICE_TYPE_SWITCH : NVML_NVLINK_DEVICE_TYPE_GPU;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t d, unsigned int link, int *type)
{
    LOCKED(nvlink_remote_type(d, link, type));
}

/* ---- running processes ---------------------------------------------------------------------- */

/* NVML's two-call protocol: with *count too small (e.g. 0 and infos NULL) answer INSUFFICIENT_SIZE
 * and the needed count; with no process answer SUCCESS and 0. version: 1 = {pid, used},
 * 2 = {pid, used, gpuInstanceId, computeInstanceId}. graphics: always empty. */
static nvmlReturn_t running_processes(nvmlDevice_t h, unsigned int *count, void *infos, int version, int graphics)
{
    const struct fn_gpu *g;
    int i;
    nvmlReturn_t rc = device_query(h, count != NULL, NO_FEATURE, &g, &i);
    if (rc)
        return rc;
    struct proc procs[MAX_PROCS];
    int n = graphics ? 0 : registered(i, procs, MAX_PROCS);
    if (*count < (unsigned int)n) {
        *count = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n > 0 && !infos)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int k = 0; k < n; k++) {
        if (version == 1) {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + k;
            p->pid = procs[k].pid;
            p->usedGpuMemory = procs[k].used;
        } else {
            nvmlProcessInfo_v2_t *p = (nvmlProcessInfo_v2_t *)infos + k;
            p->pid = procs[k].pid;
            p->usedGpuMemory = procs[k].used;
            p->gpuInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
            p->computeInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
        }
    }
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *p)
{
    LOCKED(running_processes(d, c, p, 1, 0));
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v2_t *p)
{
    LOCKED(running_processes(d, c, p, 2, 0));
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p)
{
    LOCKED(running_processes(d, c, p, 2, 0));
}
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *p)
{
    LOCKED(running_processes(d, c, p, 1, 1));
}
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v2_t *p)
{
    LOCKED(running_processes(d, c, p, 2, 1));
}
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p)
{
    LOCKED(running_processes(d, c, p, 2, 1));
}
EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p)
{
    LOCKED(running_processes(d, c, p, 2, 1));
}
