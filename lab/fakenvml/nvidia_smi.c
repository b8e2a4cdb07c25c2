/* nvidia-smi stand-in for the lab: a plain NVML client of the fake libnvidia-ml.so.1, with the parts of
 * the real tool's interface the project and its operators use: the summary table, -L, --query-gpu,
 * --query-compute-apps, -i, --format=csv[,noheader][,nounits]. Exit codes follow nvidia-smi's
 * (2 bad argument, 9 driver not loaded, 255 other). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nvml_api.h"

#define MIB (1024ULL * 1024ULL)
#define MAX_FIELDS 32

static int g_noheader, g_nounits;

static void die_nvml(const char *what, nvmlReturn_t rc)
{
    fprintf(stderr, "%s: %s\n", what, nvmlErrorString(rc));
    exit(rc == NVML_ERROR_NOT_SUPPORTED ? 3 : 255);
}

static void usage_error(void)
{
    fprintf(stderr, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n");
    exit(2);
}

static void init_nvml(void)
{
    nvmlReturn_t rc = nvmlInit_v2();
    if (rc == NVML_SUCCESS)
        return;
    if (rc == NVML_ERROR_DRIVER_NOT_LOADED) {
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.\n\n");
        exit(9);
    }
    printf("Failed to initialize NVML: %s\n", nvmlErrorString(rc));
    exit(255);
}

static nvmlDevice_t device(unsigned int i)
{
    nvmlDevice_t d;
    nvmlReturn_t rc = nvmlDeviceGetHandleByIndex_v2(i, &d);
    if (rc)
        die_nvml("Unable to get the device handle", rc);
    return d;
}

/* ---- --query-gpu ---------------------------------------------------------------------------- */

static const char *const GPU_FIELDS[][3] = {
    /* name, alias, header */
    {"index", "", "index"},
    {"count", "", "count"},
    {"name", "gpu_name", "name"},
    {"uuid", "gpu_uuid", "uuid"},
    {"pci.bus_id", "gpu_bus_id", "pci.bus_id"},
    {"driver_version", "", "driver_version"},
    {"memory.total", "", "memory.total [MiB]"},
    {"memory.used", "", "memory.used [MiB]"},
    {"memory.free", "", "memory.free [MiB]"},
    {"persistence_mode", "", "persistence_mode"},
    {"pcie.link.gen.current", "pcie.link.gen.gpucurrent", "pcie.link.gen.current"},
    {"pcie.link.gen.max", "pcie.link.gen.gpumax", "pcie.link.gen.max"},
    {"pcie.link.width.current", "", "pcie.link.width.current"},
    {"pcie.link.width.max", "", "pcie.link.width.max"},
    {"compute_cap", "", "compute_cap"},
    {"mig.mode.current", "", "mig.mode.current"},
    {NULL, NULL, NULL},
};

static const char *const APP_FIELDS[][3] = {
    {"pid", "", "pid"},
    {"process_name", "name", "process_name"},
    {"used_gpu_memory", "used_memory", "used_gpu_memory [MiB]"},
    {"gpu_uuid", "", "gpu_uuid"},
    {"gpu_bus_id", "", "gpu_bus_id"},
    {"gpu_name", "", "gpu_name"},
    {NULL, NULL, NULL},
};

/* Split "a,b,c" into field indices of table; unknown field -> the real tool's message, exit 2. */
static int parse_fields(const char *list, const char *const table[][3], int *out)
{
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", list);
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        int found = -1;
        for (int i = 0; table[i][0]; i++)
            if (strcmp(tok, table[i][0]) == 0 || (table[i][1][0] && strcmp(tok, table[i][1]) == 0))
                found = i;
        if (found < 0) {
            fprintf(stderr, "Field \"%s\" is not a valid field to query.\n\n", tok);
            exit(2);
        }
        if (n == MAX_FIELDS)
            usage_error();
        out[n++] = found;
    }
    if (n == 0)
        usage_error();
    return n;
}

static void print_header(const int *fields, int n, const char *const table[][3])
{
    if (g_noheader)
        return;
    for (int i = 0; i < n; i++) {
        const char *h = table[fields[i]][2];
        if (g_nounits) {
            const char *sp = strchr(h, ' ');
            printf("%s%.*s", i ? ", " : "", sp ? (int)(sp - h) : (int)strlen(h), h);
        } else {
            printf("%s%s", i ? ", " : "", h);
        }
    }
    printf("\n");
}

static void mib(char *out, size_t len, unsigned long long bytes)
{
    snprintf(out, len, g_nounits ? "%llu" : "%llu MiB", bytes / MIB);
}

static void gpu_value(unsigned int i, const char *field, char *out, size_t len)
{
    nvmlDevice_t d = device(i);
    nvmlMemory_t mem;
    unsigned int u, cur, pend;
    int major, minor, mode;
    nvmlPciInfo_t pci;
    nvmlReturn_t rc = NVML_SUCCESS;
    if (strcmp(field, "index") == 0) {
        snprintf(out, len, "%u", i);
    } else if (strcmp(field, "count") == 0) {
        rc = nvmlDeviceGetCount_v2(&u);
        snprintf(out, len, "%u", u);
    } else if (strcmp(field, "name") == 0) {
        rc = nvmlDeviceGetName(d, out, (unsigned int)len);
    } else if (strcmp(field, "uuid") == 0) {
        rc = nvmlDeviceGetUUID(d, out, (unsigned int)len);
    } else if (strcmp(field, "pci.bus_id") == 0) {
        rc = nvmlDeviceGetPciInfo_v3(d, &pci);
        snprintf(out, len, "%s", pci.busId);
    } else if (strcmp(field, "driver_version") == 0) {
        rc = nvmlSystemGetDriverVersion(out, (unsigned int)len);
    } else if (strncmp(field, "memory.", 7) == 0) {
        rc = nvmlDeviceGetMemoryInfo(d, &mem);
        mib(out, len, field[7] == 't' ? mem.total : field[7] == 'u' ? mem.used : mem.free);
    } else if (strcmp(field, "persistence_mode") == 0) {
        rc = nvmlDeviceGetPersistenceMode(d, &mode);
        snprintf(out, len, "%s", mode ? "Enabled" : "Disabled");
    } else if (strncmp(field, "pcie.link.", 10) == 0) {
        int gen = field[10] == 'g', max = strstr(field, "max") != NULL;
        rc = gen ? (max ? nvmlDeviceGetMaxPcieLinkGeneration(d, &u) : nvmlDeviceGetCurrPcieLinkGeneration(d, &u))
                 : (max ? nvmlDeviceGetMaxPcieLinkWidth(d, &u) : nvmlDeviceGetCurrPcieLinkWidth(d, &u));
        snprintf(out, len, "%u", u);
    } else if (strcmp(field, "compute_cap") == 0) {
        rc = nvmlDeviceGetCudaComputeCapability(d, &major, &minor);
        snprintf(out, len, "%d.%d", major, minor);
    } else if (strcmp(field, "mig.mode.current") == 0) {
        rc = nvmlDeviceGetMigMode(d, &cur, &pend);
        snprintf(out, len, "%s", cur ? "Enabled" : "Disabled");
    }
    if (rc == NVML_ERROR_NOT_SUPPORTED)
        snprintf(out, len, "[N/A]");
    else if (rc)
        die_nvml(field, rc);
}

/* -i "0,2" -> selected[] flags; no -i -> all. */
static void select_gpus(const char *ids, unsigned int count, int *selected)
{
    for (unsigned int i = 0; i < count; i++)
        selected[i] = ids == NULL;
    if (!ids)
        return;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", ids);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        unsigned long i = strtoul(tok, &end, 10);
        if (end == tok || *end || i >= count) {
            fprintf(stderr, "No devices were found matching the ID \"%s\".\n", tok);
            exit(6);
        }
        selected[i] = 1;
    }
}

/* The start of a --query-*: check the fields, init, pick the GPUs (-i), print the header; returns the GPU count. */
static unsigned int begin_query(const char *list, const char *const table[][3], const char *ids, int *fields, int *n,
                                int *selected)
{
    *n = parse_fields(list, table, fields);
    init_nvml();
    unsigned int count;
    nvmlReturn_t rc = nvmlDeviceGetCount_v2(&count);
    if (rc)
        die_nvml("Unable to count devices", rc);
    select_gpus(ids, count, selected);
    print_header(fields, *n, table);
    return count;
}

static void query_gpu(const char *list, const char *ids)
{
    int fields[MAX_FIELDS], n, selected[64];
    unsigned int count = begin_query(list, GPU_FIELDS, ids, fields, &n, selected);
    for (unsigned int i = 0; i < count; i++) {
        if (!selected[i])
            continue;
        for (int f = 0; f < n; f++) {
            char value[256];
            gpu_value(i, GPU_FIELDS[fields[f]][0], value, sizeof(value));
            printf("%s%s", f ? ", " : "", value);
        }
        printf("\n");
    }
}

/* ---- processes ------------------------------------------------------------------------------ */

static void process_name(unsigned int pid, char *out, size_t len)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%u/cmdline", pid);
    FILE *fp = fopen(path, "r");
    size_t n = 0;
    if (fp) {
        n = fread(out, 1, len - 1, fp);
        fclose(fp);
    }
    out[n] = '\0';
    if (!out[0])
        snprintf(out, len, "[Not Found]");
}

/* Compute processes of GPU i; returns how many were written into procs. */
static unsigned int gpu_processes(nvmlDevice_t d, nvmlProcessInfo_t *procs, unsigned int max)
{
    unsigned int n = max;
    nvmlReturn_t rc = nvmlDeviceGetComputeRunningProcesses_v3(d, &n, procs);
    if (rc)
        die_nvml("Unable to list processes", rc);
    return n;
}

static void query_apps(const char *list, const char *ids)
{
    int fields[MAX_FIELDS], n, selected[64];
    unsigned int count = begin_query(list, APP_FIELDS, ids, fields, &n, selected);
    for (unsigned int i = 0; i < count; i++) {
        if (!selected[i])
            continue;
        nvmlDevice_t d = device(i);
        nvmlProcessInfo_t procs[256];
        unsigned int np = gpu_processes(d, procs, 256);
        for (unsigned int p = 0; p < np; p++) {
            for (int f = 0; f < n; f++) {
                char value[512];
                const char *field = APP_FIELDS[fields[f]][0];
                if (strcmp(field, "pid") == 0)
                    snprintf(value, sizeof(value), "%u", procs[p].pid);
                else if (strcmp(field, "process_name") == 0)
                    process_name(procs[p].pid, value, sizeof(value));
                else if (strcmp(field, "used_gpu_memory") == 0)
                    mib(value, sizeof(value), procs[p].usedGpuMemory);
                else
                    gpu_value(i, strcmp(field, "gpu_uuid") == 0 ? "uuid" : strcmp(field, "gpu_bus_id") == 0 ? "pci.bus_id" : "name",
                              value, sizeof(value));
                printf("%s%s", f ? ", " : "", value);
            }
            printf("\n");
        }
    }
}

/* ---- -L and the summary table --------------------------------------------------------------- */

static void list_gpus(void)
{
    init_nvml();
    unsigned int count;
    nvmlReturn_t rc = nvmlDeviceGetCount_v2(&count);
    if (rc)
        die_nvml("Unable to count devices", rc);
    for (unsigned int i = 0; i < count; i++) {
        char name[96], uuid[96];
        gpu_value(i, "name", name, sizeof(name));
        gpu_value(i, "uuid", uuid, sizeof(uuid));
        printf("GPU %u: %s (UUID: %s)\n", i, name, uuid);
    }
}

static void table(void)
{
    init_nvml();
    char driver[80], stamp[64];
    int cuda;
    unsigned int count;
    nvmlReturn_t rc = nvmlSystemGetDriverVersion(driver, sizeof(driver));
    if (!rc)
        rc = nvmlSystemGetCudaDriverVersion_v2(&cuda);
    if (!rc)
        rc = nvmlDeviceGetCount_v2(&count);
    if (rc)
        die_nvml("Unable to read the driver", rc);
    time_t now = time(NULL);
    strftime(stamp, sizeof(stamp), "%a %b %e %H:%M:%S %Y", localtime(&now));
    const char *rule = "+-----------------------------------------+------------------------+----------------------+";
    printf("%s\n", stamp);
    printf("+-----------------------------------------------------------------------------------------+\n");
    char line[640];
    snprintf(line, sizeof(line), " NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %d.%d", driver, driver, cuda / 1000,
             (cuda % 1000) / 10);
    printf("|%-89s|\n", line);
    printf("%s\n", rule);
    printf("| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n");
    printf("| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n");
    printf("|                                         |                        |               MIG M. |\n");
    printf("|=========================================+========================+======================|\n");
    for (unsigned int i = 0; i < count; i++) {
        char name[96], bus[64], pm[16], used[32], total[32], mig[16], cell[80];
        gpu_value(i, "name", name, sizeof(name));
        gpu_value(i, "pci.bus_id", bus, sizeof(bus));
        gpu_value(i, "persistence_mode", pm, sizeof(pm));
        g_nounits = 1;
        gpu_value(i, "memory.used", used, sizeof(used));
        gpu_value(i, "memory.total", total, sizeof(total));
        g_nounits = 0;
        gpu_value(i, "mig.mode.current", mig, sizeof(mig));
        if (strlen(name) > 28)
            strcpy(name + 25, "...");
        snprintf(cell, sizeof(cell), "%sMiB / %sMiB", used, total);
        printf("| %3u  %-28s %5s |   %16s Off | %20s |\n", i, name, strcmp(pm, "Enabled") == 0 ? "On" : "Off", bus, "N/A");
        printf("| %-39s | %22s | %8s %11s |\n", "N/A   N/A   P0               N/A /  N/A", cell, "0%", "Default");
        printf("|                                         |                        | %20s |\n", mig);
        printf("%s\n", rule);
    }
    printf("\n+-----------------------------------------------------------------------------------------+\n");
    printf("| Processes:                                                                              |\n");
    printf("|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |\n");
    printf("|        ID   ID                                                               Usage      |\n");
    printf("|=========================================================================================|\n");
    int any = 0;
    for (unsigned int i = 0; i < count; i++) {
        nvmlProcessInfo_t procs[256];
        unsigned int np = gpu_processes(device(i), procs, 256);
        for (unsigned int p = 0; p < np; p++) {
            char pname[512], usage[32];
            process_name(procs[p].pid, pname, sizeof(pname));
            if (strlen(pname) > 34)
                memmove(pname + 3, pname + strlen(pname) - 31, 32), memcpy(pname, "...", 3);
            snprintf(usage, sizeof(usage), "%lluMiB", procs[p].usedGpuMemory / MIB);
            snprintf(line, sizeof(line), " %4u   N/A  N/A  %14u      C   %-34s %10s", i, procs[p].pid, pname, usage);
            printf("|%-89s|\n", line);
            any = 1;
        }
    }
    if (!any)
        printf("|  No running processes found                                                             |\n");
    printf("+-----------------------------------------------------------------------------------------+\n");
}

static void help(void)
{
    printf("nvidia-smi (topolaunch lab stand-in, answers from the fake NVML)\n\n"
           "    nvidia-smi                        summary table\n"
           "    nvidia-smi -L                     list GPUs\n"
           "    nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits] [-i IDS]\n"
           "    nvidia-smi --query-compute-apps=FIELDS --format=csv[,noheader][,nounits] [-i IDS]\n\n"
           "GPU fields:");
    for (int i = 0; GPU_FIELDS[i][0]; i++)
        printf(" %s", GPU_FIELDS[i][0]);
    printf("\nCompute app fields:");
    for (int i = 0; APP_FIELDS[i][0]; i++)
        printf(" %s", APP_FIELDS[i][0]);
    printf("\n");
}

int main(int argc, char **argv)
{
    const char *query_gpu_list = NULL, *query_apps_list = NULL, *format = NULL, *ids = NULL;
    int list = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-L") == 0 || strcmp(a, "--list-gpus") == 0)
            list = 1;
        else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            help();
            return 0;
        } else if (strncmp(a, "--query-gpu=", 12) == 0)
            query_gpu_list = a + 12;
        else if (strncmp(a, "--query-compute-apps=", 21) == 0)
            query_apps_list = a + 21;
        else if (strncmp(a, "--format=", 9) == 0)
            format = a + 9;
        else if (strncmp(a, "--id=", 5) == 0)
            ids = a + 5;
        else if (strcmp(a, "-i") == 0 && i + 1 < argc)
            ids = argv[++i];
        else
            usage_error();
    }
    if (format) {
        char buf[128];
        snprintf(buf, sizeof(buf), "%s", format);
        int csv = 0;
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (strcmp(tok, "csv") == 0)
                csv = 1;
            else if (strcmp(tok, "noheader") == 0)
                g_noheader = 1;
            else if (strcmp(tok, "nounits") == 0)
                g_nounits = 1;
            else
                usage_error();
        }
        if (!csv)
            usage_error();
    }
    if ((query_gpu_list || query_apps_list) && !format) {
        fprintf(stderr, "Invalid combination of input arguments: --format=csv is required with a query.\n");
        return 2;
    }
    if (list + (query_gpu_list != NULL) + (query_apps_list != NULL) > 1 || (format && !query_gpu_list && !query_apps_list))
        usage_error();
    if (list)
        list_gpus();
    else if (query_gpu_list)
        query_gpu(query_gpu_list, ids);
    else if (query_apps_list)
        query_apps(query_apps_list, ids);
    else
        table();
    nvmlShutdown();
    return 0;
}
