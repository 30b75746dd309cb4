// A harness for FuzzFastGuestLaneRequest: reads records from stdin (a
// big-endian u32 length and the bound sandbox, the same and a lane
// request's payload) and writes for each what lane_req_parse made of it:
// a byte 0 (not served), or 1 and the argv, the environment (each a u32
// count, then each string as a u32 length and its bytes) and the cwd.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lanereq.h"

static int get(void *b, size_t n) { return fread(b, 1, n, stdin) == n; }

static char *get_str(uint32_t *n) {
	unsigned char h[4];
	if (!get(h, 4))
		return NULL;
	*n = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
	char *s = malloc(*n + 1);
	if (!s || !get(s, *n))
		exit(1);
	s[*n] = 0;
	return s;
}

static void put_u32(uint32_t v) {
	unsigned char h[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8), (unsigned char)v};
	fwrite(h, 1, 4, stdout);
}

static void put_str(const char *s) {
	put_u32((uint32_t)strlen(s));
	fputs(s, stdout);
}

int main(void) {
	for (;;) {
		uint32_t nid, n;
		char *id = get_str(&nid);
		if (!id)
			return 0;
		char *payload = get_str(&n);
		struct lane_req r;
		if (!lane_req_parse(payload, n, id, &r)) {
			fputc(0, stdout);
		} else {
			fputc(1, stdout);
			put_u32((uint32_t)r.argc);
			for (int i = 0; i < r.argc; i++)
				put_str(r.argv[i]);
			put_u32((uint32_t)r.nenv);
			for (int i = 0; i < r.nenv; i++)
				put_str(r.env[i]);
			put_str(r.cwd);
			lane_req_free(&r);
		}
		fflush(stdout);
		free(id);
		free(payload);
	}
}
