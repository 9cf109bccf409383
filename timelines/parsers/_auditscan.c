/*
 * _auditscan: the hot loop of audit-log ingest, in C.
 *
 * A kube-apiserver audit log is JSON lines, two or more per request. Parsing each line into
 * Python objects, collapsing the stages and formatting a COPY row in Python cost about 50 us a
 * request, which capped ingest at ~15k requests/s. This module does the same work for the lines
 * of the usual shape without creating a Python object per line:
 *
 *   - validates the line (UTF-8 and JSON grammar, as strictly as orjson);
 *   - picks the fields the store filters on, decodes their JSON escapes;
 *   - collapses the stages of a request by (auditID, requestReceivedTimestamp);
 *   - writes the request's row in PostgreSQL's COPY text format (the column order of
 *     timelines.ingest.store._COPY_COLUMNS) and the line itself into its body chunk.
 *
 * Any line it is not sure about goes back to Python, which owns the rules (timelines.parsers.
 * audit): a line that is not valid JSON or not an audit event, a field of an unexpected type or
 * form (a timestamp that is not plain RFC 3339, an escaped auditID, a code that is not an
 * integer, ...), and every line that may hold a secret (the redactor's cheap test, repeated
 * here: a sensitive resource, a credential in the query string, a bearer/basic/JWT-looking
 * substring). So the two paths agree by construction on everything but speed; the tests compare
 * them field by field. The collapse state lives here, so a redacted final stage still closes the
 * request its RequestReceived opened. Stages that never completed are handed back by flush().
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 256 /* deeper documents go to Python (orjson allows 1024) */

/* ---- growable buffer ------------------------------------------------------------------ */

typedef struct {
    char *p;
    size_t n, cap;
} Buf;

static int buf_grow(Buf *b, size_t extra) {
    size_t want = b->n + extra;
    if (want <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < want) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -2;
    b->p = p;
    b->cap = cap;
    return 0;
}

/* Buffer functions return 0, or -2 when out of memory (-1 means "leave this line to Python"). */
static inline int buf_put(Buf *b, const char *s, size_t n) {
    /* Nothing to copy: a buffer never grown has no memory yet, and memcpy from or to NULL is
     * undefined even for 0 bytes (UBSan found it on a URI starting with an escape). */
    if (n == 0) return 0;
    if (b->n + n > b->cap && buf_grow(b, n)) return -2;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

static inline int buf_putc(Buf *b, char c) {
    if (b->n + 1 > b->cap && buf_grow(b, 1)) return -2;
    b->p[b->n++] = c;
    return 0;
}

static void buf_free(Buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* Decimal digits of v >= 0, at least ``width`` of them (zero-padded). */
static inline int buf_uint(Buf *b, unsigned long long v, int width) {
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n < width) tmp[n++] = '0';
    if (buf_grow(b, (size_t)n)) return -2;
    while (n) b->p[b->n++] = tmp[--n];
    return 0;
}

static inline int buf_int(Buf *b, long long v) {
    if (v < 0) {
        if (buf_putc(b, '-')) return -2;
        return buf_uint(b, (unsigned long long)(-(v + 1)) + 1, 1);
    }
    return buf_uint(b, (unsigned long long)v, 1);
}

/* ---- UTF-8 and JSON validation ------------------------------------------------------------ */

/* Well-formed UTF-8 (no overlongs, no surrogates, nothing past U+10FFFF), as orjson requires. */
static int utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ULL) break;
            i += 8;
        }
        if (i >= n) break;
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
        } else if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && s[i + 1] < 0xA0) return 0;  /* overlong */
            if (c == 0xED && s[i + 1] >= 0xA0) return 0; /* surrogate */
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 ||
                (s[i + 3] & 0xC0) != 0x80)
                return 0;
            if (c == 0xF0 && s[i + 1] < 0x90) return 0;
            if (c == 0xF4 && s[i + 1] >= 0x90) return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

static inline const char *ws(const char *p, const char *e) {
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

static inline int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static inline int hex4(const char *p) {
    return hexval(p[0]) >= 0 && hexval(p[1]) >= 0 && hexval(p[2]) >= 0 && hexval(p[3]) >= 0;
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
/* Whether any of the 8 bytes of ``w`` is a quote, a backslash or a control character (may say
 * yes wrongly; never no wrongly). */
static inline uint64_t string_stop(uint64_t w) {
    uint64_t q = w ^ (ONES * '"'), b = w ^ (ONES * '\\');
    return ((q - ONES) & ~q & HIGHS) | ((b - ONES) & ~b & HIGHS) | ((w - ONES * 0x20) & ~w & HIGHS);
}

/* p at the opening quote; returns the position after the closing one, or NULL. */
static const char *string_end(const char *p, const char *e, int *escaped) {
    p++;
    for (;;) {
        while (e - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            if (string_stop(w)) break;
            p += 8;
        }
        while (p < e && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) p++;
        if (p >= e || (unsigned char)*p < 0x20) return NULL;
        if (*p == '"') return p + 1;
        *escaped = 1;
        if (++p >= e) return NULL;
        switch (*p) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                p++;
                break;
            case 'u':
                if (e - p < 5 || !hex4(p + 1)) return NULL;
                p += 5;
                break;
            default:
                return NULL;
        }
    }
}

static const char *number_end(const char *p, const char *e) {
    if (p < e && *p == '-') p++;
    if (p >= e) return NULL;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < e && *p >= '0' && *p <= '9') p++;
    } else {
        return NULL;
    }
    if (p < e && *p == '.') {
        p++;
        if (p >= e || *p < '0' || *p > '9') return NULL;
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || *p < '0' || *p > '9') return NULL;
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    return p;
}

static const char *value_end(const char *p, const char *e, int depth);

static const char *object_end(const char *p, const char *e, int depth) {
    if (depth > MAX_DEPTH) return NULL;
    p = ws(p + 1, e);
    if (p < e && *p == '}') return p + 1;
    for (;;) {
        int escaped = 0;
        if (p >= e || *p != '"' || !(p = string_end(p, e, &escaped))) return NULL;
        p = ws(p, e);
        if (p >= e || *p != ':') return NULL;
        if (!(p = value_end(ws(p + 1, e), e, depth + 1))) return NULL;
        p = ws(p, e);
        if (p < e && *p == ',') {
            p = ws(p + 1, e);
            continue;
        }
        return (p < e && *p == '}') ? p + 1 : NULL;
    }
}

static const char *array_end(const char *p, const char *e, int depth) {
    if (depth > MAX_DEPTH) return NULL;
    p = ws(p + 1, e);
    if (p < e && *p == ']') return p + 1;
    for (;;) {
        if (!(p = value_end(p, e, depth + 1))) return NULL;
        p = ws(p, e);
        if (p < e && *p == ',') {
            p = ws(p + 1, e);
            continue;
        }
        return (p < e && *p == ']') ? p + 1 : NULL;
    }
}

static const char *value_end(const char *p, const char *e, int depth) {
    if (p >= e) return NULL;
    int escaped = 0;
    switch (*p) {
        case '{': return object_end(p, e, depth);
        case '[': return array_end(p, e, depth);
        case '"': return string_end(p, e, &escaped);
        case 't': return (e - p >= 4 && !memcmp(p, "true", 4)) ? p + 4 : NULL;
        case 'f': return (e - p >= 5 && !memcmp(p, "false", 5)) ? p + 5 : NULL;
        case 'n': return (e - p >= 4 && !memcmp(p, "null", 4)) ? p + 4 : NULL;
        default: return number_end(p, e);
    }
}

/* ---- picking fields ------------------------------------------------------------------------ */

/* A value inside the line: s == NULL when absent. */
typedef struct {
    const char *s, *e;
} Span;

#define ABSENT(v) ((v).s == NULL)
#define IS_NULL(v) ((v).s != NULL && *(v).s == 'n')
#define IS_STR(v) ((v).s != NULL && *(v).s == '"')
#define IS_OBJ(v) ((v).s != NULL && *(v).s == '{')
#define IS_ARR(v) ((v).s != NULL && *(v).s == '[')

static inline int key_is(const char *k, size_t n, const char *name) {
    return n && k[0] == name[0] && strlen(name) == n && !memcmp(k, name, n);
}

/* The members named in ``names`` of a (validated) object; the last one wins for a repeated key,
 * as in orjson. Returns -1 when a key holds an escape (it could spell a name we look for). */
static int members(Span obj, const char *const *names, int count, Span *out) {
    for (int i = 0; i < count; i++) out[i].s = out[i].e = NULL;
    const char *p = ws(obj.s + 1, obj.e);
    if (p < obj.e && *p == '}') return 0;
    for (;;) {
        int escaped = 0;
        const char *k = p + 1;
        p = string_end(p, obj.e, &escaped);
        if (escaped) return -1;
        size_t klen = (size_t)(p - 1 - k);
        p = ws(ws(p, obj.e) + 1, obj.e); /* past the colon */
        const char *v = p;
        p = value_end(p, obj.e, 0);
        for (int i = 0; i < count; i++) {
            if (key_is(k, klen, names[i])) {
                out[i].s = v;
                out[i].e = p;
                break;
            }
        }
        p = ws(p, obj.e);
        if (*p == '}') return 0;
        p = ws(p + 1, obj.e);
    }
}

/* ``members`` of the whole line, validating it on the way (one pass: the line is mostly request
 * and response objects, read once). Returns 0, or -1 for invalid JSON, anything after the
 * object, or an escaped key. */
static int top_members(const char *s, const char *e, const char *const *names, int count,
                       Span *out) {
    for (int i = 0; i < count; i++) out[i].s = out[i].e = NULL;
    const char *p = ws(s + 1, e);
    if (p < e && *p == '}') return ws(p + 1, e) == e ? 0 : -1;
    for (;;) {
        int escaped = 0;
        if (p >= e || *p != '"') return -1;
        const char *k = p + 1;
        if (!(p = string_end(p, e, &escaped)) || escaped) return -1;
        size_t klen = (size_t)(p - 1 - k);
        p = ws(p, e);
        if (p >= e || *p != ':') return -1;
        const char *v = ws(p + 1, e);
        if (!(p = value_end(v, e, 1))) return -1;
        for (int i = 0; i < count; i++) {
            if (key_is(k, klen, names[i])) {
                out[i].s = v;
                out[i].e = p;
                break;
            }
        }
        p = ws(p, e);
        if (p < e && *p == ',') {
            p = ws(p + 1, e);
            continue;
        }
        return (p < e && *p == '}' && p + 1 == e) ? 0 : -1;
    }
}

/* A string value's content (between the quotes), decoded into ``out`` (plain UTF-8). Returns -1
 * for a lone surrogate escape, which the Python path judges, and for a NUL (\u0000), which the
 * store replaces and counts (store.replace_nul): the line goes to Python, whose rows it sees. */
static int decode(Span v, Buf *out) {
    const char *p = v.s + 1, *e = v.e - 1;
    out->n = 0;
    while (p < e) {
        const char *run = p;
        while (p < e && *p != '\\') p++;
        if (buf_put(out, run, (size_t)(p - run))) return -2;
        if (p >= e) break;
        p++;
        char c = *p++;
        switch (c) {
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 't': c = '\t'; break;
            case 'u': {
                uint32_t cp = (uint32_t)(hexval(p[0]) << 12 | hexval(p[1]) << 8 |
                                         hexval(p[2]) << 4 | hexval(p[3]));
                p += 4;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (e - p < 6 || p[0] != '\\' || p[1] != 'u' || !hex4(p + 2)) return -1;
                    uint32_t lo = (uint32_t)(hexval(p[2]) << 12 | hexval(p[3]) << 8 |
                                             hexval(p[4]) << 4 | hexval(p[5]));
                    if (lo < 0xDC00 || lo > 0xDFFF) return -1;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    p += 6;
                } else if ((cp >= 0xDC00 && cp <= 0xDFFF) || cp == 0) {
                    return -1;
                }
                char u[4];
                size_t n;
                if (cp < 0x80) {
                    u[0] = (char)cp;
                    n = 1;
                } else if (cp < 0x800) {
                    u[0] = (char)(0xC0 | cp >> 6);
                    u[1] = (char)(0x80 | (cp & 0x3F));
                    n = 2;
                } else if (cp < 0x10000) {
                    u[0] = (char)(0xE0 | cp >> 12);
                    u[1] = (char)(0x80 | (cp >> 6 & 0x3F));
                    u[2] = (char)(0x80 | (cp & 0x3F));
                    n = 3;
                } else {
                    u[0] = (char)(0xF0 | cp >> 18);
                    u[1] = (char)(0x80 | (cp >> 12 & 0x3F));
                    u[2] = (char)(0x80 | (cp >> 6 & 0x3F));
                    u[3] = (char)(0x80 | (cp & 0x3F));
                    n = 4;
                }
                if (buf_put(out, u, n)) return -2;
                continue;
            }
            default: break; /* '"', '\\', '/' stand for themselves */
        }
        if (buf_putc(out, c)) return -2;
    }
    return 0;
}

/* COPY text escaping, the rule of store.copy_escape: backslash, tab, newline and CR escaped,
 * every other character as it is. A NUL never comes here (decode hands its line to Python); if
 * one did, it would become U+FFFD as there. */
static int copy_escape(Buf *out, const char *s, size_t n) {
    if (buf_grow(out, 3 * n)) return -2;
    char *o = out->p + out->n;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        switch (c) {
            case '\\': *o++ = '\\'; *o++ = '\\'; break;
            case '\t': *o++ = '\\'; *o++ = 't'; break;
            case '\n': *o++ = '\\'; *o++ = 'n'; break;
            case '\r': *o++ = '\\'; *o++ = 'r'; break;
            case '\0': *o++ = '\xEF'; *o++ = '\xBF'; *o++ = '\xBD'; break;
            default: *o++ = c;
        }
    }
    out->n = (size_t)(o - out->p);
    return 0;
}

/* \u0000 or a lone surrogate escape, which jsonb refuses (the Python path drops or rejects
 * them). */
static int bad_jsonb_escape(const char *s, size_t n) {
    for (const char *p = s; (p = memchr(p, '\\', (size_t)(s + n - p))) != NULL; p += 2) {
        if (p + 5 >= s + n || p[1] != 'u') continue;
        int cp = hexval(p[2]) << 12 | hexval(p[3]) << 8 | hexval(p[4]) << 4 | hexval(p[5]);
        if (cp == 0 || (cp >= 0xD800 && cp <= 0xDFFF)) return 1;
    }
    return 0;
}

/* ---- times ----------------------------------------------------------------------------------- */

static int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const unsigned yoe = (unsigned)(y - era * 400);
    const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

static void civil_from_days(int64_t z, int *y, unsigned *m, unsigned *d) {
    z += 719468;
    const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    const unsigned doe = (unsigned)(z - era * 146097);
    const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    const int64_t yy = (int64_t)yoe + era * 400;
    const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    const unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (int)(yy + (*m <= 2));
}

static inline int digits(const char *p, int n) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return -1;
        v = v * 10 + (p[i] - '0');
    }
    return v;
}

/* ``YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM)`` as microseconds since the epoch (fraction
 * truncated to microseconds, like timelines.parsers.base.parse_time). Anything else: -1, and
 * the Python path decides. */
static int parse_rfc3339(const char *s, size_t n, int64_t *out) {
    if (n < 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':')
        return -1;
    int y = digits(s, 4), mo = digits(s + 5, 2), d = digits(s + 8, 2);
    int h = digits(s + 11, 2), mi = digits(s + 14, 2), sec = digits(s + 17, 2);
    if (y < 1 || mo < 1 || mo > 12 || d < 1 || h < 0 || h > 23 || mi < 0 || mi > 59 || sec < 0 ||
        sec > 59)
        return -1;
    static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (d > mdays[mo - 1] + (mo == 2 && leap)) return -1;
    size_t i = 19;
    int64_t micros = 0;
    if (i < n && s[i] == '.') {
        i++;
        size_t start = i;
        int kept = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            if (kept < 6) {
                micros = micros * 10 + (s[i] - '0');
                kept++;
            }
            i++;
        }
        if (i == start) return -1;
        while (kept++ < 6) micros *= 10;
    }
    int64_t offset = 0;
    if (i + 1 == n && s[i] == 'Z') {
        i++;
    } else if (i + 6 == n && (s[i] == '+' || s[i] == '-') && s[i + 3] == ':') {
        int oh = digits(s + i + 1, 2), om = digits(s + i + 4, 2);
        if (oh < 0 || oh > 23 || om < 0 || om > 59) return -1;
        offset = (s[i] == '+' ? 1 : -1) * (int64_t)(oh * 3600 + om * 60);
        i += 6;
    } else {
        return -1;
    }
    int64_t days = days_from_civil(y, (unsigned)mo, (unsigned)d);
    int64_t secs = days * 86400 + h * 3600 + mi * 60 + sec - offset;
    /* Python's datetime range, in UTC */
    if (secs < -62135596800LL || secs > 253402300799LL) return -1;
    *out = secs * 1000000 + micros;
    return 0;
}

/* As datetime.isoformat() of the UTC time: 2025-01-01T00:00:00.123456+00:00, no fraction when
 * it is zero. */
static int put_time(Buf *b, int64_t us) {
    int64_t secs = us >= 0 ? us / 1000000 : -((-us + 999999) / 1000000);
    int64_t frac = us - secs * 1000000;
    int64_t days = secs >= 0 ? secs / 86400 : -((-secs + 86399) / 86400);
    int64_t rem = secs - days * 86400;
    int y;
    unsigned m, d;
    civil_from_days(days, &y, &m, &d);
    if (buf_uint(b, (unsigned)y, 4) || buf_putc(b, '-') || buf_uint(b, m, 2) ||
        buf_putc(b, '-') || buf_uint(b, d, 2) || buf_putc(b, 'T') ||
        buf_uint(b, (unsigned)(rem / 3600), 2) || buf_putc(b, ':') ||
        buf_uint(b, (unsigned)(rem / 60 % 60), 2) || buf_putc(b, ':') ||
        buf_uint(b, (unsigned)(rem % 60), 2))
        return -2;
    if (frac && (buf_putc(b, '.') || buf_uint(b, (unsigned long long)frac, 6))) return -2;
    return buf_put(b, "+00:00", 6);
}

/* A request's duration in ms, as the Python path computes it: (completed - received)
 * .total_seconds() * 1000.0. Written as the exact decimal of the microseconds when that reads
 * back as the same double (nearly always), else with 17 significant digits. */
static int put_duration(Buf *b, int64_t us) {
    double ms = (double)us / 1e6 * 1000.0;
    if (ms == (double)us / 1000.0) { /* the correctly rounded value of us/1000 */
        int64_t whole = us / 1000, part = us % 1000;
        if (us < 0) {
            if (buf_putc(b, '-')) return -2;
            whole = -whole;
            part = -part;
        }
        if (buf_uint(b, (unsigned long long)whole, 1) || buf_putc(b, '.') ||
            buf_uint(b, (unsigned long long)part, 3))
            return -2;
        return 0;
    }
    char tmp[40];
    int len = snprintf(tmp, sizeof tmp, "%.17g", ms);
    return buf_put(b, tmp, (size_t)len);
}

/* ---- what the redactor would look at ------------------------------------------------------ */

static int contains(const char *s, size_t n, const char *needle) {
    return memmem(s, n, needle, strlen(needle)) != NULL;
}

/* redact.may_hold_token: "eyJ", "earer ", "asic ", "EARER " or "ASIC " anywhere in the line,
 * found from the rarer last characters (memchr is much faster than five memmem). */
static int may_hold_token(const char *s, size_t n) {
    const char *e = s + n;
    for (const char *p = s; (p = memchr(p, 'J', (size_t)(e - p))) != NULL; p++)
        if (p - s >= 2 && p[-2] == 'e' && p[-1] == 'y') return 1;
    for (const char *p = s; (p = memchr(p, ' ', (size_t)(e - p))) != NULL; p++) {
        if (p - s >= 5 && (!memcmp(p - 5, "earer", 5) || !memcmp(p - 5, "EARER", 5))) return 1;
        if (p - s >= 4 && (!memcmp(p - 4, "asic", 4) || !memcmp(p - 4, "ASIC", 4))) return 1;
    }
    return 0;
}

/* redact.URI_SECRET: [?&](access_token|id_token|refresh_token|token|password|client_secret|
 * code|sig|signature)= , case-insensitive. */
static int uri_has_secret(const char *s, size_t n) {
    static const char *const names[] = {"access_token", "id_token", "refresh_token", "token",
                                        "password", "client_secret", "code", "sig", "signature"};
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '?' && s[i] != '&') continue;
        for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
            size_t len = strlen(names[k]);
            if (i + 1 + len < n && !strncasecmp(s + i + 1, names[k], len) && s[i + 1 + len] == '=')
                return 1;
        }
    }
    return 0;
}

/* redact.SENSITIVE_RESOURCES */
static int sensitive_resource(const char *s, size_t n) {
    static const char *const names[] = {"secrets", "configmaps", "tokenreviews", "routes",
                                        "serviceaccounts", "tokenrequests"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++)
        if (key_is(s, n, names[k])) return 1;
    return 0;
}

/* ---- pending requests (stages before the final one) --------------------------------------- */

typedef struct {
    uint64_t hash;     /* 0: empty slot; 1: deleted */
    char *line;        /* a copy of the stripped line */
    size_t len;
    size_t id_off, id_len, rx_off, rx_len; /* the key inside ``line`` */
    long long number;
    int rank;
} Entry;

typedef struct {
    Entry *slots;
    size_t cap, used, deleted;
} Table;

static uint64_t key_hash(const char *a, size_t an, const char *b, size_t bn) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < an; i++) h = (h ^ (unsigned char)a[i]) * 1099511628211ULL;
    h = (h ^ 0xff) * 1099511628211ULL;
    for (size_t i = 0; i < bn; i++) h = (h ^ (unsigned char)b[i]) * 1099511628211ULL;
    h ^= h >> 29;
    return h < 2 ? h + 2 : h;
}

static Entry *table_find(Table *t, uint64_t h, const char *a, size_t an, const char *b,
                         size_t bn, int for_insert) {
    if (!t->cap) return NULL;
    size_t mask = t->cap - 1, i = h & mask;
    Entry *tomb = NULL;
    for (;;) {
        Entry *s = &t->slots[i];
        if (s->hash == 0) return for_insert ? (tomb ? tomb : s) : NULL;
        if (s->hash == 1) {
            if (!tomb) tomb = s;
        } else if (s->hash == h && s->id_len == an && s->rx_len == bn &&
                   !memcmp(s->line + s->id_off, a, an) && !memcmp(s->line + s->rx_off, b, bn)) {
            return s;
        }
        i = (i + 1) & mask;
    }
}

static int table_resize(Table *t) {
    size_t cap = t->cap ? t->cap : 1024;
    while ((t->used + 1) * 2 > cap) cap *= 2;
    Entry *old = t->slots;
    size_t old_cap = t->cap;
    t->slots = calloc(cap, sizeof(Entry));
    if (!t->slots) {
        t->slots = old;
        return -1;
    }
    t->cap = cap;
    t->deleted = 0;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].hash < 2) continue;
        size_t j = old[i].hash & (cap - 1);
        while (t->slots[j].hash) j = (j + 1) & (cap - 1);
        t->slots[j] = old[i];
    }
    free(old);
    return 0;
}

static void table_remove(Table *t, Entry *s) {
    free(s->line);
    s->line = NULL;
    s->hash = 1;
    t->used--;
    t->deleted++;
}

/* ---- the scanner --------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *next_chunk_id; /* callable giving the id of the next body chunk */
    Buf head;                /* "incident\tupload\t" */
    Buf mid;                 /* "\tsource\taudit\t\t\t\t\t\t": the columns after request_uri */
    Py_ssize_t chunk_rows;
    int redact;
    Table pending;
    Buf tmp, tmp2, row;
} Scanner;

static void scanner_clear_pending(Scanner *self) {
    for (size_t i = 0; i < self->pending.cap; i++)
        if (self->pending.slots[i].hash >= 2) free(self->pending.slots[i].line);
    free(self->pending.slots);
    memset(&self->pending, 0, sizeof self->pending);
}

static void Scanner_dealloc(Scanner *self) {
    Py_XDECREF(self->next_chunk_id);
    buf_free(&self->head);
    buf_free(&self->mid);
    buf_free(&self->tmp);
    buf_free(&self->tmp2);
    buf_free(&self->row);
    scanner_clear_pending(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Scanner_init(Scanner *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"head", "mid", "next_chunk_id", "chunk_rows", "redact", NULL};
    const char *head, *mid;
    Py_ssize_t head_len, mid_len;
    PyObject *next;
    Py_ssize_t chunk_rows;
    int redact;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y#y#Onp", kwlist, &head, &head_len, &mid,
                                     &mid_len, &next, &chunk_rows, &redact))
        return -1;
    if (!PyCallable_Check(next) || chunk_rows < 1) {
        PyErr_SetString(PyExc_ValueError, "next_chunk_id must be callable, chunk_rows >= 1");
        return -1;
    }
    Py_INCREF(next);
    Py_XSETREF(self->next_chunk_id, next);
    self->head.n = self->mid.n = 0;
    if (buf_put(&self->head, head, (size_t)head_len) || buf_put(&self->mid, mid, (size_t)mid_len)) {
        PyErr_NoMemory();
        return -1;
    }
    self->chunk_rows = chunk_rows;
    self->redact = redact;
    return 0;
}

/* What a line turned out to be. */
enum { FAST, SLOW_FINAL, OTHER, PENDING };

static const char *const TOP[] = {"kind", "apiVersion", "level", "auditID", "stage",
                                  "requestURI", "verb", "user", "impersonatedUser", "sourceIPs",
                                  "userAgent", "objectRef", "responseStatus",
                                  "requestReceivedTimestamp", "stageTimestamp", "annotations",
                                  "requestObject", "responseObject"};
enum { K_KIND, K_APIVERSION, K_LEVEL, K_AUDITID, K_STAGE, K_URI, K_VERB, K_USER, K_IMPERSONATED,
       K_SOURCEIPS, K_USERAGENT, K_OBJECTREF, K_STATUS, K_RECEIVED, K_STAGETIME, K_ANNOTATIONS,
       K_REQUEST, K_RESPONSE, K_COUNT };
static const char *const REF[] = {"resource", "subresource", "namespace", "name",
                                  "apiGroup", "apiVersion", "uid", "resourceVersion"};
enum { R_RESOURCE, R_SUBRESOURCE, R_NAMESPACE, R_NAME, R_GROUP, R_VERSION, R_UID, R_RV, R_COUNT };
static const char *const USER[] = {"username", "groups"};

/* A string-or-missing field (Python: ``value or ""``): 1 string, 0 missing/null/empty, -1 any
 * other type. */
static inline int opt_str(Span v) {
    if (ABSENT(v) || IS_NULL(v)) return 0;
    if (!IS_STR(v)) return -1;
    return v.e - v.s > 2;
}

/* An object-or-missing field (Python: ``value or {}``). */
static inline int opt_obj(Span v) {
    if (ABSENT(v) || IS_NULL(v)) return 0;
    return IS_OBJ(v) ? 1 : -1;
}

/* Append a string field to the row, COPY-escaped; "" when missing. */
static int put_field(Scanner *self, Span v) {
    if (opt_str(v) <= 0) return 0;
    const char *s = v.s + 1;
    size_t n = (size_t)(v.e - v.s - 2);
    if (!memchr(s, '\\', n)) return buf_put(&self->row, s, n); /* nothing to unescape or escape */
    int r = decode(v, &self->tmp);
    if (r) return r;
    return copy_escape(&self->row, self->tmp.p, self->tmp.n);
}

static inline int str_eq(Span v, const char *lit) {
    size_t n = strlen(lit);
    return IS_STR(v) && (size_t)(v.e - v.s) == n + 2 && !memcmp(v.s + 1, lit, n);
}

/* For an event of a sensitive resource: whether redact.Redactor.redact_event could replace
 * anything beyond what the other tests here look for; the rule of redact._objects_to_walk. */
static int walk_finds_objects(const Span *top, const Span *refs, const char *s, size_t n) {
    if (contains(s, n, "\\u")) return 1;
    Span req = top[K_REQUEST], resp = top[K_RESPONSE];
    if ((ABSENT(req) || IS_NULL(req)) && (ABSENT(resp) || IS_NULL(resp))) return 0;
    Span res = refs[R_RESOURCE], sub = refs[R_SUBRESOURCE];
    if (!str_eq(res, "serviceaccounts") || str_eq(sub, "token")) return 1;
    return contains(s, n, "Secret") || contains(s, n, "ConfigMap") ||
           contains(s, n, "TokenReview") || contains(s, n, "TokenRequest") ||
           contains(s, n, "Route") || contains(s, n, "last-applied-configuration");
}

/*
 * Classify one stripped line and, for FAST, append its row to self->row. Sets the key and rank
 * for the collapse. Returns FAST, SLOW_FINAL (final stage, may hold a secret), PENDING (a stage
 * before the final one), OTHER (Python decides), or -2 on memory exhaustion.
 */
static int scan_line(Scanner *self, const char *s, size_t n, long long number, Span *id, Span *rx,
                     int *rank) {
    int slow = 0;
    if (n < 2 || s[0] != '{' || !utf8_valid((const unsigned char *)s, n)) return OTHER;
    const char *e = s + n;
    Span top[K_COUNT];
    if (top_members(s, e, TOP, K_COUNT, top)) return OTHER;

    /* timelines.parsers.audit._check, for the shape handled here */
    if (!ABSENT(top[K_KIND]) && !IS_NULL(top[K_KIND]) && !str_eq(top[K_KIND], "Event"))
        return OTHER;
    Span av = top[K_APIVERSION];
    if (!ABSENT(av) && !IS_NULL(av) &&
        !(IS_STR(av) && av.e - av.s >= 15 && !memcmp(av.s + 1, "audit.k8s.io/", 13)))
        return OTHER;
    *id = top[K_AUDITID];
    *rx = top[K_RECEIVED];
    Span stage = top[K_STAGE];
    if (opt_str(*id) != 1 || opt_str(*rx) != 1 || !IS_STR(stage)) return OTHER;
    if (memchr(id->s, '\\', (size_t)(id->e - id->s)) || memchr(rx->s, '\\', (size_t)(rx->e - rx->s)) ||
        memchr(stage.s, '\\', (size_t)(stage.e - stage.s)))
        return OTHER;
    int final = str_eq(stage, "ResponseComplete") || str_eq(stage, "Panic");
    *rank = final ? 2 : str_eq(stage, "ResponseStarted") ? 1 : 0;
    /* An earlier stage only waits for its request's final one; if that never comes, Python
     * builds its row from the line (flush), so nothing more is read here. */
    if (!final) return PENDING;

    /* timelines.parsers.redact.Redactor.needs_walk */
    Span ref = top[K_OBJECTREF], uri = top[K_URI];
    Span refs[R_COUNT];
    int has_ref = opt_obj(ref);
    if (has_ref < 0) return OTHER;
    if (has_ref) {
        if (members(ref, REF, R_COUNT, refs)) return OTHER;
    } else {
        for (int i = 0; i < R_COUNT; i++) refs[i].s = refs[i].e = NULL;
    }
    int has_uri = opt_str(uri);
    if (has_uri < 0) return OTHER;
    if (self->redact) {
        Span res = refs[R_RESOURCE];
        if (IS_STR(res)) {
            if (memchr(res.s, '\\', (size_t)(res.e - res.s))) return OTHER;
            slow = sensitive_resource(res.s + 1, (size_t)(res.e - res.s - 2)) &&
                   walk_finds_objects(top, refs, s, n);
        }
        if (!slow && has_uri) {
            int r = decode(uri, &self->tmp);
            if (r == -1) return OTHER;
            if (r) return -2;
            slow = memchr(self->tmp.p, '=', self->tmp.n) && uri_has_secret(self->tmp.p, self->tmp.n);
        }
        if (!slow) slow = may_hold_token(s, n);
    }
    if (slow) return SLOW_FINAL;

    /* the row: timelines.parsers.audit._build_row, then store._copy_text */
    int64_t received, completed;
    Span st = top[K_STAGETIME];
    if (!IS_STR(st) || memchr(st.s, '\\', (size_t)(st.e - st.s)) ||
        parse_rfc3339(rx->s + 1, (size_t)(rx->e - rx->s - 2), &received) ||
        parse_rfc3339(st.s + 1, (size_t)(st.e - st.s - 2), &completed))
        return OTHER;
    Span user[2] = {{NULL, NULL}, {NULL, NULL}}, imp[2] = {{NULL, NULL}, {NULL, NULL}};
    int has_user = opt_obj(top[K_USER]), has_imp = opt_obj(top[K_IMPERSONATED]);
    if (has_user < 0 || has_imp < 0) return OTHER;
    if (has_user && members(top[K_USER], USER, 2, user)) return OTHER;
    if (has_imp && members(top[K_IMPERSONATED], USER, 1, imp)) return OTHER;
    Span status[1] = {{NULL, NULL}};
    static const char *const STATUS[] = {"code"};
    int has_status = opt_obj(top[K_STATUS]);
    if (has_status < 0) return OTHER;
    if (has_status && members(top[K_STATUS], STATUS, 1, status)) return OTHER;
    /* every string field must be a string (or missing/null) */
    static const int text_keys[] = {K_VERB, K_USERAGENT, K_LEVEL};
    for (size_t i = 0; i < sizeof text_keys / sizeof *text_keys; i++)
        if (opt_str(top[text_keys[i]]) < 0) return OTHER;
    for (int i = 0; i < R_COUNT; i++)
        if (opt_str(refs[i]) < 0) return OTHER;
    if (opt_str(user[0]) < 0 || opt_str(imp[0]) < 0) return OTHER;

    Buf *row = &self->row;
    size_t start = row->n;
#define TRY(x) do { int r_ = (x); if (r_ == -1) goto other; if (r_) return -2; } while (0)
#define TAB() TRY(buf_putc(row, '\t'))
    TRY(buf_put(row, self->head.p, self->head.n));
    TRY(buf_put(row, id->s + 1, (size_t)(id->e - id->s - 2)));
    TAB(); TRY(put_field(self, top[K_VERB]));
    TAB(); TRY(put_field(self, user[0]));
    TAB(); TRY(put_field(self, imp[0]));
    TAB(); TRY(put_field(self, top[K_USERAGENT]));
    TAB();
    /* source_ip: the first of sourceIPs (or sourceIPs itself when a string) */
    Span ips = top[K_SOURCEIPS];
    if (IS_ARR(ips)) {
        const char *p = ws(ips.s + 1, ips.e);
        if (*p != ']') {
            Span first = {p, value_end(p, ips.e, 0)};
            if (IS_STR(first))
                TRY(put_field(self, first));
            else if (!IS_NULL(first))
                goto other;
        }
    } else if (IS_STR(ips)) {
        TRY(put_field(self, ips));
    } else if (!ABSENT(ips) && !IS_NULL(ips)) {
        goto other;
    }
    for (int i = R_RESOURCE; i <= R_NAME; i++) {
        TAB();
        TRY(put_field(self, refs[i]));
    }
    /* v1alpha1: objectRef.apiVersion is group/version */
    Span group = refs[R_GROUP], version = refs[R_VERSION];
    char *slash = NULL;
    if (opt_str(group) == 0 && opt_str(version) == 1) {
        int r = decode(version, &self->tmp2); /* a slash may be written \/ or \u002f */
        if (r == -1) goto other;
        if (r) return -2;
        for (char *c = self->tmp2.p + self->tmp2.n; c > self->tmp2.p && !slash; c--)
            if (c[-1] == '/') slash = c - 1;
    }
    if (slash) {
        TAB();
        TRY(copy_escape(row, self->tmp2.p, (size_t)(slash - self->tmp2.p)));
        TAB();
        TRY(copy_escape(row, slash + 1, (size_t)(self->tmp2.p + self->tmp2.n - slash - 1)));
    } else {
        TAB(); TRY(put_field(self, group));
        TAB(); TRY(put_field(self, version));
    }
    TAB(); TRY(put_field(self, refs[R_UID]));
    TAB(); TRY(put_field(self, refs[R_RV]));
    TAB(); TRY(put_field(self, top[K_LEVEL]));
    TAB(); TRY(buf_put(row, stage.s + 1, (size_t)(stage.e - stage.s - 2)));
    TAB(); TRY(put_field(self, uri));
    TRY(buf_put(row, self->mid.p, self->mid.n));
    TRY(put_time(row, received));
    TAB(); TRY(put_time(row, completed));
    TAB(); TRY(put_duration(row, completed - received));
    TAB();
    /* groups as a PostgreSQL array literal */
    {
        Span groups = user[1];
        Buf *lit = &self->tmp2;
        lit->n = 0;
        TRY(buf_putc(lit, '{'));
        if (IS_ARR(groups)) {
            const char *p = ws(groups.s + 1, groups.e);
            int first = 1;
            while (*p != ']') {
                Span g = {p, value_end(p, groups.e, 0)};
                if (!IS_STR(g)) goto other;
                int r = decode(g, &self->tmp);
                if (r == -1) goto other;
                if (r) return -2;
                if (!first) TRY(buf_putc(lit, ','));
                first = 0;
                TRY(buf_putc(lit, '"'));
                for (size_t i = 0; i < self->tmp.n; i++) {
                    char c = self->tmp.p[i];
                    if (c == '\\' || c == '"') TRY(buf_putc(lit, '\\'));
                    TRY(buf_putc(lit, c));
                }
                TRY(buf_putc(lit, '"'));
                p = ws(ws(g.e, groups.e), groups.e);
                if (*p == ',') p = ws(p + 1, groups.e);
            }
        } else if (!ABSENT(groups) && !IS_NULL(groups)) {
            goto other;
        }
        TRY(buf_putc(lit, '}'));
        TRY(copy_escape(row, lit->p, lit->n));
    }
    TAB();
    /* code: an integer (a float or missing: NULL) */
    {
        Span code = status[0];
        if (ABSENT(code) || IS_NULL(code)) {
            TRY(buf_put(row, "\\N", 2));
        } else if (*code.s == '-' || (*code.s >= '0' && *code.s <= '9')) {
            size_t len = (size_t)(code.e - code.s);
            if (memchr(code.s, '.', len) || memchr(code.s, 'e', len) || memchr(code.s, 'E', len)) {
                TRY(buf_put(row, "\\N", 2));
            } else {
                if (len > 10) goto other;
                long long v = strtoll(code.s, NULL, 10);
                if (v < INT32_MIN || v > INT32_MAX) goto other;
                TRY(buf_put(row, code.s, len));
            }
        } else {
            goto other;
        }
    }
    TAB();
    /* annotations: the object as written (jsonb parses it), {} when missing */
    {
        Span ann = top[K_ANNOTATIONS];
        if (IS_OBJ(ann)) {
            size_t len = (size_t)(ann.e - ann.s);
            if (bad_jsonb_escape(ann.s, len)) goto other;
            TRY(copy_escape(row, ann.s, len));
        } else if (ABSENT(ann) || IS_NULL(ann) || IS_STR(ann) || IS_ARR(ann) ||
                   *ann.s == 't' || *ann.s == 'f' || *ann.s == '-' ||
                   (*ann.s >= '0' && *ann.s <= '9')) {
            TRY(buf_put(row, "{}", 2)); /* Python: not a dict -> {} */
        } else {
            goto other;
        }
    }
    TAB(); TRY(buf_int(row, number));
    TRY(buf_put(row, "\t\\N\t", 4));
    return FAST;
other:
    row->n = start;
    return OTHER;
#undef TRY
#undef TAB
}

static int strip(const char **s, size_t *n) {
    const char *p = *s, *e = *s + *n;
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n' || *p == '\v' || *p == '\f')) p++;
    while (e > p && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' || e[-1] == '\n' ||
                     e[-1] == '\v' || e[-1] == '\f'))
        e--;
    *s = p;
    *n = (size_t)(e - p);
    return *n > 0;
}

/* Append (number, line[, extra]) to a Python list. */
static int append_line(PyObject *list, long long number, const char *s, size_t n) {
    PyObject *item = Py_BuildValue("(Ly#)", number, s, (Py_ssize_t)n);
    if (!item) return -1;
    int r = PyList_Append(list, item);
    Py_DECREF(item);
    return r;
}



/* A line for Python (a final stage to redact, or a line to judge), by its place in the block. */
typedef struct {
    long long number;
    size_t offset, len;
    int final;
} Handback;

/* Growable array of fixed-size items. */
typedef struct {
    char *p;
    size_t n, cap, size;
} Array;

static void *array_push(Array *a) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 256;
        char *p = realloc(a->p, cap * a->size);
        if (!p) return NULL;
        a->p = p;
        a->cap = cap;
    }
    return a->p + a->size * a->n++;
}

/*
 * The scan itself, without the GIL (the writer thread runs meanwhile; holding the GIL through a
 * block made it wait for it at every step): rows go to self->row without their body reference,
 * the end of each in ``ends``; their lines, joined by newlines, to ``body`` (row i's line
 * starting at starts[i]); lines for Python to ``handback``. Returns 0, or -2 when out of memory.
 */
static int scan_block(Scanner *self, const char *begin, const char *end, long long *number,
                      Array *ends, Array *starts, Buf *body, Array *handback) {
    const char *p = begin;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *s = p;
        size_t n = (size_t)((nl ? nl : end) - p);
        p = nl ? nl + 1 : end;
        ++*number;
        if (!strip(&s, &n)) continue;
        Span id, rx;
        int rank = 0;
        int kind = scan_line(self, s, n, *number, &id, &rx, &rank);
        if (kind == -2) return -2;
        if (kind == OTHER) {
            Handback *h = array_push(handback);
            if (!h) return -2;
            *h = (Handback){*number, (size_t)(s - begin), n, 0};
            continue;
        }
        const char *a = id.s + 1, *b = rx.s + 1;
        size_t an = (size_t)(id.e - id.s - 2), bn = (size_t)(rx.e - rx.s - 2);
        uint64_t h = key_hash(a, an, b, bn);
        Table *t = &self->pending;
        if (kind == PENDING) {
            /* audit._collapse: kept unless a later stage of the request is pending already */
            if ((t->used + t->deleted + 1) * 2 > t->cap && table_resize(t)) return -2;
            Entry *slot = table_find(t, h, a, an, b, bn, 1);
            if (slot->hash >= 2 && slot->rank > rank) continue;
            char *copy = malloc(n);
            if (!copy) return -2;
            memcpy(copy, s, n);
            if (slot->hash >= 2) {
                free(slot->line);
            } else {
                if (slot->hash == 1) t->deleted--;
                t->used++;
            }
            *slot = (Entry){h, copy, n, (size_t)(a - s), an, (size_t)(b - s), bn, *number, rank};
            continue;
        }
        Entry *slot = table_find(t, h, a, an, b, bn, 0);
        if (slot) table_remove(t, slot);
        if (kind == SLOW_FINAL) {
            Handback *hb = array_push(handback);
            if (!hb) return -2;
            *hb = (Handback){*number, (size_t)(s - begin), n, 1};
            continue;
        }
        size_t *row_end = array_push(ends), *start = array_push(starts);
        if (!row_end || !start) return -2;
        *row_end = self->row.n;
        if (body->n && buf_putc(body, '\n')) return -2;
        *start = body->n;
        if (buf_put(body, s, n)) return -2;
    }
    return 0;
}

PyDoc_STRVAR(feed_doc,
"feed(block, first_line) -> (copy_text, rows, bodies, finals, others, next_line)\n\n"
"Scan the lines of ``block`` (complete lines; the first is line ``first_line``).\n"
"copy_text: COPY rows of the requests completed here that need nothing of Python;\n"
"rows: how many; bodies: [(chunk_id, lines joined by newlines)], the stored lines of those rows\n"
"(row i is line i %% chunk_rows of chunk i // chunk_rows); finals: [(line number, line)] final\n"
"stages that the redactor must see (their requests are closed here); others: [(line number,\n"
"line)] lines for the Python parser (not audit events of the usual shape, malformed lines);\n"
"next_line: the number of the line after the block's last.");

static PyObject *Scanner_feed(Scanner *self, PyObject *args) {
    Py_buffer view;
    long long number;
    if (!PyArg_ParseTuple(args, "y*L", &view, &number)) return NULL;
    PyObject *bodies = PyList_New(0), *finals = PyList_New(0), *others = PyList_New(0);
    PyObject *result = NULL;
    Array ends = {.size = sizeof(size_t)}, starts = {.size = sizeof(size_t)};
    Array handback = {.size = sizeof(Handback)};
    Buf body = {0}, text = {0};
    if (!bodies || !finals || !others) goto done;
    self->row.n = 0;
    const char *begin = view.buf;
    long long last = number - 1;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = scan_block(self, begin, begin + view.len, &last, &ends, &starts, &body, &handback);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t i = 0; i < handback.n; i++) {
        Handback *h = (Handback *)handback.p + i;
        if (append_line(h->final ? finals : others, h->number, begin + h->offset, h->len))
            goto done;
    }
    /* Each row with its body chunk's id (asked of Python now) and its place in the chunk. */
    size_t rows = ends.n, chunk_rows = (size_t)self->chunk_rows;
    size_t *row_ends = (size_t *)ends.p, *body_starts = (size_t *)starts.p;
    if (buf_grow(&text, self->row.n + rows * 24)) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t first = 0; first < rows; first += chunk_rows) {
        size_t last_row = first + chunk_rows < rows ? first + chunk_rows : rows;
        PyObject *next = PyObject_CallNoArgs(self->next_chunk_id);
        if (!next) goto done;
        long long chunk_id = PyLong_AsLongLong(next);
        Py_DECREF(next);
        if (chunk_id == -1 && PyErr_Occurred()) goto done;
        size_t body_end = last_row < rows ? body_starts[last_row] - 1 : body.n;
        PyObject *item = Py_BuildValue("(Ly#)", chunk_id, body.p + body_starts[first],
                                       (Py_ssize_t)(body_end - body_starts[first]));
        if (!item || PyList_Append(bodies, item)) {
            Py_XDECREF(item);
            goto done;
        }
        Py_DECREF(item);
        for (size_t i = first; i < last_row; i++) {
            size_t row_start = i ? row_ends[i - 1] : 0;
            if (buf_put(&text, self->row.p + row_start, row_ends[i] - row_start) ||
                buf_int(&text, chunk_id) || buf_putc(&text, '\t') ||
                buf_uint(&text, i - first, 1) || buf_putc(&text, '\n')) {
                PyErr_NoMemory();
                goto done;
            }
        }
    }
    result = Py_BuildValue("(y#nOOOL)", text.p ? text.p : "", (Py_ssize_t)text.n,
                           (Py_ssize_t)rows, bodies, finals, others, last + 1);
done:
    buf_free(&body);
    buf_free(&text);
    free(ends.p);
    free(starts.p);
    free(handback.p);
    if (self->row.cap > (64u << 20)) buf_free(&self->row);
    Py_XDECREF(bodies);
    Py_XDECREF(finals);
    Py_XDECREF(others);
    PyBuffer_Release(&view);
    return result;
}

static int by_number(const void *a, const void *b) {
    long long x = (*(Entry *const *)a)->number, y = (*(Entry *const *)b)->number;
    return (x > y) - (x < y);
}

PyDoc_STRVAR(flush_doc,
"flush() -> [(line number, line)]\n\n"
"The last seen stage of every request whose final stage never came (open spans), in line\n"
"order; empties the table.");

static PyObject *Scanner_flush(Scanner *self, PyObject *Py_UNUSED(ignored)) {
    Table *t = &self->pending;
    Entry **order = malloc((t->used ? t->used : 1) * sizeof(Entry *));
    if (!order) return PyErr_NoMemory();
    size_t k = 0;
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].hash >= 2) order[k++] = &t->slots[i];
    qsort(order, k, sizeof *order, by_number);
    PyObject *list = PyList_New(0);
    for (size_t i = 0; list && i < k; i++) {
        if (append_line(list, order[i]->number, order[i]->line, order[i]->len)) Py_CLEAR(list);
    }
    free(order);
    if (list) scanner_clear_pending(self);
    return list;
}

PyDoc_STRVAR(forget_doc,
"forget(audit_id, received) -> bool\n\n"
"Drop the pending stage of a request that the Python parser has just completed.");

static PyObject *Scanner_forget(Scanner *self, PyObject *args) {
    const char *a, *b;
    Py_ssize_t an, bn;
    if (!PyArg_ParseTuple(args, "s#s#", &a, &an, &b, &bn)) return NULL;
    Entry *slot = table_find(&self->pending, key_hash(a, (size_t)an, b, (size_t)bn), a,
                             (size_t)an, b, (size_t)bn, 0);
    if (slot) table_remove(&self->pending, slot);
    return PyBool_FromLong(slot != NULL);
}

static PyObject *Scanner_pending(Scanner *self, void *Py_UNUSED(closure)) {
    return PyLong_FromSize_t(self->pending.used);
}

static PyMethodDef Scanner_methods[] = {
    {"feed", (PyCFunction)Scanner_feed, METH_VARARGS, feed_doc},
    {"flush", (PyCFunction)Scanner_flush, METH_NOARGS, flush_doc},
    {"forget", (PyCFunction)Scanner_forget, METH_VARARGS, forget_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Scanner_getset[] = {
    {"pending", (getter)Scanner_pending, NULL, "requests waiting for their final stage", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(Scanner_doc,
"Scanner(head, mid, next_chunk_id, chunk_rows, redact)\n\n"
"Audit log lines to COPY rows; see the module source for what it leaves to Python.\n"
"head: the COPY columns before audit_id (incident, upload); mid: those between request_uri\n"
"and received (source, kind, and the empty columns of other evidence kinds), both escaped and\n"
"tab-separated; next_chunk_id(): the id of a new body chunk; redact: whether lines that may\n"
"hold secrets go to Python.");

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "timelines.parsers._auditscan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = Scanner_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Scanner_init,
    .tp_dealloc = (destructor)Scanner_dealloc,
    .tp_methods = Scanner_methods,
    .tp_getset = Scanner_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_auditscan",
    .m_doc = "The hot loop of audit-log ingest (see the Scanner type).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__auditscan(void) {
    if (PyType_Ready(&ScannerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(m, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(&ScannerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
