/* Minimal JSON reader for the fake NVML spec: a tree of values, errors with line and column. */
#ifndef FAKENVML_JSON_H
#define FAKENVML_JSON_H

#include <stddef.h>

enum json_type { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT };

struct json {
    enum json_type type;
    int boolean;
    double number;
    int is_integer;          /* number written without fraction or exponent */
    long long integer;       /* valid when is_integer */
    char *string;            /* JSON_STRING: decoded, NUL-terminated */
    size_t count;            /* JSON_ARRAY / JSON_OBJECT: number of items */
    struct json **items;     /* array items or object values */
    char **keys;             /* JSON_OBJECT: keys, same order as items */
};

/* Parse text; on failure return NULL and write "line L column C: what" into err. */
struct json *json_parse(const char *text, char *err, size_t errlen);
void json_free(struct json *v);
/* Object member by key, or NULL. */
struct json *json_get(const struct json *obj, const char *key);
const char *json_type_name(enum json_type t);

#endif
