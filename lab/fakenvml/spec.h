/* The GPU spec the fake NVML serves: loaded and checked once per nvmlInit. Format: lab/specs/README.md. */
#ifndef FAKENVML_SPEC_H
#define FAKENVML_SPEC_H

#include <stddef.h>

#define FN_MAX_GPUS 64
#define FN_MAX_LINKS 36        /* NVML_NVLINK_MAX_LINKS as nvidia-ml-py 13 defines it */
#define FN_MAX_CPUS 4096
#define FN_PEER_SWITCH (-2)    /* link_peer value: the remote end is an NVSwitch */
#define FN_PEER_NONE (-1)      /* link_peer value: link present but not active */

/* Names accepted in "not_supported"; bit i of fn_spec.not_supported is NOT_SUPPORTED_NAMES[i]. */
enum fn_feature {
    FN_NUMA_NODE_ID,
    FN_MEMORY_AFFINITY,
    FN_CPU_AFFINITY,
    FN_MIG_MODE,
    FN_PERSISTENCE_MODE,
    FN_VIRTUALIZATION_MODE,
    FN_PCIE_LINK,
    FN_TOPOLOGY_COMMON_ANCESTOR,
    FN_P2P_STATUS,
    FN_NVLINK,
    FN_FEATURE_COUNT
};
extern const char *const FN_FEATURE_NAMES[FN_FEATURE_COUNT];

struct fn_gpu {
    char name[96];
    char uuid[96];
    char bus_id[32];              /* normalized: "%08X:%02X:%02X.%X" */
    unsigned domain, bus, device, function;
    unsigned long long memory_total;     /* bytes */
    unsigned long long memory_reserved;  /* bytes */
    int cc_major, cc_minor;
    int numa_node;                /* -1: none */
    int sysfs_numa_node;
    char cpu_affinity[256];
    unsigned long long cpu_mask[FN_MAX_CPUS / 64];
    int max_gen, max_width, cur_gen, cur_width;
    int nvlinks;                  /* active links */
    int nvlink_links;             /* links the part has (>= nvlinks) */
    int link_peer[FN_MAX_LINKS];  /* GPU index, FN_PEER_SWITCH or FN_PEER_NONE */
    int mig;
    int persistence_mode;
};

struct fn_spec {
    char name[128];
    char driver_version[80];
    int cuda_driver_version;
    int virtualization_mode;      /* NVML_GPU_VIRTUALIZATION_MODE_* */
    int count;
    struct fn_gpu gpus[FN_MAX_GPUS];
    int topology[FN_MAX_GPUS][FN_MAX_GPUS];   /* NVML_TOPOLOGY_* level; -1 on the diagonal */
    int nvlinked[FN_MAX_GPUS][FN_MAX_GPUS];   /* 1 when NVLink carries traffic between the pair */
    int p2p[FN_MAX_GPUS][FN_MAX_GPUS];        /* NVML_P2P_STATUS_* for read/write/atomics */
    unsigned not_supported;                   /* bit per enum fn_feature */
};

/* Load and check the spec at path. Returns 0, or an NVML error code with a message in err:
 * 9 (DRIVER_NOT_LOADED) when the file cannot be opened, 999 (UNKNOWN) when it is malformed. */
int fn_spec_load(const char *path, struct fn_spec *out, char *err, size_t errlen);

#endif
