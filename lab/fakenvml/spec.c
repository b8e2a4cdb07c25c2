/* Load a lab/specs JSON file into struct fn_spec, checking every field. Any problem names the field,
 * e.g. "gpus[3].pcie.cur_gen: 6 is above max_gen 5". Unknown keys are errors. */
#include "spec.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

#define ERR_DRIVER_NOT_LOADED 9
#define ERR_UNKNOWN 999
#define MIB (1024ULL * 1024ULL)

const char *const FN_FEATURE_NAMES[FN_FEATURE_COUNT] = {
    "numa_node_id", "memory_affinity", "cpu_affinity", "mig_mode", "persistence_mode",
    "virtualization_mode", "pcie_link", "topology_common_ancestor", "p2p_status", "nvlink",
};

struct ctx {
    char *err;
    size_t errlen;
};

static int bad(struct ctx *c, const char *where, const char *fmt, ...)
{
    int n = snprintf(c->err, c->errlen, "%s: ", where);
    if (n < 0 || (size_t)n >= c->errlen)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

/* where + "." + key (or just key at top level) */
static void join(char *buf, size_t len, const char *where, const char *key)
{
    if (where[0])
        snprintf(buf, len, "%s.%s", where, key);
    else
        snprintf(buf, len, "%s", key);
}

static int check_object(struct ctx *c, const struct json *v, const char *where, const char *const *allowed)
{
    if (!v || v->type != JSON_OBJECT)
        return bad(c, where[0] ? where : "spec", "expected an object, got %s", v ? json_type_name(v->type) : "nothing");
    for (size_t i = 0; i < v->count; i++) {
        int ok = 0;
        for (const char *const *a = allowed; *a; a++)
            if (strcmp(*a, v->keys[i]) == 0)
                ok = 1;
        if (!ok) {
            char f[256];
            join(f, sizeof(f), where, v->keys[i]);
            return bad(c, f, "unknown key");
        }
    }
    return 0;
}

static int want_int(struct ctx *c, const struct json *v, const char *field, long long min, long long max, long long *out)
{
    if (v->type != JSON_NUMBER || !v->is_integer)
        return bad(c, field, "expected an integer, got %s", v->type == JSON_NUMBER ? "a fraction" : json_type_name(v->type));
    if (v->integer < min || v->integer > max)
        return bad(c, field, "%lld is out of range %lld..%lld", v->integer, min, max);
    *out = v->integer;
    return 0;
}

/* Member `key` of obj, its field name in f: 1 when present (*v set), 0 when absent and optional,
 * -1 (error) when absent and required. */
static int member(struct ctx *c, const struct json *obj, const char *where, const char *key, int required,
                  char *f, size_t flen, const struct json **v)
{
    join(f, flen, where, key);
    *v = json_get(obj, key);
    if (*v)
        return 1;
    return required ? bad(c, f, "missing") : 0;
}

static int get_int(struct ctx *c, const struct json *obj, const char *where, const char *key, int required,
                   long long min, long long max, long long dflt, long long *out)
{
    char f[256];
    const struct json *v;
    int found = member(c, obj, where, key, required, f, sizeof(f), &v);
    if (found <= 0) {
        *out = dflt;
        return found;
    }
    return want_int(c, v, f, min, max, out);
}

static int get_bool(struct ctx *c, const struct json *obj, const char *where, const char *key, int required, int dflt, int *out)
{
    char f[256];
    const struct json *v;
    int found = member(c, obj, where, key, required, f, sizeof(f), &v);
    *out = dflt;
    if (found <= 0)
        return found;
    if (v->type != JSON_BOOL)
        return bad(c, f, "expected true or false, got %s", json_type_name(v->type));
    *out = v->boolean;
    return 0;
}

/* String member copied into buf ("" when absent); *present says whether it was given. */
static int get_string(struct ctx *c, const struct json *obj, const char *where, const char *key, int required,
                      char *buf, size_t len, int *present)
{
    char f[256];
    const struct json *v;
    int found = member(c, obj, where, key, required, f, sizeof(f), &v);
    buf[0] = '\0';
    if (present)
        *present = found > 0;
    if (found <= 0)
        return found;
    if (v->type != JSON_STRING)
        return bad(c, f, "expected a string, got %s", json_type_name(v->type));
    if (strlen(v->string) >= len)
        return bad(c, f, "longer than %zu characters", len - 1);
    strcpy(buf, v->string);
    return 0;
}

static int want_array(struct ctx *c, const struct json *v, const char *field, size_t n_exact)
{
    if (!v)
        return bad(c, field, "missing");
    if (v->type != JSON_ARRAY)
        return bad(c, field, "expected an array, got %s", json_type_name(v->type));
    if (n_exact != (size_t)-1 && v->count != n_exact)
        return bad(c, field, "expected %zu items, got %zu", n_exact, v->count);
    return 0;
}

static int word_index(const char *word, const char *const *words)
{
    for (int i = 0; words[i]; i++)
        if (strcmp(word, words[i]) == 0)
            return i;
    return -1;
}

static int want_word(struct ctx *c, const struct json *v, const char *field, const char *const *words, int *index)
{
    if (v->type != JSON_STRING)
        return bad(c, field, "expected a string, got %s", json_type_name(v->type));
    int i = word_index(v->string, words);
    if (i < 0) {
        char list[256] = "";
        for (int k = 0; words[k]; k++) {
            strncat(list, k ? " | " : "", sizeof(list) - strlen(list) - 1);
            strncat(list, words[k], sizeof(list) - strlen(list) - 1);
        }
        return bad(c, field, "\"%s\" is not one of %s", v->string, list);
    }
    *index = i;
    return 0;
}

static int is_hex(char ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

/* "DDDDDDDD:BB:DD.F" (or 4-digit domain) -> normalized upper case. */
static int parse_bus_id(struct ctx *c, const char *field, const char *s, struct fn_gpu *g)
{
    size_t n = strlen(s);
    size_t dlen = n == 16 ? 8 : n == 12 ? 4 : 0;
    int ok = dlen != 0;
    for (size_t i = 0; ok && i < n; i++) {
        size_t j = i - dlen;
        if (i < dlen)
            ok = is_hex(s[i]);
        else if (j == 0 || j == 3)
            ok = s[i] == ':';
        else if (j == 6)
            ok = s[i] == '.';
        else if (j == 7)
            ok = s[i] >= '0' && s[i] <= '7';
        else
            ok = is_hex(s[i]);
    }
    if (!ok)
        return bad(c, field, "\"%s\" is not a PCI bus id like 00000000:01:00.0", s);
    unsigned long dom = strtoul(s, NULL, 16);
    g->domain = (unsigned)dom;
    g->bus = (unsigned)strtoul(s + dlen + 1, NULL, 16);
    g->device = (unsigned)strtoul(s + dlen + 4, NULL, 16);
    g->function = (unsigned)(s[dlen + 7] - '0');
    if (g->device > 0x1f)
        return bad(c, field, "\"%s\": device number above 1f", s);
    snprintf(g->bus_id, sizeof(g->bus_id), "%08X:%02X:%02X.%X", g->domain, g->bus, g->device, g->function);
    return 0;
}

/* cpulist "0-31,64-95" -> bit mask; "" is allowed (affinity not exposed). */
static int parse_cpulist(struct ctx *c, const char *field, const char *s, unsigned long long *mask)
{
    memset(mask, 0, sizeof(unsigned long long) * (FN_MAX_CPUS / 64));
    const char *p = s;
    while (*p) {
        char *end;
        if (*p < '0' || *p > '9')
            return bad(c, field, "\"%s\" is not a cpu list like 0-31,64-95", s);
        unsigned long a = strtoul(p, &end, 10), b = a;
        p = end;
        if (*p == '-') {
            p++;
            if (*p < '0' || *p > '9')
                return bad(c, field, "\"%s\" is not a cpu list like 0-31,64-95", s);
            b = strtoul(p, &end, 10);
            p = end;
        }
        if (b < a || b >= FN_MAX_CPUS)
            return bad(c, field, "\"%s\": bad range %lu-%lu (cpus 0..%d)", s, a, b, FN_MAX_CPUS - 1);
        for (unsigned long cpu = a; cpu <= b; cpu++)
            mask[cpu / 64] |= 1ULL << (cpu % 64);
        if (*p == ',')
            p++;
        else if (*p)
            return bad(c, field, "\"%s\" is not a cpu list like 0-31,64-95", s);
    }
    return 0;
}

static unsigned long long fnv1a(const char *s, unsigned long long h)
{
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

static unsigned long long mix(unsigned long long x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Deterministic UUID from name and index (spec: uuid optional, derived from name+index). */
static void derive_uuid(struct fn_gpu *g, int index)
{
    char key[160];
    snprintf(key, sizeof(key), "%s#%d", g->name, index);
    unsigned long long a = mix(fnv1a(key, 0xcbf29ce484222325ULL));
    unsigned long long b = mix(a ^ 0x9e3779b97f4a7c15ULL);
    snprintf(g->uuid, sizeof(g->uuid), "GPU-%08llx-%04llx-%04llx-%04llx-%012llx",
             a >> 32, (a >> 16) & 0xffff, a & 0xffff, b >> 48, b & 0xffffffffffffULL);
}

static const char *const GPU_KEYS[] = {
    "name", "uuid", "pci_bus_id", "memory_total_mib", "memory_reserved_mib", "compute_capability",
    "numa_node", "sysfs_numa_node", "cpu_affinity", "pcie", "nvlinks", "mig",
    "persistence_mode", "nvlink_links", NULL,
};
static const char *const PCIE_KEYS[] = {"max_gen", "max_width", "cur_gen", "cur_width", NULL};

static int load_gpu(struct ctx *c, const struct json *v, int index, struct fn_gpu *g)
{
    char where[32], f[96];
    long long x;
    int present;
    snprintf(where, sizeof(where), "gpus[%d]", index);
    if (check_object(c, v, where, GPU_KEYS) < 0)
        return -1;
    if (get_string(c, v, where, "name", 1, g->name, sizeof(g->name), NULL) < 0)
        return -1;
    snprintf(f, sizeof(f), "%s.name", where);
    if (!g->name[0])
        return bad(c, f, "empty");
    if (get_string(c, v, where, "uuid", 0, g->uuid, sizeof(g->uuid), &present) < 0)
        return -1;
    snprintf(f, sizeof(f), "%s.uuid", where);
    if (present && strncmp(g->uuid, "GPU-", 4) != 0)
        return bad(c, f, "\"%s\" does not start with GPU-", g->uuid);
    if (!present)
        derive_uuid(g, index);
    char bus[64];
    if (get_string(c, v, where, "pci_bus_id", 1, bus, sizeof(bus), NULL) < 0)
        return -1;
    snprintf(f, sizeof(f), "%s.pci_bus_id", where);
    if (parse_bus_id(c, f, bus, g) < 0)
        return -1;
    if (get_int(c, v, where, "memory_total_mib", 1, 1, 16LL * 1024 * 1024, 0, &x) < 0)
        return -1;
    g->memory_total = (unsigned long long)x * MIB;
    if (get_int(c, v, where, "memory_reserved_mib", 0, 0, x, 0, &x) < 0)
        return -1;
    g->memory_reserved = (unsigned long long)x * MIB;

    snprintf(f, sizeof(f), "%s.compute_capability", where);
    const struct json *cc = json_get(v, "compute_capability");
    if (want_array(c, cc, f, 2) < 0)
        return -1;
    long long major, minor;
    snprintf(f, sizeof(f), "%s.compute_capability[0]", where);
    if (want_int(c, cc->items[0], f, 1, 99, &major) < 0)
        return -1;
    snprintf(f, sizeof(f), "%s.compute_capability[1]", where);
    if (want_int(c, cc->items[1], f, 0, 99, &minor) < 0)
        return -1;
    g->cc_major = (int)major;
    g->cc_minor = (int)minor;

    if (get_int(c, v, where, "numa_node", 1, -1, 1023, 0, &x) < 0)
        return -1;
    g->numa_node = (int)x;
    if (get_int(c, v, where, "sysfs_numa_node", 0, -1, 1023, g->numa_node, &x) < 0)
        return -1;
    g->sysfs_numa_node = (int)x;
    if (get_string(c, v, where, "cpu_affinity", 1, g->cpu_affinity, sizeof(g->cpu_affinity), NULL) < 0)
        return -1;
    snprintf(f, sizeof(f), "%s.cpu_affinity", where);
    if (parse_cpulist(c, f, g->cpu_affinity, g->cpu_mask) < 0)
        return -1;

    char pw[48];
    snprintf(pw, sizeof(pw), "%s.pcie", where);
    const struct json *pcie = json_get(v, "pcie");
    if (!pcie)
        return bad(c, pw, "missing");
    if (check_object(c, pcie, pw, PCIE_KEYS) < 0)
        return -1;
    long long mg, mw, cg, cw;
    if (get_int(c, pcie, pw, "max_gen", 1, 1, 6, 0, &mg) < 0 || get_int(c, pcie, pw, "max_width", 1, 1, 32, 0, &mw) < 0 ||
        get_int(c, pcie, pw, "cur_gen", 1, 1, 6, 0, &cg) < 0 || get_int(c, pcie, pw, "cur_width", 1, 1, 32, 0, &cw) < 0)
        return -1;
    const long long widths[] = {1, 2, 4, 8, 12, 16, 32};
    int wok_m = 0, wok_c = 0;
    for (size_t i = 0; i < sizeof(widths) / sizeof(widths[0]); i++) {
        wok_m |= widths[i] == mw;
        wok_c |= widths[i] == cw;
    }
    if (!wok_m)
        return bad(c, pw, "max_width: %lld is not a PCIe link width (1 2 4 8 12 16 32)", mw);
    if (!wok_c)
        return bad(c, pw, "cur_width: %lld is not a PCIe link width (1 2 4 8 12 16 32)", cw);
    if (cg > mg)
        return bad(c, pw, "cur_gen: %lld is above max_gen %lld", cg, mg);
    if (cw > mw)
        return bad(c, pw, "cur_width: %lld is above max_width %lld", cw, mw);
    g->max_gen = (int)mg;
    g->max_width = (int)mw;
    g->cur_gen = (int)cg;
    g->cur_width = (int)cw;

    if (get_int(c, v, where, "nvlinks", 1, 0, FN_MAX_LINKS, 0, &x) < 0)
        return -1;
    g->nvlinks = (int)x;
    if (get_int(c, v, where, "nvlink_links", 0, g->nvlinks, FN_MAX_LINKS, g->nvlinks, &x) < 0)
        return -1;
    g->nvlink_links = (int)x;
    for (int l = 0; l < FN_MAX_LINKS; l++)
        g->link_peer[l] = FN_PEER_NONE;
    if (get_bool(c, v, where, "mig", 1, 0, &g->mig) < 0)
        return -1;
    if (get_bool(c, v, where, "persistence_mode", 0, 1, &g->persistence_mode) < 0)
        return -1;
    return 0;
}

static const char *const TOPO_WORDS[] = {"X", "PIX", "PXB", "PHB", "NODE", "SYS", NULL};
static const int TOPO_LEVELS[] = {-1, 10, 20, 30, 40, 50};
/* index = NVML_P2P_STATUS_* value */
static const char *const P2P_WORDS[] = {"OK", "CNS", "GNS", "TNS", "DISABLED", "NS", "UNKNOWN", NULL};
static const char *const VIRT_WORDS[] = {"none", "passthrough", NULL};
static const char *const FABRIC_WORDS[] = {"direct", "nvswitch", NULL};

static int load_topology(struct ctx *c, const struct json *v, struct fn_spec *s)
{
    size_t n = (size_t)s->count;
    if (want_array(c, v, "pcie_topology", n) < 0)
        return -1;
    char f[64];
    for (size_t a = 0; a < n; a++) {
        snprintf(f, sizeof(f), "pcie_topology[%zu]", a);
        if (want_array(c, v->items[a], f, n) < 0)
            return -1;
        for (size_t b = 0; b < n; b++) {
            int w;
            snprintf(f, sizeof(f), "pcie_topology[%zu][%zu]", a, b);
            if (want_word(c, v->items[a]->items[b], f, TOPO_WORDS, &w) < 0)
                return -1;
            if ((a == b) != (w == 0))
                return bad(c, f, a == b ? "\"%s\" on the diagonal, expected \"X\"" : "\"%s\" off the diagonal (X is a GPU with itself)",
                           v->items[a]->items[b]->string);
            s->topology[a][b] = TOPO_LEVELS[w];
        }
    }
    for (size_t a = 0; a < n; a++)
        for (size_t b = 0; b < a; b++)
            if (s->topology[a][b] != s->topology[b][a]) {
                snprintf(f, sizeof(f), "pcie_topology[%zu][%zu]", a, b);
                return bad(c, f, "\"%s\" differs from pcie_topology[%zu][%zu] \"%s\" (the matrix must be symmetric)",
                           v->items[a]->items[b]->string, b, a, v->items[b]->items[a]->string);
            }
    return 0;
}

/* [a, b, x] with a, b GPU indices; checks the shape and the indices. */
static int load_pair(struct ctx *c, const struct json *v, const char *f, int count, int *a, int *b)
{
    long long x;
    char g[96];
    if (want_array(c, v, f, 3) < 0)
        return -1;
    snprintf(g, sizeof(g), "%s[0]", f);
    if (want_int(c, v->items[0], g, 0, count - 1, &x) < 0)
        return -1;
    *a = (int)x;
    snprintf(g, sizeof(g), "%s[1]", f);
    if (want_int(c, v->items[1], g, 0, count - 1, &x) < 0)
        return -1;
    *b = (int)x;
    if (*a == *b)
        return bad(c, f, "a GPU paired with itself");
    return 0;
}

static const char *const NVLINK_KEYS[] = {"fabric", "pairs", NULL};

static int load_nvlink(struct ctx *c, const struct json *v, struct fn_spec *s)
{
    char f[96];
    if (!v) {
        for (int i = 0; i < s->count; i++)
            if (s->gpus[i].nvlinks > 0) {
                snprintf(f, sizeof(f), "gpus[%d].nvlinks", i);
                return bad(c, f, "%d links but the spec has no \"nvlink\" section saying where they go", s->gpus[i].nvlinks);
            }
        return 0;
    }
    if (check_object(c, v, "nvlink", NVLINK_KEYS) < 0)
        return -1;
    const struct json *fab = json_get(v, "fabric");
    if (!fab)
        return bad(c, "nvlink.fabric", "missing");
    int fabric;
    if (want_word(c, fab, "nvlink.fabric", FABRIC_WORDS, &fabric) < 0)
        return -1;
    const struct json *pairs = json_get(v, "pairs");
    if (pairs && want_array(c, pairs, "nvlink.pairs", (size_t)-1) < 0)
        return -1;
    size_t npairs = pairs ? pairs->count : 0;
    if (fabric == 1) { /* nvswitch */
        if (npairs)
            return bad(c, "nvlink.pairs", "only for fabric \"direct\" (on an NVSwitch every link goes to the switch)");
        for (int i = 0; i < s->count; i++) {
            for (int l = 0; l < s->gpus[i].nvlinks; l++)
                s->gpus[i].link_peer[l] = FN_PEER_SWITCH;
            for (int j = 0; j < s->count; j++)
                s->nvlinked[i][j] = i != j && s->gpus[i].nvlinks > 0 && s->gpus[j].nvlinks > 0;
        }
        return 0;
    }
    int used[FN_MAX_GPUS] = {0};
    for (size_t p = 0; p < npairs; p++) {
        int a, b;
        long long links;
        snprintf(f, sizeof(f), "nvlink.pairs[%zu]", p);
        if (load_pair(c, pairs->items[p], f, s->count, &a, &b) < 0)
            return -1;
        char g[112];
        snprintf(g, sizeof(g), "%s[2]", f);
        if (want_int(c, pairs->items[p]->items[2], g, 1, FN_MAX_LINKS, &links) < 0)
            return -1;
        if (s->nvlinked[a][b])
            return bad(c, f, "GPUs %d and %d are paired twice", a, b);
        s->nvlinked[a][b] = s->nvlinked[b][a] = 1;
        for (int k = 0; k < links; k++) {
            if (used[a] < FN_MAX_LINKS)
                s->gpus[a].link_peer[used[a]] = b;
            if (used[b] < FN_MAX_LINKS)
                s->gpus[b].link_peer[used[b]] = a;
            used[a]++;
            used[b]++;
        }
    }
    for (int i = 0; i < s->count; i++)
        if (used[i] != s->gpus[i].nvlinks) {
            snprintf(f, sizeof(f), "gpus[%d].nvlinks", i);
            return bad(c, f, "%d, but nvlink.pairs connect %d links to GPU %d", s->gpus[i].nvlinks, used[i], i);
        }
    return 0;
}

static const char *const P2P_KEYS[] = {"default", "pairs", NULL};

static int load_p2p(struct ctx *c, const struct json *v, struct fn_spec *s)
{
    int dflt = 0;
    char f[96];
    if (v) {
        if (check_object(c, v, "p2p", P2P_KEYS) < 0)
            return -1;
        const struct json *d = json_get(v, "default");
        if (d && want_word(c, d, "p2p.default", P2P_WORDS, &dflt) < 0)
            return -1;
    }
    for (int a = 0; a < s->count; a++)
        for (int b = 0; b < s->count; b++)
            s->p2p[a][b] = dflt;
    const struct json *pairs = v ? json_get(v, "pairs") : NULL;
    if (!pairs)
        return 0;
    if (want_array(c, pairs, "p2p.pairs", (size_t)-1) < 0)
        return -1;
    for (size_t p = 0; p < pairs->count; p++) {
        int a, b, w;
        snprintf(f, sizeof(f), "p2p.pairs[%zu]", p);
        if (load_pair(c, pairs->items[p], f, s->count, &a, &b) < 0)
            return -1;
        char g[112];
        snprintf(g, sizeof(g), "%s[2]", f);
        if (want_word(c, pairs->items[p]->items[2], g, P2P_WORDS, &w) < 0)
            return -1;
        s->p2p[a][b] = s->p2p[b][a] = w;
    }
    return 0;
}

/* ---- links: per-pair figures for the preflight stand-in (lab/preflight); NVML has no call that answers them,
 * so they are only checked here. */

static int want_positive(struct ctx *c, const struct json *v, const char *field, double max)
{
    if (v->type != JSON_NUMBER)
        return bad(c, field, "expected a number above 0, got %s", json_type_name(v->type));
    if (!(v->number > 0.0) || v->number > max)
        return bad(c, field, "%g is out of range (above 0, at most %g)", v->number, max);
    return 0;
}

#define MAX_GBPS 100000.0
#define MAX_LATENCY_US 10000000.0

/* gbps: a number (both directions) or [a -> b, b -> a]. */
static int want_gbps(struct ctx *c, const struct json *v, const char *field)
{
    if (v->type != JSON_ARRAY)
        return want_positive(c, v, field, MAX_GBPS);
    if (v->count != 2)
        return bad(c, field, "expected a number or [a->b, b->a], got %zu items", v->count);
    char f[256];
    for (size_t i = 0; i < 2; i++) {
        snprintf(f, sizeof(f), "%s[%zu]", field, i);
        if (want_positive(c, v->items[i], f, MAX_GBPS) < 0)
            return -1;
    }
    return 0;
}

static const char *const FIGURE_KEYS[] = {"gbps", "latency_us", NULL};
static const char *const DEFAULT_LINK_KEYS[] = {"gbps", "latency_us", "hangs", NULL};
static const char *const PAIR_LINK_KEYS[] = {"gpus", "gbps", "latency_us", "hangs", "p2p_disabled", NULL};

/* A figures object: gbps and latency_us (required or not), hangs where allowed. */
static int load_figures(struct ctx *c, const struct json *v, const char *where, const char *const *keys, int required)
{
    char f[160];
    const struct json *x;
    if (check_object(c, v, where, keys) < 0)
        return -1;
    int found = member(c, v, where, "gbps", required, f, sizeof(f), &x);
    if (found < 0 || (found && want_gbps(c, x, f) < 0))
        return -1;
    found = member(c, v, where, "latency_us", required, f, sizeof(f), &x);
    if (found < 0 || (found && want_positive(c, x, f, MAX_LATENCY_US) < 0))
        return -1;
    int hangs;
    for (const char *const *k = keys; *k; k++)
        if (strcmp(*k, "hangs") == 0 && get_bool(c, v, where, "hangs", 0, 0, &hangs) < 0)
            return -1;
    return 0;
}

static const char *const LINKS_KEYS[] = {"default", "p2p_disabled", "local", "pairs", NULL};

static int load_links(struct ctx *c, const struct json *v, const struct fn_spec *s)
{
    char f[96], g[128];
    if (!v)
        return 0;
    if (check_object(c, v, "links", LINKS_KEYS) < 0)
        return -1;
    const struct json *d = json_get(v, "default");
    if (!d)
        return bad(c, "links.default", "missing");
    if (load_figures(c, d, "links.default", DEFAULT_LINK_KEYS, 1) < 0)
        return -1;
    const struct json *off = json_get(v, "p2p_disabled");
    if (!off)
        return bad(c, "links.p2p_disabled", "missing");
    if (load_figures(c, off, "links.p2p_disabled", FIGURE_KEYS, 1) < 0)
        return -1;
    const struct json *local = json_get(v, "local");
    if (local && load_figures(c, local, "links.local", FIGURE_KEYS, 1) < 0)
        return -1;
    const struct json *pairs = json_get(v, "pairs");
    if (!pairs)
        return 0;
    if (want_array(c, pairs, "links.pairs", (size_t)-1) < 0)
        return -1;
    static int seen[FN_MAX_GPUS][FN_MAX_GPUS];
    memset(seen, 0, sizeof(seen));
    for (size_t p = 0; p < pairs->count; p++) {
        const struct json *e = pairs->items[p];
        snprintf(f, sizeof(f), "links.pairs[%zu]", p);
        if (load_figures(c, e, f, PAIR_LINK_KEYS, 0) < 0)
            return -1;
        snprintf(g, sizeof(g), "%s.gpus", f);
        const struct json *gpus = json_get(e, "gpus");
        if (!gpus)
            return bad(c, g, "missing");
        if (want_array(c, gpus, g, 2) < 0)
            return -1;
        long long a, b;
        char h[144];
        snprintf(h, sizeof(h), "%s[0]", g);
        if (want_int(c, gpus->items[0], h, 0, s->count - 1, &a) < 0)
            return -1;
        snprintf(h, sizeof(h), "%s[1]", g);
        if (want_int(c, gpus->items[1], h, 0, s->count - 1, &b) < 0)
            return -1;
        if (a == b)
            return bad(c, g, "a GPU paired with itself (its own copy is links.local)");
        if (seen[a][b])
            return bad(c, g, "GPUs %lld and %lld are listed twice (also links.pairs[%d])", a, b, seen[a][b] - 1);
        seen[a][b] = seen[b][a] = (int)p + 1;
        const struct json *po = json_get(e, "p2p_disabled");
        snprintf(h, sizeof(h), "%s.p2p_disabled", f);
        if (po && load_figures(c, po, h, FIGURE_KEYS, 1) < 0)
            return -1;
    }
    return 0;
}

static const char *const TOP_KEYS[] = {
    "name", "driver_version", "cuda_driver_version", "virtualization", "gpus", "pcie_topology",
    "nvlink", "p2p", "not_supported", "links", NULL,
};

static int load(struct ctx *c, const struct json *root, struct fn_spec *s)
{
    long long x;
    char f[96];
    if (check_object(c, root, "", TOP_KEYS) < 0)
        return -1;
    if (get_string(c, root, "", "name", 1, s->name, sizeof(s->name), NULL) < 0)
        return -1;
    if (get_string(c, root, "", "driver_version", 1, s->driver_version, sizeof(s->driver_version), NULL) < 0)
        return -1;
    if (!s->driver_version[0])
        return bad(c, "driver_version", "empty");
    if (get_int(c, root, "", "cuda_driver_version", 1, 1000, 99990, 0, &x) < 0)
        return -1;
    s->cuda_driver_version = (int)x;
    const struct json *virt = json_get(root, "virtualization");
    if (!virt)
        return bad(c, "virtualization", "missing");
    if (want_word(c, virt, "virtualization", VIRT_WORDS, &s->virtualization_mode) < 0)
        return -1;

    const struct json *gpus = json_get(root, "gpus");
    if (want_array(c, gpus, "gpus", (size_t)-1) < 0)
        return -1;
    if (gpus->count < 1 || gpus->count > FN_MAX_GPUS)
        return bad(c, "gpus", "%zu GPUs, expected 1..%d", gpus->count, FN_MAX_GPUS);
    s->count = (int)gpus->count;
    for (int i = 0; i < s->count; i++) {
        if (load_gpu(c, gpus->items[i], i, &s->gpus[i]) < 0)
            return -1;
        for (int j = 0; j < i; j++) {
            if (strcmp(s->gpus[i].bus_id, s->gpus[j].bus_id) == 0) {
                snprintf(f, sizeof(f), "gpus[%d].pci_bus_id", i);
                return bad(c, f, "%s is also gpus[%d]'s", s->gpus[i].bus_id, j);
            }
            if (strcmp(s->gpus[i].uuid, s->gpus[j].uuid) == 0) {
                snprintf(f, sizeof(f), "gpus[%d].uuid", i);
                return bad(c, f, "%s is also gpus[%d]'s", s->gpus[i].uuid, j);
            }
        }
    }
    if (load_topology(c, json_get(root, "pcie_topology"), s) < 0)
        return -1;
    if (load_nvlink(c, json_get(root, "nvlink"), s) < 0)
        return -1;
    if (load_p2p(c, json_get(root, "p2p"), s) < 0)
        return -1;
    if (load_links(c, json_get(root, "links"), s) < 0)
        return -1;

    const struct json *ns = json_get(root, "not_supported");
    if (!ns) {
        s->not_supported = 1u << FN_NUMA_NODE_ID;
        return 0;
    }
    if (want_array(c, ns, "not_supported", (size_t)-1) < 0)
        return -1;
    s->not_supported = 0;
    for (size_t i = 0; i < ns->count; i++) {
        int w;
        snprintf(f, sizeof(f), "not_supported[%zu]", i);
        const char *names[FN_FEATURE_COUNT + 1];
        for (int k = 0; k < FN_FEATURE_COUNT; k++)
            names[k] = FN_FEATURE_NAMES[k];
        names[FN_FEATURE_COUNT] = NULL;
        if (want_word(c, ns->items[i], f, names, &w) < 0)
            return -1;
        s->not_supported |= 1u << w;
    }
    return 0;
}

int fn_spec_load(const char *path, struct fn_spec *out, char *err, size_t errlen)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        snprintf(err, errlen, "cannot open GPU spec %s: %s", path, strerror(errno));
        return ERR_DRIVER_NOT_LOADED;
    }
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap);
    while (text) {
        size_t got = fread(text + len, 1, cap - len - 1, fp);
        len += got;
        if (len < cap - 1)
            break;
        char *bigger = realloc(text, cap * 2);
        if (!bigger) {
            free(text);
            text = NULL;
            break;
        }
        text = bigger;
        cap *= 2;
    }
    int read_error = ferror(fp);
    fclose(fp);
    if (!text || read_error) {
        free(text);
        snprintf(err, errlen, "cannot read GPU spec %s", path);
        return ERR_UNKNOWN;
    }
    text[len] = '\0';
    if (strlen(text) != len) {
        free(text);
        snprintf(err, errlen, "GPU spec %s: NUL byte in file", path);
        return ERR_UNKNOWN;
    }
    char msg[512];
    struct json *root = json_parse(text, msg, sizeof(msg));
    free(text);
    if (!root) {
        snprintf(err, errlen, "GPU spec %s: invalid JSON: %s", path, msg);
        return ERR_UNKNOWN;
    }
    memset(out, 0, sizeof(*out));
    struct ctx c = {msg, sizeof(msg)};
    int rc = load(&c, root, out);
    json_free(root);
    if (rc < 0) {
        snprintf(err, errlen, "GPU spec %s: %s", path, msg);
        return ERR_UNKNOWN;
    }
    return 0;
}
