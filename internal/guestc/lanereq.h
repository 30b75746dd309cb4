// A request of an exec lane, as the fast guest serves it (guest.c: exec
// lanes bound to the sandbox). Its bytes come from the API's caller.
#pragma once
#include <stddef.h>

#include "json.h"

struct lane_req {
	struct jnode *root;
	char **argv; // argc strings and a NULL, the request's
	int argc;
	char **env; // nenv KEY=VALUE strings, sorted as guestapi.EnvList sorts
	int nenv;
	const char *cwd; // "" for the workdir
};

// lane_req_parse reads payload, a lane request frame's, into r when the
// fast guest serves it: a plain command (no terminal, stdin, user or
// timeout) for sandbox, which reqcheck.LaneRequest passes and Go's
// decoder reads as json.c does (no unknown or repeated key, no escape it
// might read otherwise, UTF-8 throughout). It returns 0 otherwise (the
// Go guest then serves it, or says what is wrong with it), 1 with r to
// be freed with lane_req_free.
int lane_req_parse(const char *payload, size_t n, const char *sandbox, struct lane_req *r);
void lane_req_free(struct lane_req *r);
