// See json.h.
#include "json.h"
#include <stdlib.h>
#include <string.h>

struct p {
	const char *s;
	size_t n, i;
	int depth;
};

static void ws(struct p *p) {
	while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\n' || p->s[p->i] == '\t' || p->s[p->i] == '\r'))
		p->i++;
}

static struct jnode *node(enum jtype t) {
	struct jnode *n = calloc(1, sizeof *n);
	if (n)
		n->t = t;
	return n;
}

static int hex(char c) {
	if (c >= '0' && c <= '9') return c - '0';
	if (c >= 'a' && c <= 'f') return c - 'a' + 10;
	if (c >= 'A' && c <= 'F') return c - 'A' + 10;
	return -1;
}

static char *str(struct p *p, size_t *len) {
	if (p->i >= p->n || p->s[p->i] != '"')
		return NULL;
	p->i++;
	char *out = malloc(p->n - p->i + 1);
	size_t o = 0;
	if (!out)
		return NULL;
	while (p->i < p->n) {
		char c = p->s[p->i++];
		if (c == '"') {
			out[o] = 0;
			if (len)
				*len = o;
			return out;
		}
		if (c != '\\') {
			out[o++] = c;
			continue;
		}
		if (p->i >= p->n)
			break;
		c = p->s[p->i++];
		switch (c) {
		case 'n': out[o++] = '\n'; break;
		case 't': out[o++] = '\t'; break;
		case 'r': out[o++] = '\r'; break;
		case 'b': out[o++] = '\b'; break;
		case 'f': out[o++] = '\f'; break;
		case 'u': {
			if (p->i + 4 > p->n)
				goto bad;
			unsigned cp = 0;
			for (int k = 0; k < 4; k++) {
				int h = hex(p->s[p->i + k]);
				if (h < 0)
					goto bad;
				cp = cp << 4 | (unsigned)h;
			}
			p->i += 4;
			if (cp >= 0xd800 && cp < 0xdc00 && p->i + 6 <= p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
				unsigned lo = 0;
				for (int k = 0; k < 4; k++) {
					int h = hex(p->s[p->i + 2 + k]);
					if (h < 0)
						goto bad;
					lo = lo << 4 | (unsigned)h;
				}
				if (lo >= 0xdc00 && lo < 0xe000) {
					cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
					p->i += 6;
				}
			}
			if (cp < 0x80) out[o++] = (char)cp;
			else if (cp < 0x800) { out[o++] = (char)(0xc0 | cp >> 6); out[o++] = (char)(0x80 | (cp & 0x3f)); }
			else if (cp < 0x10000) { out[o++] = (char)(0xe0 | cp >> 12); out[o++] = (char)(0x80 | (cp >> 6 & 0x3f)); out[o++] = (char)(0x80 | (cp & 0x3f)); }
			else { out[o++] = (char)(0xf0 | cp >> 18); out[o++] = (char)(0x80 | (cp >> 12 & 0x3f)); out[o++] = (char)(0x80 | (cp >> 6 & 0x3f)); out[o++] = (char)(0x80 | (cp & 0x3f)); }
			break;
		}
		default: out[o++] = c;
		}
	}
bad:
	free(out);
	return NULL;
}

static struct jnode *value(struct p *p);

static struct jnode *value(struct p *p) {
	ws(p);
	if (p->i >= p->n || ++p->depth > 64)
		return NULL;
	struct jnode *n = NULL;
	char c = p->s[p->i];
	if (c == '{' || c == '[') {
		n = node(c == '{' ? J_OBJ : J_ARR);
		if (!n)
			return NULL;
		p->i++;
		struct jnode **tail = &n->kids;
		ws(p);
		if (p->i < p->n && p->s[p->i] == (c == '{' ? '}' : ']')) {
			p->i++;
			goto done;
		}
		for (;;) {
			char *key = NULL;
			if (c == '{') {
				ws(p);
				if (!(key = str(p, NULL)))
					goto fail;
				ws(p);
				if (p->i >= p->n || p->s[p->i] != ':') {
					free(key);
					goto fail;
				}
				p->i++;
			}
			struct jnode *k = value(p);
			if (!k) {
				free(key);
				goto fail;
			}
			k->key = key;
			*tail = k;
			tail = &k->next;
			ws(p);
			if (p->i < p->n && p->s[p->i] == ',') {
				p->i++;
				continue;
			}
			if (p->i < p->n && p->s[p->i] == (c == '{' ? '}' : ']')) {
				p->i++;
				goto done;
			}
			goto fail;
		}
	}
	if (c == '"') {
		n = node(J_STR);
		if (!n || !(n->str = str(p, &n->slen)))
			goto fail;
		goto done;
	}
	static const struct { const char *word; enum jtype t; bool b; } words[] = {
		{"true", J_BOOL, true}, {"false", J_BOOL, false}, {"null", J_NULL, false}};
	for (size_t w = 0; w < sizeof words / sizeof *words; w++) {
		size_t l = strlen(words[w].word);
		if (p->n - p->i >= l && !strncmp(p->s + p->i, words[w].word, l)) {
			if (!(n = node(words[w].t)))
				return NULL;
			n->b = words[w].b;
			p->i += l;
			goto done;
		}
	}
	if (c == '-' || (c >= '0' && c <= '9')) {
		char buf[64];
		size_t k = 0;
		while (p->i < p->n && k < sizeof buf - 1 && p->s[p->i] && strchr("+-0123456789.eE", p->s[p->i]))
			buf[k++] = p->s[p->i++];
		buf[k] = 0;
		char *end;
		if (!(n = node(J_NUM)))
			return NULL;
		n->num = strtod(buf, &end);
		if (end == buf || *end)
			goto fail;
		goto done;
	}
	return NULL;
fail:
	jfree(n);
	return NULL;
done:
	p->depth--;
	return n;
}

struct jnode *jparse(const char *s, size_t n) {
	struct p p = {s, n, 0, 0};
	struct jnode *v = value(&p);
	ws(&p);
	if (v && p.i != n) {
		jfree(v);
		return NULL;
	}
	return v;
}

void jfree(struct jnode *n) {
	while (n) {
		struct jnode *next = n->next;
		jfree(n->kids);
		free(n->str);
		free(n->key);
		free(n);
		n = next;
	}
}

struct jnode *jget(struct jnode *o, const char *key) {
	if (!o || o->t != J_OBJ)
		return NULL;
	for (struct jnode *k = o->kids; k; k = k->next)
		if (!strcmp(k->key, key))
			return k;
	return NULL;
}

long long jint(struct jnode *n, long long def) { return n && n->t == J_NUM ? (long long)n->num : def; }
bool jbool(struct jnode *n) { return n && n->t == J_BOOL && n->b; }
const char *jstr(struct jnode *n) { return n && n->t == J_STR ? n->str : NULL; }
int jlen(struct jnode *a) {
	int c = 0;
	if (a && (a->t == J_ARR || a->t == J_OBJ))
		for (struct jnode *k = a->kids; k; k = k->next)
			c++;
	return c;
}
