/* Minimal JSON reader (RFC 8259): objects, arrays, strings with escapes (\uXXXX to UTF-8),
 * numbers, true/false/null. Duplicate object keys are an error. */
#include "json.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

struct parser {
    const char *s;
    size_t pos;
    char *err;
    size_t errlen;
    int failed;
};

static void fail(struct parser *p, const char *fmt, ...)
{
    if (p->failed)
        return;
    p->failed = 1;
    size_t line = 1, col = 1;
    for (size_t i = 0; i < p->pos && p->s[i]; i++) {
        if (p->s[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    int n = snprintf(p->err, p->errlen, "line %zu column %zu: ", line, col);
    if (n < 0 || (size_t)n >= p->errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
    va_end(ap);
}

static void skip_ws(struct parser *p)
{
    while (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' || p->s[p->pos] == '\n' || p->s[p->pos] == '\r')
        p->pos++;
}

static struct json *new_value(enum json_type t)
{
    struct json *v = calloc(1, sizeof(*v));
    if (v)
        v->type = t;
    return v;
}

static int push(struct json *v, struct json *item, char *key)
{
    struct json **items = realloc(v->items, (v->count + 1) * sizeof(*items));
    if (!items)
        return -1;
    v->items = items;
    if (v->type == JSON_OBJECT) {
        char **keys = realloc(v->keys, (v->count + 1) * sizeof(*keys));
        if (!keys)
            return -1;
        v->keys = keys;
        v->keys[v->count] = key;
    }
    v->items[v->count++] = item;
    return 0;
}

static void put_utf8(char *out, size_t *n, unsigned long cp)
{
    if (cp < 0x80) {
        out[(*n)++] = (char)cp;
    } else if (cp < 0x800) {
        out[(*n)++] = (char)(0xC0 | (cp >> 6));
        out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out[(*n)++] = (char)(0xE0 | (cp >> 12));
        out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        out[(*n)++] = (char)(0xF0 | (cp >> 18));
        out[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static int hex4(struct parser *p, unsigned long *out)
{
    unsigned long v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->s[p->pos];
        int d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else {
            fail(p, "bad \\u escape in string");
            return -1;
        }
        v = v * 16 + (unsigned long)d;
        p->pos++;
    }
    *out = v;
    return 0;
}

/* p->s[p->pos] is the opening quote. Returns a malloc'd decoded string. */
static char *parse_string_raw(struct parser *p)
{
    size_t start = ++p->pos;
    size_t len = 0;
    while (p->s[start + len] && p->s[start + len] != '"') {
        if (p->s[start + len] == '\\' && p->s[start + len + 1])
            len++;
        len++;
    }
    /* decoded text is never longer than the raw text (escapes shrink, \uXXXX -> at most 4 bytes) */
    char *out = malloc(len + 1);
    if (!out) {
        fail(p, "out of memory");
        return NULL;
    }
    size_t n = 0;
    for (;;) {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == '\0') {
            fail(p, "unterminated string");
            free(out);
            return NULL;
        }
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20) {
            fail(p, "control character in string");
            free(out);
            return NULL;
        }
        if (c != '\\') {
            out[n++] = (char)c;
            p->pos++;
            continue;
        }
        p->pos++;
        char e = p->s[p->pos++];
        switch (e) {
        case '"': out[n++] = '"'; break;
        case '\\': out[n++] = '\\'; break;
        case '/': out[n++] = '/'; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'n': out[n++] = '\n'; break;
        case 'r': out[n++] = '\r'; break;
        case 't': out[n++] = '\t'; break;
        case 'u': {
            unsigned long cp;
            if (hex4(p, &cp) < 0) {
                free(out);
                return NULL;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF && p->s[p->pos] == '\\' && p->s[p->pos + 1] == 'u') {
                unsigned long lo;
                p->pos += 2;
                if (hex4(p, &lo) < 0) {
                    free(out);
                    return NULL;
                }
                if (lo >= 0xDC00 && lo <= 0xDFFF)
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (cp == 0) {
                fail(p, "NUL character in string");
                free(out);
                return NULL;
            }
            put_utf8(out, &n, cp);
            break;
        }
        default:
            p->pos--;
            fail(p, "bad escape '\\%c' in string", e ? e : '0');
            free(out);
            return NULL;
        }
    }
    out[n] = '\0';
    return out;
}

static struct json *parse_value(struct parser *p, int depth);

static struct json *parse_number(struct parser *p)
{
    const char *s = p->s + p->pos;
    size_t i = 0;
    int integer = 1;
    if (s[i] == '-')
        i++;
    if (s[i] == '0') {
        i++;
    } else if (s[i] >= '1' && s[i] <= '9') {
        while (isdigit((unsigned char)s[i]))
            i++;
    } else {
        fail(p, "bad number");
        return NULL;
    }
    if (s[i] == '.') {
        integer = 0;
        i++;
        if (!isdigit((unsigned char)s[i])) {
            p->pos += i;
            fail(p, "bad number: digit expected after '.'");
            return NULL;
        }
        while (isdigit((unsigned char)s[i]))
            i++;
    }
    if (s[i] == 'e' || s[i] == 'E') {
        integer = 0;
        i++;
        if (s[i] == '+' || s[i] == '-')
            i++;
        if (!isdigit((unsigned char)s[i])) {
            p->pos += i;
            fail(p, "bad number: digit expected in exponent");
            return NULL;
        }
        while (isdigit((unsigned char)s[i]))
            i++;
    }
    struct json *v = new_value(JSON_NUMBER);
    if (!v) {
        fail(p, "out of memory");
        return NULL;
    }
    char buf[64];
    size_t n = i < sizeof(buf) - 1 ? i : sizeof(buf) - 1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    v->number = strtod(buf, NULL);
    if (integer && i <= 18) {
        v->is_integer = 1;
        v->integer = strtoll(buf, NULL, 10);
    }
    p->pos += i;
    return v;
}

static struct json *parse_array(struct parser *p, int depth)
{
    struct json *v = new_value(JSON_ARRAY);
    if (!v) {
        fail(p, "out of memory");
        return NULL;
    }
    p->pos++; /* [ */
    skip_ws(p);
    if (p->s[p->pos] == ']') {
        p->pos++;
        return v;
    }
    for (;;) {
        struct json *item = parse_value(p, depth + 1);
        if (!item || push(v, item, NULL) < 0) {
            json_free(item);
            json_free(v);
            fail(p, "out of memory");
            return NULL;
        }
        skip_ws(p);
        if (p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->s[p->pos] == ']') {
            p->pos++;
            return v;
        }
        fail(p, "',' or ']' expected in array");
        json_free(v);
        return NULL;
    }
}

static struct json *parse_object(struct parser *p, int depth)
{
    struct json *v = new_value(JSON_OBJECT);
    if (!v) {
        fail(p, "out of memory");
        return NULL;
    }
    p->pos++; /* { */
    skip_ws(p);
    if (p->s[p->pos] == '}') {
        p->pos++;
        return v;
    }
    for (;;) {
        skip_ws(p);
        if (p->s[p->pos] != '"') {
            fail(p, "string key expected in object");
            json_free(v);
            return NULL;
        }
        size_t key_pos = p->pos;
        char *key = parse_string_raw(p);
        if (!key) {
            json_free(v);
            return NULL;
        }
        if (json_get(v, key)) {
            p->pos = key_pos;
            fail(p, "duplicate key \"%s\"", key);
            free(key);
            json_free(v);
            return NULL;
        }
        skip_ws(p);
        if (p->s[p->pos] != ':') {
            fail(p, "':' expected after key \"%s\"", key);
            free(key);
            json_free(v);
            return NULL;
        }
        p->pos++;
        struct json *item = parse_value(p, depth + 1);
        if (!item || push(v, item, key) < 0) {
            fail(p, "out of memory");
            json_free(item);
            free(key);
            json_free(v);
            return NULL;
        }
        skip_ws(p);
        if (p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->s[p->pos] == '}') {
            p->pos++;
            return v;
        }
        fail(p, "',' or '}' expected in object");
        json_free(v);
        return NULL;
    }
}

static struct json *parse_literal(struct parser *p, const char *word, enum json_type t, int b)
{
    size_t n = strlen(word);
    if (strncmp(p->s + p->pos, word, n) != 0) {
        fail(p, "unexpected character '%c'", p->s[p->pos]);
        return NULL;
    }
    p->pos += n;
    struct json *v = new_value(t);
    if (!v) {
        fail(p, "out of memory");
        return NULL;
    }
    v->boolean = b;
    return v;
}

static struct json *parse_value(struct parser *p, int depth)
{
    if (depth > MAX_DEPTH) {
        fail(p, "nested deeper than %d", MAX_DEPTH);
        return NULL;
    }
    skip_ws(p);
    char c = p->s[p->pos];
    switch (c) {
    case '{': return parse_object(p, depth);
    case '[': return parse_array(p, depth);
    case '"': {
        char *s = parse_string_raw(p);
        if (!s)
            return NULL;
        struct json *v = new_value(JSON_STRING);
        if (!v) {
            free(s);
            fail(p, "out of memory");
            return NULL;
        }
        v->string = s;
        return v;
    }
    case 't': return parse_literal(p, "true", JSON_BOOL, 1);
    case 'f': return parse_literal(p, "false", JSON_BOOL, 0);
    case 'n': return parse_literal(p, "null", JSON_NULL, 0);
    case '\0':
        fail(p, "unexpected end of input");
        return NULL;
    default:
        if (c == '-' || (c >= '0' && c <= '9'))
            return parse_number(p);
        if (isprint((unsigned char)c))
            fail(p, "unexpected character '%c'", c);
        else
            fail(p, "unexpected byte 0x%02x", (unsigned char)c);
        return NULL;
    }
}

struct json *json_parse(const char *text, char *err, size_t errlen)
{
    struct parser p = {text, 0, err, errlen, 0};
    struct json *v = parse_value(&p, 0);
    if (!v)
        return NULL;
    skip_ws(&p);
    if (p.s[p.pos] != '\0') {
        fail(&p, "unexpected text after the JSON value");
        json_free(v);
        return NULL;
    }
    return v;
}

void json_free(struct json *v)
{
    if (!v)
        return;
    for (size_t i = 0; i < v->count; i++) {
        json_free(v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->string);
    free(v);
}

struct json *json_get(const struct json *obj, const char *key)
{
    if (!obj || obj->type != JSON_OBJECT)
        return NULL;
    for (size_t i = 0; i < obj->count; i++)
        if (strcmp(obj->keys[i], key) == 0)
            return obj->items[i];
    return NULL;
}

const char *json_type_name(enum json_type t)
{
    switch (t) {
    case JSON_NULL: return "null";
    case JSON_BOOL: return "boolean";
    case JSON_NUMBER: return "number";
    case JSON_STRING: return "string";
    case JSON_ARRAY: return "array";
    case JSON_OBJECT: return "object";
    }
    return "?";
}
