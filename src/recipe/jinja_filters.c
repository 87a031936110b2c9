/*
 * jinja_filters: the filters of the Jinja evaluator (jinja.c; see jinja.h for the language).
 * Filters that take any value (safe, tojson, default, join, int, float) are tried first, then
 * those of the value's kind, from a table by kind (list, string, number, dict, boolean), so a
 * filter is looked up by the one table its value's kind names. Semantics follow
 * @huggingface/jinja 0.5 as the evaluator's do; errors end the render through jx_fail.
 */
#include "recipe/jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

static jv jx_join(jx *x, jv v, const jstr *sep)
{
    jsb b = { 0 };
    if (v.kind == JV_STR) {
        size_t *o;
        size_t n = jstr_cps(x, v.s, &o);
        for (size_t i = 0; i < n; i++) {
            if (i && sep) jsb_str(x, &b, sep);
            jsb_sub(x, &b, v.s, o[i], o[i + 1] - o[i]);
        }
    } else {
        for (size_t i = 0; i < v.l->n; i++) {
            if (i && sep) jsb_str(x, &b, sep);
            jv_js(x, &b, v.l->v[i]);
        }
    }
    return jv_str(jsb_done(x, &b));
}

static jv jx_tojson(jx *x, jv v, const jargs *a)
{
    jjson_opt o = jjson_default;
    const jv *ind = jarg(a, SIZE_MAX, "indent"), *ea = jarg(a, SIZE_MAX, "ensure_ascii");
    const jv *sk = jarg(a, SIZE_MAX, "sort_keys"), *sep = jarg(a, SIZE_MAX, "separators");
    if (ind && ind->kind != JV_INT && ind->kind != JV_NONE) jx_fail(x, JINJA_ERR_RUNTIME, "if set, indent must be a number");
    if (ea && ea->kind != JV_BOOL) jx_fail(x, JINJA_ERR_RUNTIME, "if set, ensure_ascii must be a boolean");
    if (sk && sk->kind != JV_BOOL) jx_fail(x, JINJA_ERR_RUNTIME, "if set, sort_keys must be a boolean");
    if (ind && ind->kind == JV_INT) {
        if (ind->i < 0 || ind->i > 64) jx_fail(x, JINJA_ERR_RUNTIME, "tojson: indent out of range");
        o.indent = (int)ind->i;
        if (o.indent) o.item_sep = ",";
    }
    o.ensure_ascii = ea && ea->b;
    o.sort_keys = sk && sk->b;
    if (sep && sep->kind != JV_NONE) {
        if (sep->kind != JV_LIST || sep->l->n != 2 || sep->l->v[0].kind != JV_STR || sep->l->v[1].kind != JV_STR)
            jx_fail(x, JINJA_ERR_RUNTIME, "separators must be a tuple of two strings");
        o.item_sep = sep->l->v[0].s->p;
        o.key_sep = sep->l->v[1].s->p;
    }
    jsb b = { 0 };
    jjson(x, &b, v, &o, 0);
    return jv_str(jsb_done(x, &b));
}

static jv jx_indent(jx *x, const jstr *s, int64_t width, bool first, bool blank)
{
    if (width < 0 || width > 1024) jx_fail(x, JINJA_ERR_RUNTIME, "indent: width out of range");
    jsb b = { 0 };
    size_t i = 0, line = 0;
    for (;;) {
        size_t e = i;
        while (e < s->n && s->p[e] != '\n') e++;
        bool empty = e == i;
        if (!((!first && line == 0) || (!blank && empty)))
            for (int64_t k = 0; k < width; k++) jsb_lit(x, &b, " ");
        jsb_sub(x, &b, s, i, e - i);
        if (e >= s->n) break;
        jsb_sub(x, &b, s, e, 1);
        i = e + 1;
        line++;
    }
    return jv_str(jsb_done(x, &b));
}

/* parseInt / parseFloat on a string */
static bool js_parse_num(const jstr *s, bool is_int, double *out)
{
    size_t i = 0, k;
    while (i < s->n && (k = js_space_at(s->p + i, s->n - i)) > 0) i += k;
    char tmp[64];
    size_t n = TM_MIN(s->n - i, sizeof tmp - 1);
    memcpy(tmp, s->p + i, n);
    tmp[n] = 0;
    char *end;
    if (is_int) {
        long long v = strtoll(tmp, &end, 10);
        if (end == tmp) return false;
        *out = (double)v;
        return true;
    }
    double d = strtod(tmp, &end);
    if (end == tmp) return false;
    *out = d;
    return true;
}

/* selectattr / rejectattr: their arguments are string literals (the attribute, a test and its
 * argument), not values. */
static jv jx_filter_select(jx *x, jv v, const char *name, const jnode *f, int line)
{
    if (v.kind != JV_LIST) jx_fail(x, JINJA_ERR_RUNTIME, "cannot apply filter %s to a %s (line %d)", name, jv_type(v), line);
    for (size_t i = 0; i < f->n; i++)
        if (f->v[i]->kind != JN_STR) jx_fail(x, JINJA_ERR_RUNTIME, "arguments of %s must be strings (line %d)", name, line);
    for (size_t i = 0; i < v.l->n; i++)
        if (v.l->v[i].kind != JV_DICT && v.l->v[i].kind != JV_NS)
            jx_fail(x, JINJA_ERR_RUNTIME, "%s can only be applied to a list of objects (line %d)", name, line);
    if (f->n < 1) jx_fail(x, JINJA_ERR_RUNTIME, "%s needs an attribute (line %d)", name, line);
    jstr attr = { f->v[0]->sn, f->v[0]->s, NULL };
    const char *test = f->n > 1 ? f->v[1]->s : NULL;
    jv arg = f->n > 2 ? jv_str(jstr_lit(x, f->v[2]->s)) : JV_UNDEF_V;
    bool sel = name[0] == 's';
    jv out = jv_list(x, v.l->n);
    size_t k = 0;
    for (size_t i = 0; i < v.l->n; i++) {
        jx_step(x);
        jv *av = jdict_get(v.l->v[i].d, &attr);
        bool r = false;
        if (av) r = test ? jx_test(x, test, *av, f->n > 2 ? &arg : NULL, line) : jv_truthy(*av);
        if (r == sel) out.l->v[k++] = v.l->v[i];
    }
    out.l->n = k;
    return out;
}

/* A filter applied: its name, its evaluated arguments, whether it was called with
 * parentheses, and its line (for messages). */
typedef struct {
    const char *name;
    jargs args;
    bool call;
    int line;
} jfilter;

/* A family's filter stores its result and says the name was one of its own. */
static bool jx_filter_done(jv *out, jv r)
{
    *out = r;
    return true;
}

/* Filters of any value: safe, tojson, default, and join / int / float with arguments. */
static bool jx_filter_any(jx *x, jv v, jfilter *fc, jv *out)
{
    const char *name = fc->name;
    int line = fc->line;
    bool call = fc->call;
    jargs *a = &fc->args;
    if (!strcmp(name, "safe")) return jx_filter_done(out, v);
    if (!strcmp(name, "tojson")) return jx_filter_done(out, jx_tojson(x, v, a));
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        const jv *def = jarg(a, 0, "default_value");
        const jv *boolean = jarg(a, 1, "boolean");
        if (boolean && boolean->kind != JV_BOOL) jx_fail(x, JINJA_ERR_RUNTIME, "default filter flag must be a boolean");
        if (v.kind == JV_UNDEF || (boolean && boolean->b && !jv_truthy(v))) return jx_filter_done(out, def ? *def : jv_str(jstr_lit(x, "")));
        return jx_filter_done(out, v);
    }
    if (call && !strcmp(name, "join")) {
        if (v.kind != JV_STR && v.kind != JV_LIST) jx_fail(x, JINJA_ERR_RUNTIME, "cannot apply filter join to a %s (line %d)", jv_type(v), line);
        const jv *sep = jarg(a, 0, "separator");
        if (sep && sep->kind != JV_STR) jx_fail(x, JINJA_ERR_RUNTIME, "separator must be a string");
        return jx_filter_done(out, jx_join(x, v, sep ? sep->s : NULL));
    }
    if (call && (!strcmp(name, "int") || !strcmp(name, "float"))) {
        bool is_int = name[0] == 'i';
        const jv *def = jarg(a, 0, "default");
        if (v.kind == JV_STR) {
            double d;
            if (!js_parse_num(v.s, is_int, &d)) return jx_filter_done(out, def ? *def : is_int ? jv_int(0) : jv_float(0));
            return jx_filter_done(out, is_int ? jv_int((int64_t)d) : jv_float(d));
        }
        if (v.kind == JV_INT || v.kind == JV_FLOAT) return jx_filter_done(out, v);
        if (v.kind == JV_BOOL) return jx_filter_done(out, is_int ? jv_int(v.b) : jv_float(v.b));
        jx_fail(x, JINJA_ERR_RUNTIME, "cannot apply filter %s to a %s (line %d)", name, jv_type(v), line);
    }
    return false;
}

/* Filters of a list. */
static bool jx_filter_list(jx *x, jv v, jfilter *fc, jv *out)
{
    const char *name = fc->name;
    int line = fc->line;
    jargs *a = &fc->args;
    const jlist *l = v.l;
    if (!strcmp(name, "list")) return jx_filter_done(out, v);
    if (!strcmp(name, "first")) return jx_filter_done(out, l->n ? l->v[0] : JV_UNDEF_V);
    if (!strcmp(name, "last")) return jx_filter_done(out, l->n ? l->v[l->n - 1] : JV_UNDEF_V);
    if (!strcmp(name, "length") || !strcmp(name, "count")) return jx_filter_done(out, jv_int((int64_t)l->n));
    if (!strcmp(name, "reverse")) {
        jv r = jv_list(x, l->n);
        for (size_t i = 0; i < l->n; i++) r.l->v[i] = l->v[l->n - 1 - i];
        return jx_filter_done(out, r);
    }
    if (!strcmp(name, "join")) return jx_filter_done(out, jx_join(x, v, NULL));
    if (!strcmp(name, "string")) {
        jsb b = { 0 };
        jjson(x, &b, v, &jjson_print, 0);
        return jx_filter_done(out, jv_str(jsb_done(x, &b)));
    }
    if (!strcmp(name, "unique")) {
        jv r = jv_list(x, l->n);
        size_t k = 0;
        for (size_t i = 0; i < l->n; i++) {
            bool seen = false;
            for (size_t j = 0; j < k && !seen; j++) {
                jx_step(x);
                seen = jv_strict_eq(r.l->v[j], l->v[i]);
            }
            if (!seen) r.l->v[k++] = l->v[i];
        }
        r.l->n = k;
        return jx_filter_done(out, r);
    }
    if (!strcmp(name, "sort")) {
        const jv *rev = jarg(a, 0, "reverse"), *cs = jarg(a, 1, "case_sensitive"), *at = jarg(a, 2, "attribute");
        if (rev && rev->kind != JV_BOOL) jx_fail(x, JINJA_ERR_RUNTIME, "reverse must be a boolean");
        if (cs && cs->kind != JV_BOOL) jx_fail(x, JINJA_ERR_RUNTIME, "case_sensitive must be a boolean");
        jsort_key k = { .reverse = rev && rev->b, .case_sensitive = cs && cs->b, .pair_index = -1 };
        if (at && at->kind == JV_STR) k.attr = at->s;
        else if (at && at->kind == JV_INT) {
            char tmp[32];
            snprintf(tmp, sizeof tmp, "%lld", (long long)at->i);
            k.attr = jstr_new(x, tmp, strlen(tmp), false);
        }
        jv r = jv_list(x, l->n);
        if (l->n) memcpy(r.l->v, l->v, l->n * sizeof *l->v);
        jsort(x, r.l->v, r.l->n, &k);
        return jx_filter_done(out, r);
    }
    if (!strcmp(name, "map")) {
        const jv *at = jarg(a, SIZE_MAX, "attribute");
        if (!at) jx_fail(x, JINJA_ERR_RUNTIME, "map without attribute= is not supported (line %d)", line);
        if (at->kind != JV_STR) jx_fail(x, JINJA_ERR_RUNTIME, "attribute must be a string");
        const jv *def = jarg(a, SIZE_MAX, "default");
        jv r = jv_list(x, l->n);
        for (size_t i = 0; i < l->n; i++) {
            if (l->v[i].kind != JV_DICT && l->v[i].kind != JV_NS) jx_fail(x, JINJA_ERR_RUNTIME, "items in map must be objects");
            jv e = jv_attr_path(x, l->v[i], at->s);
            r.l->v[i] = e.kind == JV_UNDEF && def ? *def : e;
        }
        return jx_filter_done(out, r);
    }
    if (!strcmp(name, "min") || !strcmp(name, "max")) {
        if (!l->n) return jx_filter_done(out, JV_UNDEF_V);
        jv best = l->v[0];
        for (size_t i = 1; i < l->n; i++) {
            int c = jv_compare(x, l->v[i], best, false);
            if (name[1] == 'i' ? c < 0 : c > 0) best = l->v[i];
        }
        return jx_filter_done(out, best);
    }
    return false;
}

/* Filters of a string. */
static bool jx_filter_str(jx *x, jv v, jfilter *fc, jv *out)
{
    const char *name = fc->name;
    bool call = fc->call;
    jargs *a = &fc->args;
    const jstr *s = v.s;
    if (!strcmp(name, "length") || !strcmp(name, "count")) return jx_filter_done(out, jv_int(jstr_len16(s)));
    if (!strcmp(name, "upper")) return jx_filter_done(out, jv_str(jstr_case(x, s, 1)));
    if (!strcmp(name, "lower")) return jx_filter_done(out, jv_str(jstr_case(x, s, 0)));
    if (!strcmp(name, "title")) return jx_filter_done(out, jv_str(jstr_case(x, s, 2)));
    if (!strcmp(name, "capitalize")) return jx_filter_done(out, jv_str(jstr_case(x, s, 3)));
    if (!strcmp(name, "trim")) return jx_filter_done(out, jv_str(jstr_trim(x, s, true, true)));
    if (!strcmp(name, "join") || !strcmp(name, "string")) return jx_filter_done(out, v);
    if (!strcmp(name, "int") || !strcmp(name, "float")) {
        double d;
        bool ok = js_parse_num(s, name[0] == 'i', &d);
        return jx_filter_done(out, name[0] == 'i' ? jv_int(ok ? (int64_t)d : 0) : jv_float(ok ? d : 0));
    }
    if (!strcmp(name, "indent")) {
        const jv *w = jarg(a, 0, "width"), *fi = jarg(a, 1, "first"), *bl = jarg(a, 2, "blank");
        if (w && w->kind != JV_INT) jx_fail(x, JINJA_ERR_RUNTIME, "width must be a number");
        return jx_filter_done(out, jx_indent(x, s, w ? w->i : 4, fi && jv_truthy(*fi), bl && jv_truthy(*bl)));
    }
    if (!strcmp(name, "replace") && call) return jx_filter_done(out, jx_method(x, v, "replace", a));
    if (!strcmp(name, "list")) {
        size_t *o;
        size_t n = jstr_cps(x, s, &o);
        jv r = jv_list(x, n);
        for (size_t i = 0; i < n; i++) {
            jsb b = { 0 };
            jsb_sub(x, &b, s, o[i], o[i + 1] - o[i]);
            r.l->v[i] = jv_str(jsb_done(x, &b));
        }
        return jx_filter_done(out, r);
    }
    return false;
}

/* Filters of a number. */
static bool jx_filter_num(jx *x, jv v, jfilter *fc, jv *out)
{
    const char *name = fc->name;
    jargs *a = &fc->args;
    if (!strcmp(name, "abs")) return jx_filter_done(out, v.kind == JV_INT ? jv_int(v.i < 0 ? -v.i : v.i) : jv_float(fabs(v.f)));
    if (!strcmp(name, "int")) return jx_filter_done(out, v.kind == JV_INT ? v : jv_int((int64_t)floor(v.f)));
    if (!strcmp(name, "float")) return jx_filter_done(out, jv_float(jv_num(v)));
    if (!strcmp(name, "string")) {
        jsb b = { 0 };
        jv_print(x, &b, v);
        return jx_filter_done(out, jv_str(jsb_done(x, &b)));
    }
    if (!strcmp(name, "round")) {
        const jv *p = jarg(a, 0, "precision");
        double m = p && p->kind == JV_INT ? pow(10, (double)p->i) : 1;
        return jx_filter_done(out, jv_float(round(jv_num(v) * m) / m));
    }
    return false;
}

/* Filters of a dict. */
static bool jx_filter_dict(jx *x, jv v, jfilter *fc, jv *out)
{
    const char *name = fc->name;
    jargs *a = &fc->args;
    if (!strcmp(name, "items")) return jx_filter_done(out, jdict_view(x, v.d, 2));
    if (!strcmp(name, "length") || !strcmp(name, "count")) return jx_filter_done(out, jv_int((int64_t)v.d->n));
    if (jx_is_dict_method(name)) return jx_filter_done(out, jx_method(x, v, name, a));
    return false;
}

/* Filters of a boolean. */
static bool jx_filter_bool(jx *x, jv v, jfilter *fc, jv *out)
{
    const char *name = fc->name;
    if (!strcmp(name, "bool")) return jx_filter_done(out, v);
    if (!strcmp(name, "int")) return jx_filter_done(out, jv_int(v.b));
    if (!strcmp(name, "float")) return jx_filter_done(out, jv_float(v.b));
    if (!strcmp(name, "string")) return jx_filter_done(out, jv_str(jstr_lit(x, v.b ? "true" : "false")));
    return false;
}

typedef bool (*jx_filter_fn)(jx *x, jv v, jfilter *fc, jv *out);

/* The filters of each kind of value (the type-independent ones are tried first). */
static const jx_filter_fn jx_filter_by_kind[JV_LOOP + 1] = {
    [JV_LIST] = jx_filter_list, [JV_STR] = jx_filter_str, [JV_INT] = jx_filter_num,
    [JV_FLOAT] = jx_filter_num, [JV_DICT] = jx_filter_dict, [JV_BOOL] = jx_filter_bool,
};

jv jx_filter(jx *x, jenv *env, jv v, const jnode *f)
{
    jfilter fc = { .name = f->kind == JN_IDENT ? f->s : f->a->s, .call = f->kind == JN_CALL, .line = f->line };
    if (fc.call && f->a->kind != JN_IDENT) jx_fail(x, JINJA_ERR_RUNTIME, "unknown filter (line %d)", fc.line);
    if (fc.call && (!strcmp(fc.name, "selectattr") || !strcmp(fc.name, "rejectattr")))
        return jx_filter_select(x, v, fc.name, f, fc.line);
    if (fc.call) jx_eval_args(x, env, f->v, f->n, &fc.args);
    jv out;
    if (jx_filter_any(x, v, &fc, &out)) return out;
    jx_filter_fn fn = (unsigned)v.kind <= JV_LOOP ? jx_filter_by_kind[v.kind] : NULL;
    if (fn && fn(x, v, &fc, &out)) return out;
    jx_fail(x, JINJA_ERR_RUNTIME, "cannot apply filter %s to a %s (line %d)", fc.name, jv_type(v), fc.line);
}
