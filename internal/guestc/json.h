// A small JSON reader for the fast guest: the daemon's boot messages and
// requests parsed into a tree. Its input comes from the daemon only (the
// sync socket and the control socket, neither reachable from the
// sandbox), yet it is bounded all the same: depth 64, the packet's size.
#pragma once
#include <stddef.h>
#include <stdbool.h>

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct jnode {
	enum jtype t;
	double num;
	bool b;
	char *str;           // J_STR: unescaped, NUL-terminated
	size_t slen;
	struct jnode *kids;  // J_ARR/J_OBJ: first child
	struct jnode *next;  // sibling
	char *key;           // member key when inside an object
};

struct jnode *jparse(const char *s, size_t n);
void jfree(struct jnode *n);
struct jnode *jget(struct jnode *o, const char *key);
long long jint(struct jnode *n, long long def);
bool jbool(struct jnode *n);
const char *jstr(struct jnode *n);
int jlen(struct jnode *a);
