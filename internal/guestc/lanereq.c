// See lanereq.h.
#define _GNU_SOURCE
#include "lanereq.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BODY (1 << 20) // reqcheck.MaxBody
#define MAX_ENV 1024       // reqcheck's bounds on an environment
#define MAX_ENV_BYTES (128 << 10)

// utf8_ok reports whether s holds UTF-8 that Go's decoder takes as it is
// (no surrogate, no overlong form, nothing past U+10FFFF).
static int utf8_ok(const unsigned char *s, size_t n) {
	for (size_t i = 0; i < n;) {
		unsigned c = s[i];
		size_t k = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
		if (!k || i + k > n)
			return 0;
		unsigned cp = k == 1 ? c : c & (0x7f >> k);
		for (size_t j = 1; j < k; j++) {
			if ((s[i + j] & 0xc0) != 0x80)
				return 0;
			cp = cp << 6 | (s[i + j] & 0x3f);
		}
		static const unsigned least[] = {0, 0, 0x80, 0x800, 0x10000};
		if (cp < least[k] || cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000))
			return 0;
		i += k;
	}
	return 1;
}

// keys_ok reports whether object o's keys are each there once and, with
// allowed (NULL ends it), among those.
static int keys_ok(struct jnode *o, const char *const *allowed) {
	if (!o || o->t != J_OBJ)
		return 0;
	for (struct jnode *k = o->kids; k; k = k->next) {
		int known = !allowed;
		for (const char *const *a = allowed; a && *a; a++)
			known |= !strcmp(k->key, *a);
		for (struct jnode *e = o->kids; known && e != k; e = e->next)
			known = strcmp(e->key, k->key) != 0;
		if (!known)
			return 0;
	}
	return 1;
}

static int absent(struct jnode *n) { return !n || n->t == J_NULL; }

static int env_key_ok(const char *k) {
	if (!*k || isdigit((unsigned char)*k))
		return 0;
	for (; *k; k++)
		if (!isalnum((unsigned char)*k) && *k != '_')
			return 0;
	return 1;
}

// clean_path reports whether p is absolute and clean as reqcheck.Path
// takes it (one trailing slash allowed).
static int clean_path(const char *p) {
	size_t n = strlen(p);
	if (!n || p[0] != '/' || n > 4096)
		return 0;
	if (n == 1)
		return 1;
	if (p[n - 1] == '/')
		n--;
	for (size_t i = 1; i <= n;) {
		size_t j = i;
		while (j < n && p[j] != '/')
			j++;
		size_t l = j - i;
		if (!l || (l == 1 && p[i] == '.') || (l == 2 && p[i] == '.' && p[i + 1] == '.'))
			return 0;
		i = j + 1;
	}
	return 1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int lane_req_parse(const char *payload, size_t n, const char *sandbox, struct lane_req *r) {
	memset(r, 0, sizeof *r);
	if (n > MAX_BODY || !utf8_ok((const unsigned char *)payload, n))
		return 0;
	for (size_t i = 0; i < n; i++) {
		if ((unsigned char)payload[i] < 0x20)
			return 0;
		if (payload[i] != '\\')
			continue;
		if (++i >= n)
			return 0;
		if (payload[i] == 'u') {
			// Go's encoder writes <, > and & so: \u003c. A NUL or a
			// surrogate (which Go may read as U+FFFD) is the Go guest's.
			unsigned cp = 0;
			for (int k = 1; k <= 4; k++) {
				if (i + (size_t)k >= n || !isxdigit((unsigned char)payload[i + (size_t)k]))
					return 0;
				char d = (char)tolower((unsigned char)payload[i + (size_t)k]);
				cp = cp << 4 | (unsigned)(d <= '9' ? d - '0' : d - 'a' + 10);
			}
			if (cp == 0 || (cp >= 0xd800 && cp < 0xe000))
				return 0;
			i += 4;
		} else if (!memchr("\"\\/bfnrt", payload[i], 8)) { // (strchr finds a NUL)
			return 0;
		}
	}
	static const char *const top_keys[] = {"sandbox", "exec", NULL};
	static const char *const exec_keys[] = {"cmd", "env", "cwd", "user", "tty", "timeout_seconds", "stdin", NULL};
	struct jnode *req = jparse(payload, n), *ex = jget(req, "exec");
	struct jnode *cmd = jget(ex, "cmd"), *envn = jget(ex, "env"), *cwdn = jget(ex, "cwd"), *usern = jget(ex, "user");
	const char *sb = jstr(jget(req, "sandbox")), *user = jstr(usern), *cwd = jstr(cwdn);
	int argc = jlen(cmd);
	int ok = keys_ok(req, top_keys) && keys_ok(ex, exec_keys) && sb && !strcmp(sb, sandbox) &&
	         absent(jget(ex, "tty")) && absent(jget(ex, "timeout_seconds")) && absent(jget(ex, "stdin")) &&
	         (absent(usern) || (user && (!*user || !strcmp(user, "root") || !strcmp(user, "0")))) &&
	         cmd && cmd->t == J_ARR && argc > 0 && jstr(cmd->kids) && *jstr(cmd->kids) &&
	         (absent(cwdn) || (cwd && (!*cwd || clean_path(cwd)))) &&
	         (absent(envn) || (keys_ok(envn, NULL) && jlen(envn) <= MAX_ENV));
	for (struct jnode *a = ok ? cmd->kids : NULL; a; a = a->next)
		ok = ok && jstr(a);
	size_t envsize = 0;
	for (struct jnode *e = ok && !absent(envn) ? envn->kids : NULL; e; e = e->next) {
		ok = ok && jstr(e) && env_key_ok(e->key);
		envsize += strlen(e->key) + (jstr(e) ? e->slen : 0) + 2;
	}
	r->root = req;
	r->argv = ok && envsize <= MAX_ENV_BYTES ? calloc((size_t)argc + 1, sizeof *r->argv) : NULL;
	r->env = r->argv ? calloc((size_t)jlen(envn) + 1, sizeof *r->env) : NULL;
	if (!r->env) {
		lane_req_free(r);
		return 0;
	}
	for (struct jnode *a = cmd->kids; a; a = a->next)
		r->argv[r->argc++] = a->str;
	// The environment as guestapi.EnvList orders it: KEY=VALUE, sorted.
	for (struct jnode *e = absent(envn) ? NULL : envn->kids; e; e = e->next) {
		size_t kl = strlen(e->key);
		char *kv = malloc(kl + e->slen + 2);
		if (!kv) {
			lane_req_free(r);
			return 0;
		}
		memcpy(kv, e->key, kl);
		kv[kl] = '=';
		memcpy(kv + kl + 1, e->str, e->slen + 1);
		r->env[r->nenv++] = kv;
	}
	qsort(r->env, (size_t)r->nenv, sizeof *r->env, cmp_str);
	r->cwd = cwd ? cwd : "";
	return 1;
}

void lane_req_free(struct lane_req *r) {
	for (int i = 0; i < r->nenv; i++)
		free(r->env[i]);
	free(r->env);
	free(r->argv);
	jfree(r->root);
	memset(r, 0, sizeof *r);
}
