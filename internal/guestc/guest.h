// The fast guest's parts (guest.c says what it is).
#pragma once

#include <stddef.h>

#include "json.h"

// errmsg says why the last step failed, errcode its category
// (errdefs.Code) when it is the caller's fault ("invalid_argument"), else "".
extern char errmsg[512];
extern const char *errcode;

// fail_with sets errmsg (and errcode) and returns -1.
int fail_with(const char *code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define FAIL(...) return fail_with("", __VA_ARGS__)
#define FAILE(what) return fail_with("", "%s: %s", what, errtext(errno))

// errtext is errno e's text as Go's syscall package words it (the C
// library's, lower-cased at the start), so that the fast guest's errors
// read as the Go guest's.
const char *errtext(int e);

// build_root assembles the root filesystem from Prepare p and the
// descriptors it indexes, and enters it.
int build_root(struct jnode *p, int *fds, int nfds);
// identify gives the guest its cgroup namespace (and, on v2, the
// sandbox's cgroup2 tree at /sys/fs/cgroup) and the sandbox's hostname.
int identify(const char *hostname, int cgroup_v2);
