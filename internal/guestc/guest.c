// The fast guest: PID 1 of a native sandbox, in C, for the path most
// sandboxes take (issue 21's churn: create, one command, delete). It is
// one thread and a few hundred kilobytes, where the Go guest
// (internal/guest) is a Go runtime with eight threads or more: under
// churn a fresh Go process per sandbox was half of a cycle's CPU.
//
// It speaks the Go guest's protocol (internal/guestapi) and does what the
// Go guest does for the part it serves:
//
//   - boot: the Config messages on the sync socket (fd 3): Prepare builds
//     the sandbox (root.c) and bounds the guest (its pids group and
//     cgroup namespace, no_new_privs, the seccomp filter); Activate hands
//     it the environment and it serves on the control socket (fd 4);
//   - ping, and start with attach of a plain command (no terminal, no
//     stdin, as root, no timeout) whose program and working directory
//     are there: forked with the sandbox's capabilities, its output
//     retained as the Go guest's ring retains it and streamed to the
//     connection, the answer held up to 5 ms to go with the first output
//     or the exit; the client's signal frames; release and reuse of the
//     connection; exit statuses with OOM kills; signals PID 1 receives
//     passed on to every running process;
//   - attaches to a process no connection streams, from an offset (the
//     daemon's exec log following a command whose client left);
//   - exec lanes bound to the sandbox (the SDK's, from a sandbox's second
//     exec on): the plain execs of their requests, reported to the daemon
//     as the Go guest reports them;
//   - file ops and port connections, passed on whole (the connection and
//     its request) to a helper: the Go guest's binary in its helper verb,
//     a child with PID 1's credentials that the first such op starts and
//     that leaves when it has had none for a while (guest.Helper).
//
// Any other request, or a start it does not serve, makes it hand over:
// it writes its state (guestapi.Handover: the processes with their pipes
// and output, the connections and lanes and where each stands) into a memfd and
// execs the Go guest from the sealed binary the forker left at fd 5
// (guestapi.HandoverExeFD). PID 1 stays PID 1, with its children,
// descriptors, namespaces and filter; the Go guest (guest.Adopt) serves
// the request that caused it and everything after.
#define _GNU_SOURCE
#include "guest.h"
#include "lanereq.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mman.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <linux/sockios.h>

// Descriptors the forker gives a guest, and the handover's.
#define FD_SYNC 3
#define FD_LISTEN 4
#define FD_GO 5 // guestapi.HandoverExeFD
#define ADOPT_VERB "guest-adopt" // guestfork.AdoptVerb
#define HELPER_VERB "guest-helper" // guestfork.HelperVerb

// The Go guest's timer slack at its exec (the forker's GUEST_SLACK_NS,
// internal/sysmon says why) and the kernel's default, which the sandbox's
// processes get.
#define GO_SLACK_NS 2000000
#define SANDBOX_SLACK_NS 50000

#define START_HOLD_MS 5 // the Go guest's startHold
#define MAX_PAYLOAD (4 << 20) // wire.MaxPayload
// What a finished process can have left in a pipe: its buffer grows to
// pipe-max-size (1 MiB by default) at the most without privileges on the
// host.
#define PIPE_MAX (1 << 20)
#define FINISHED_OUTPUT_FACTOR 4 // guest.FinishedOutputFactor

// Frame types (wire).
enum {
	F_STDOUT = 1,
	F_STDERR = 2,
	F_EXIT = 3,
	F_ERROR = 4,
	F_STARTED = 5,
	F_DROPPED = 6,
	F_STDIN = 16,
	F_CLOSE_STDIN = 17,
	F_SIGNAL = 18,
	F_RESIZE = 19,
	F_RELEASE = 20,
	F_REQUEST = 32,
	F_RESPONSE = 33,
};

char errmsg[512];
const char *errcode = "";

int fail_with(const char *code, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(errmsg, sizeof errmsg, fmt, ap);
	va_end(ap);
	errcode = code;
	return -1;
}

const char *errtext(int e) {
	static char bufs[4][128];
	static int next;
	char *b = bufs[next++ % 4];
	snprintf(b, sizeof bufs[0], "%s", strerror(e));
	b[0] = (char)tolower((unsigned char)b[0]);
	return b;
}

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "paddock fast guest: ");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static void *xalloc(size_t n) {
	void *p = calloc(1, n ? n : 1);
	if (!p) {
		logf_("out of memory");
		_exit(1);
	}
	return p;
}

static char *xstrdup(const char *s) {
	char *d = strdup(s ? s : "");
	if (!d) {
		logf_("out of memory");
		_exit(1);
	}
	return d;
}

// ---- a growable buffer, and JSON written into it

struct buf {
	char *b;
	size_t n, cap;
};

// buf_reserve makes room for n more bytes (and a NUL after them).
static void buf_reserve(struct buf *b, size_t n) {
	if (b->n + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		while (cap < b->n + n + 1)
			cap *= 2;
		char *nb = realloc(b->b, cap);
		if (!nb) {
			logf_("out of memory");
			_exit(1);
		}
		b->b = nb;
		b->cap = cap;
	}
}

static void buf_add(struct buf *b, const void *p, size_t n) {
	buf_reserve(b, n);
	if (n)
		memcpy(b->b + b->n, p, n);
	b->n += n;
	b->b[b->n] = 0;
}

static void buf_puts(struct buf *b, const char *s) { buf_add(b, s, strlen(s)); }

static void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(struct buf *b, const char *fmt, ...) {
	char tmp[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	buf_add(b, tmp, n < (int)sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

// buf_str writes s as a JSON string (bytes past ASCII as they are: Go's
// decoder takes UTF-8 and replaces what is not).
static void buf_str(struct buf *b, const char *s) {
	buf_puts(b, "\"");
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\') {
			char e[2] = {'\\', (char)*p};
			buf_add(b, e, 2);
		} else if (*p < 0x20) {
			buf_printf(b, "\\u%04x", *p);
		} else {
			buf_add(b, p, 1);
		}
	}
	buf_puts(b, "\"");
}

static void buf_b64(struct buf *b, const unsigned char *p, size_t n) {
	static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	buf_puts(b, "\"");
	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
		char o[4] = {tab[v >> 18 & 63], tab[v >> 12 & 63], i + 1 < n ? tab[v >> 6 & 63] : '=', i + 2 < n ? tab[v & 63] : '='};
		buf_add(b, o, 4);
	}
	buf_puts(b, "\"");
}

// ---- what the daemon gave: the sandbox's bounds and environment

static char **caps;       // Prepare.Caps, for the handover
static int ncaps;
static uint32_t capmask[2];
static int lastcap = 40;
static int oom_fd = -1;
static unsigned long long oom_seen;
static char **serve_env;  // Activate's environment, HOSTNAME added
static int nserve_env;
static char *workdir;
static long long output_limit = 16 << 20; // the Go guest's defaults
static long long retain = 256;

static const char *capnames[] = {"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE"};
#define NCAPNAMES ((int)(sizeof capnames / sizeof *capnames))

static int parse_caps(struct jnode *list) {
	ncaps = jlen(list);
	caps = xalloc(((size_t)ncaps + 1) * sizeof *caps);
	int i = 0;
	for (struct jnode *c = list ? list->kids : NULL; c; c = c->next, i++) {
		const char *s = jstr(c);
		int k;
		for (k = 0; s && k < NCAPNAMES; k++)
			if (!strcasecmp(s, capnames[k]))
				break;
		if (!s || k == NCAPNAMES)
			FAIL("unknown capability \"%s\"", s ? s : "");
		capmask[k / 32] |= 1u << (k % 32);
		caps[i] = xstrdup(s);
	}
	char b[16] = {0};
	int fd = open("/proc/sys/kernel/cap_last_cap", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		if (read(fd, b, sizeof b - 1) > 0)
			lastcap = atoi(b);
		close(fd);
	}
	if (lastcap < 0 || lastcap > 63)
		lastcap = 40;
	return 0;
}

// limit_caps gives the calling thread the sandbox's capabilities (the
// Go guest's limitCaps).
static int limit_caps(void) {
	for (int c = 0; c <= lastcap; c++)
		if (!(capmask[c / 32] & (1u << (c % 32))) && prctl(PR_CAPBSET_DROP, c, 0, 0, 0) && errno != EINVAL)
			return -1;
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0))
		return -1;
	struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct d[2] = {{capmask[0], capmask[0], capmask[0]}, {capmask[1], capmask[1], capmask[1]}};
	return (int)syscall(SYS_capset, &h, d);
}


// ---- the spawner thread
//
// Every process of the sandbox is forked from one thread whose
// credentials are the sandbox's, as the Go guest's spawner thread does:
// a child inherits the forking thread's capabilities, cgroups and cgroup
// namespace, not the process's. On cgroup v1 that thread alone joins
// the sandbox's pids group (the guest's process stays outside it, in the
// parent group the forker starts guests in), so the guest counts
// against no sandbox's pids limit, and neither does the Go guest it may
// hand over to. It makes its own cgroup namespace there, so that the
// sandbox sees its groups at the root.

static int pids_tasks = -1; // the sandbox's v1 pids tasks file, or -1
static int no_new_privs;     // no setuid programs: every thread has no_new_privs

struct spawn {
	const char *argv0;
	char **argv, **env;
	const char *cwd;
	int out, err; // the child's stdout and stderr
	pid_t pid;     // the result: the pid, or -1 and errno
	int errno_;
};

static int spawn_req[2] = {-1, -1}, spawn_res[2] = {-1, -1};

// do_spawn starts sp with posix_spawn, which the C library does with
// CLONE_VM and CLONE_VFORK: no copy of the guest's page tables, no
// copy-on-write fault after it (on a VM each of those also flushed the
// other vCPU's TLB, docs/exec.md). The child gets its own session,
// stdin from /dev/null, no signal blocked or ignored, and this thread's timer
// slack, capabilities and cgroups; a failure of its exec is the call's.
static void do_spawn(struct spawn *sp) {
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	sigset_t none, reserved;
	sigemptyset(&none);
	// The C library handles the signals it reserves (32 and 33 in glibc,
	// 32 to 34 in musl) and its posix_spawn ignores them in the child for
	// its time before the exec, which leaves them ignored after it, in
	// every process of the sandbox: they are set to default instead.
	// sigaddset refuses them, so their bits are set as the set's layout
	// has them.
	sigemptyset(&reserved);
	unsigned long *words = (unsigned long *)(void *)&reserved;
	for (int sig = 32; sig <= 34; sig++)
		words[(sig - 1) / (8 * sizeof *words)] |= 1UL << ((sig - 1) % (8 * sizeof *words));
	int e = posix_spawn_file_actions_init(&fa);
	if (e)
		goto out;
	e = posix_spawnattr_init(&at);
	if (e) {
		posix_spawn_file_actions_destroy(&fa);
		goto out;
	}
	e = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	if (!e)
		e = posix_spawn_file_actions_adddup2(&fa, sp->out, 1);
	if (!e)
		e = posix_spawn_file_actions_adddup2(&fa, sp->err, 2);
	if (!e)
		e = posix_spawn_file_actions_addchdir_np(&fa, sp->cwd);
	if (!e)
		e = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
	if (!e)
		e = posix_spawnattr_setsigmask(&at, &none);
	if (!e)
		e = posix_spawnattr_setsigdefault(&at, &reserved);
	pid_t pid = -1;
	if (!e)
		e = posix_spawn(&pid, sp->argv0, &fa, &at, sp->argv, sp->env);
	posix_spawnattr_destroy(&at);
	posix_spawn_file_actions_destroy(&fa);
	if (!e) {
		sp->pid = pid;
		sp->errno_ = 0;
		return;
	}
out:
	sp->pid = -1;
	sp->errno_ = e;
}

static void *spawner(void *arg) {
	(void)arg;
	// The sandbox's processes get the kernel's timer slack.
	int r = prctl(PR_SET_TIMERSLACK, SANDBOX_SLACK_NS, 0, 0, 0);
	if (!r && pids_tasks >= 0)
		r = write(pids_tasks, "0", 1) != 1; // "0": this thread
	if (!r)
		r = unshare(CLONE_NEWCGROUP);
	// The namespace goes to the main thread too (start_spawner), before
	// the capabilities go.
	int ns = -1;
	if (!r)
		r = (ns = open("/proc/thread-self/ns/cgroup", O_RDONLY | O_CLOEXEC)) < 0;
	if (!r && no_new_privs)
		r = prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
	if (!r)
		r = limit_caps();
	int res[2] = {r ? errno : 0, ns};
	if (write(spawn_res[1], res, sizeof res) != sizeof res || res[0])
		return NULL;
	for (;;) {
		struct spawn *sp;
		if (read(spawn_req[0], &sp, sizeof sp) != sizeof sp)
			return NULL;
		do_spawn(sp);
		if (write(spawn_res[1], &sp, sizeof sp) != sizeof sp)
			return NULL;
	}
}

// start_spawner starts the spawner thread and waits for it to take the
// sandbox's bounds.
static int start_spawner(void) {
	if (pipe2(spawn_req, O_CLOEXEC) || pipe2(spawn_res, O_CLOEXEC))
		FAILE("the spawner's pipes");
	pthread_t t;
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setstacksize(&a, 64 << 10);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	int r = pthread_create(&t, &a, spawner, NULL);
	pthread_attr_destroy(&a);
	if (r)
		return fail_with("", "starting the spawner thread: %s", errtext(r));
	int res[2];
	if (read(spawn_res[0], res, sizeof res) != sizeof res)
		FAILE("the spawner thread");
	if (res[0]) {
		if (res[1] >= 0)
			close(res[1]);
		return fail_with("", "restricting the spawner thread: %s", errtext(res[0]));
	}
	// This thread takes the spawner's cgroup namespace, rooted in the
	// sandbox's v1 pids group (this thread stays outside the group): the
	// Go guest, exec'd from this thread at a handover, keeps it for what
	// its own spawner starts, as the filter then refuses a new one.
	r = setns(res[1], CLONE_NEWCGROUP);
	close(res[1]);
	if (r)
		FAILE("entering the spawner's cgroup namespace");
	return 0;
}

// run_spawn has the spawner thread fork and exec sp.
static void run_spawn(struct spawn *sp) {
	struct spawn *back;
	if (write(spawn_req[1], &sp, sizeof sp) != sizeof sp || read(spawn_res[0], &back, sizeof back) != sizeof back) {
		logf_("the spawner thread is gone");
		_exit(1);
	}
}

static unsigned long long oom_kills(void) {
	if (oom_fd < 0)
		return 0;
	char b[4096];
	ssize_t n = pread(oom_fd, b, sizeof b - 1, 0);
	if (n <= 0)
		return 0;
	b[n] = 0;
	for (char *line = b; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
		if (!strncmp(line, "oom_kill ", 9))
			return strtoull(line + 9, NULL, 10);
	return 0;
}

// ---- processes and connections

struct chunk {
	int type;
	size_t len;
	struct chunk *next;
	unsigned char data[];
};

struct conn;

struct proc {
	pid_t pid;
	char **cmd;
	int ncmd;
	char *cwd;
	long long started_ns;
	int out[2]; // stdout, stderr: read ends, -1 once closed
	// Retained output: chunks from offset start to end (the Go guest's
	// ring), capped at output_limit.
	struct chunk *first, *last;
	long long start, end;
	char *exit; // the exit status (JSON) once reaped
	struct conn *c; // the connection streaming it
	struct proc *next; // in start order
};

// C_LANE_FD: a "lane" op answered, the lane's socket still to come on
// the connection.
enum cstate { C_IDLE, C_STREAM, C_RELEASE, C_LANE_FD };

// An exec lane (below: exec lanes bound to the sandbox).
struct lane {
	int rep;          // the daemon's connection: the reports out, its close in
	char *sandbox;    // the sandbox the lane is bound to
	struct buf out;   // report frames not sent yet, from off
	size_t off;
	long long budget; // of the exec in flight's output
	long long passed; // output passed on that the reports do not carry
	int begun;        // the exec in flight's start went to the daemon
	// gone: the daemon closed rep, or the reports broke off (a backlog
	// past MAX_REPORT_BACKLOG, a failed write): the lane closes after
	// its exec in flight, and reports nothing more.
	int gone;
	long long due;  // when out is to go (now_ms), -1 when nothing is due
	struct buf in;  // the frame being read from the lane
};

struct conn {
	int fd;
	enum cstate state;
	// l is set on an exec lane (fd is its client's socket): between
	// execs it is C_IDLE, streaming one C_STREAM.
	struct lane *l;
	char *lane_id; // C_LANE_FD: the sandbox the lane is bound to
	struct proc *p; // C_STREAM
	// pending is the start's answer (a Response frame) held until the
	// first output or the exit, or START_HOLD_MS.
	char *pending;
	size_t npending;
	long long hold_until;
	long long sent; // the offset in p's output of the next byte to send
	// cur is p's retained chunk that holds offset sent (the last one
	// once all went), starting at cur_at; NULL: found again from the
	// first (catch_up).
	struct chunk *cur;
	long long cur_at;
	int sndbuf; // the socket's send buffer
	struct conn *next;
};

static struct proc *procs;
static struct conn *conns;

static long long now_ms(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

static long long wall_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void frame_hdr(unsigned char *h, int t, size_t n) {
	h[0] = (unsigned char)t;
	h[1] = h[2] = h[3] = 0;
	h[4] = (unsigned char)(n >> 24);
	h[5] = (unsigned char)(n >> 16);
	h[6] = (unsigned char)(n >> 8);
	h[7] = (unsigned char)n;
}

static int write_iov(int fd, struct iovec *iov, int n) {
	while (n > 0) {
		ssize_t w = writev(fd, iov, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -1;
		while (n > 0 && (size_t)w >= iov->iov_len) {
			w -= (ssize_t)iov->iov_len;
			iov++;
			n--;
		}
		if (n > 0) {
			iov->iov_base = (char *)iov->iov_base + w;
			iov->iov_len -= (size_t)w;
		}
	}
	return 0;
}

// write_all writes n bytes of b to fd, a file: 0, or -1 on error.
static int write_all(int fd, const void *b, size_t n) {
	for (size_t o = 0; o < n;) {
		ssize_t w = write(fd, (const char *)b + o, n - o);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		o += (size_t)w;
	}
	return 0;
}

static int read_full(int fd, void *b, size_t n) {
	size_t o = 0;
	while (o < n) {
		ssize_t r = read(fd, (char *)b + o, n - o);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		o += (size_t)r;
	}
	return 0;
}

// send_frame writes a frame to c, after c's held answer if there is one,
// in one writev.
static int send_frame(struct conn *c, int t, const void *p, size_t n) {
	unsigned char h[8];
	frame_hdr(h, t, n);
	struct iovec iov[3];
	int k = 0;
	if (c->pending)
		iov[k++] = (struct iovec){c->pending, c->npending};
	iov[k++] = (struct iovec){h, 8};
	if (n)
		iov[k++] = (struct iovec){(void *)p, n};
	int r = write_iov(c->fd, iov, k);
	free(c->pending);
	c->pending = NULL;
	return r;
}

static void lane_end(struct conn *c);

static void close_conn(struct conn *c) {
	for (struct conn **pp = &conns; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	lane_end(c);
	if (c->p && c->p->c == c)
		c->p->c = NULL;
	close(c->fd);
	free(c->pending);
	free(c);
}

static void respond(struct conn *c, const char *json) { send_frame(c, F_RESPONSE, json, strlen(json)); }

// drop_output lets go of p's retained output: an attach gets a dropped
// frame for it.
static void drop_output(struct proc *p) {
	for (struct chunk *k = p->first, *next; k; k = next) {
		next = k->next;
		free(k);
	}
	p->first = p->last = NULL;
	p->start = p->end;
}

static void free_proc(struct proc *p) {
	for (int i = 0; i < p->ncmd; i++)
		free(p->cmd[i]);
	free(p->cmd);
	free(p->cwd);
	drop_output(p);
	for (int w = 0; w < 2; w++)
		if (p->out[w] >= 0)
			close(p->out[w]);
	free(p->exit);
	free(p);
}

// following is the offset of the next byte the connection streaming p
// sends, or p's end when none does.
static long long following(struct proc *p) {
	return p->c && p->c->state == C_STREAM ? p->c->sent : p->end;
}

// holding reports whether p's output waits for the connection streaming
// it, a full retention behind: p's pipes are not read meanwhile, and the
// process blocks on them once they are full. A stream's reader gets flow
// control, as the Go guest's ring holds its writer for an attached
// reader, never a dropped frame; output nobody follows never waits.
static int holding(struct proc *p) { return p->end - following(p) >= output_limit; }

// retain_output adds output to p's retained bytes, dropping the oldest
// past the cap that the connection streaming p has sent.

static void retain_output(struct proc *p, int type, const void *d, size_t n) {
	struct chunk *k = xalloc(sizeof *k + n);
	k->type = type;
	k->len = n;
	memcpy(k->data, d, n);
	if (p->last)
		p->last->next = k;
	else
		p->first = k;
	p->last = k;
	p->end += (long long)n;
	// What the stream has yet to send stays past the cap: at most what
	// one read, or a finished process's pipes, add beyond it (holding).
	long long keep = following(p);
	while (p->first && p->end - p->start > output_limit && p->start + (long long)p->first->len <= keep) {
		struct chunk *old = p->first;
		p->first = old->next;
		if (!p->first)
			p->last = NULL;
		p->start += (long long)old->len;
		if (p->c && p->c->cur == old)
			p->c->cur = NULL;
		free(old);
	}
}

// backed_up reports whether c's reader is behind: its socket holds more
// than half of what it may, or would with n more bytes. The fast guest is
// one thread and never waits for a reader (every connection would wait
// with it): a stream whose reader is behind goes on from the retained
// output when the socket has room (catch_up), as the Go guest's stream
// goes on from its ring; the process is not held up, and what the
// retention cap drops meanwhile is a dropped frame.
static int backed_up(struct conn *c, size_t n) {
	int queued;
	return ioctl(c->fd, SIOCOUTQ, &queued) || (size_t)queued + n + 8 > (size_t)c->sndbuf / 2;
}

static void lane_sent(struct conn *c, int t, const void *p, size_t n);
static void send_exit(struct conn *c, struct proc *p);

// behind reports whether c streams a process and has output or its exit
// still to send.
static int behind(struct conn *c) { return c->state == C_STREAM && c->p && (c->sent < c->p->end || c->p->exit); }

// catch_up sends c what its process's retained output holds past what c
// was sent (a dropped frame first for what the cap took), as much as
// c's socket takes without waiting, and the exit once all went.
static void catch_up(struct conn *c) {
	struct proc *p = c->p;
	if (c->sent < p->start) {
		char b[64];
		int n = snprintf(b, sizeof b, "{\"bytes\":%lld}", p->start - c->sent);
		if (backed_up(c, (size_t)n + c->npending))
			return;
		if (send_frame(c, F_DROPPED, b, (size_t)n)) {
			close_conn(c);
			return;
		}
		c->sent = p->start;
		c->cur = NULL;
		if (c->l)
			lane_sent(c, F_DROPPED, b, (size_t)n);
	}
	if (!c->cur || c->cur_at > c->sent) {
		c->cur = p->first;
		c->cur_at = p->start;
	}
	while (c->cur && c->sent < p->end) {
		struct chunk *k = c->cur;
		if (c->cur_at + (long long)k->len <= c->sent) {
			c->cur_at += (long long)k->len;
			c->cur = k->next;
			continue;
		}
		size_t skip = (size_t)(c->sent - c->cur_at), len = k->len - skip;
		if (backed_up(c, len + c->npending))
			return; // the rest when the socket has room
		if (send_frame(c, k->type, k->data + skip, len)) {
			close_conn(c);
			return;
		}
		c->sent += (long long)len;
		if (c->l)
			lane_sent(c, k->type, k->data + skip, len);
	}
	if (c->sent == p->end && p->exit)
		send_exit(c, p);
}

// read_output reads once from p's output w: retained, and sent to the
// connection streaming p. It returns 0 at EOF (the pipe closed), 1
// otherwise.
static int read_output(struct proc *p, int w) {
	static unsigned char b[65536];
	ssize_t n = read(p->out[w], b, sizeof b);
	if (n < 0 && (errno == EINTR || errno == EAGAIN))
		return 1;
	if (n <= 0) {
		close(p->out[w]);
		p->out[w] = -1;
		return 0;
	}
	int t = w ? F_STDERR : F_STDOUT;
	retain_output(p, t, b, (size_t)n);
	if (p->c)
		catch_up(p->c);
	return 1;
}

// send_exit ends c's stream of finished p: the exit frame, then c waits
// for its client's release (a lane for its next request).
static void send_exit(struct conn *c, struct proc *p) {
	size_t n = strlen(p->exit);
	if (backed_up(c, n + c->npending))
		return; // catch_up sends it when the socket has room
	c->p = NULL;
	p->c = NULL;
	if (send_frame(c, F_EXIT, p->exit, n)) {
		close_conn(c);
		return;
	}
	c->state = C_RELEASE;
	if (c->l) {
		c->state = C_IDLE;
		lane_sent(c, F_EXIT, p->exit, n);
		if (c->l->gone)
			close_conn(c);
	}
}

// sig_abbrev is the name of signal s without its SIG prefix (glibc's
// sigabbrev_np, which musl lacks: the same names), or NULL for one
// without a name of its own (0, the real-time signals).
static const char *sig_abbrev(int s) {
	static const char *const names[] = {
	    NULL, "HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "BUS", "FPE", "KILL", "USR1",
	    "SEGV", "USR2", "PIPE", "ALRM", "TERM", "STKFLT", "CHLD", "CONT", "STOP", "TSTP",
	    "TTIN", "TTOU", "URG", "XCPU", "XFSZ", "VTALRM", "PROF", "WINCH", "POLL", "PWR", "SYS",
	};
	return s > 0 && s < (int)(sizeof names / sizeof names[0]) ? names[s] : NULL;
}

// finish ends p once reaped: what its pipes still hold (not waiting for a
// background child that keeps one open), the exit status, and the exit
// frame to its connection.
static void finish(struct proc *p, int status) {
	for (int w = 0; w < 2; w++)
		if (p->out[w] >= 0) {
			fcntl(p->out[w], F_SETFL, O_NONBLOCK);
			// What the process left in its pipe, and no more than
			// twice that from a child writing on.
			long long from = p->end;
			while (p->out[w] >= 0 && read_output(p, w) && p->end - from < 2 * PIPE_MAX) {
				struct pollfd pf = {p->out[w], POLLIN, 0};
				if (poll(&pf, 1, 0) <= 0 || !(pf.revents & (POLLIN | POLLHUP)))
					break;
			}
			if (p->out[w] >= 0) {
				close(p->out[w]);
				p->out[w] = -1;
			}
		}
	struct buf b = {0};
	if (WIFSIGNALED(status)) {
		int sig = WTERMSIG(status);
		const char *name = sig_abbrev(sig);
		buf_printf(&b, "{\"exit_code\":%d,\"signal\":\"SIG%s\"", 128 + sig, name ? name : "?");
		if (sig == SIGKILL) {
			unsigned long long n = oom_kills();
			if (n > oom_seen)
				buf_puts(&b, ",\"oom_killed\":true");
			oom_seen = n > oom_seen ? n : oom_seen;
		}
		buf_puts(&b, "}");
	} else {
		buf_printf(&b, "{\"exit_code\":%d}", WEXITSTATUS(status));
	}
	p->exit = b.b;
	if (p->c)
		catch_up(p->c);
	// Finished processes are retained, the oldest dropped past retain.
	long long finished = 0;
	for (struct proc *q = procs; q; q = q->next)
		finished += q->exit != NULL;
	for (struct proc **pp = &procs; *pp && finished > retain;) {
		if ((*pp)->exit && !(*pp)->c) {
			struct proc *q = *pp;
			*pp = q->next;
			free_proc(q);
			finished--;
		} else {
			pp = &(*pp)->next;
		}
	}
	// Their output together within FINISHED_OUTPUT_FACTOR times the
	// limit, the oldest's going first, its record kept (the Go guest's
	// trimFinishedLocked).
	long long total = 0;
	for (struct proc *q = procs; q; q = q->next)
		if (q->exit)
			total += q->end - q->start;
	for (struct proc *q = procs; q && total > FINISHED_OUTPUT_FACTOR * output_limit; q = q->next)
		if (q->exit && !q->c) {
			total -= q->end - q->start;
			drop_output(q);
		}
}

static void helper_gone(void);
static pid_t helper_pid; // the helper (pass_on), 0 when there is none

static void reap(void) {
	for (;;) {
		int st;
		pid_t pid = waitpid(-1, &st, WNOHANG);
		if (pid <= 0)
			return;
		if (pid == helper_pid) {
			helper_pid = 0;
			helper_gone();
			continue;
		}
		for (struct proc *p = procs; p; p = p->next)
			if (p->pid == pid && !p->exit) {
				finish(p, st);
				break;
			}
	}
}

// ---- the helper: file ops and port connections

// The ops the Go guest serves apart from processes (its extraOps): the
// fast guest passes each on whole to a helper rather than hand the
// sandbox over for them. An agent's session writes and reads files
// between its commands; they need the Go guest's resolution under the
// root, owners, xattrs, tar and watches, and the commands stay here.
static const char *const helper_ops[] = {
	"file.read", "file.write", "file.stat", "file.list", "file.mkdir", "file.remove",
	"file.move", "file.tar_get", "file.tar_put", "file.watch", "port.connect",
};

static int helper_sock = -1; // our end of the helper's socket

// helper_gone forgets the helper's socket: the helper left or is
// leaving, and the next op starts another.
static void helper_gone(void) {
	if (helper_sock >= 0)
		close(helper_sock);
	helper_sock = -1;
}

// start_helper starts the helper: the Go guest's binary (fd 5) in its
// helper verb, its socket at fd 3, forked from this thread, so with PID
// 1's credentials (the sandbox's commands get theirs from the spawner),
// cgroups, namespaces, root and filter.
static int start_helper(void) {
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
		return -1;
	char *argv[] = {"paddock", HELPER_VERB, workdir, NULL};
	char *envp[] = {"GOMAXPROCS=1", "GODEBUG=memprofilerate=0", NULL};
	pid_t pid = vfork();
	if (pid == 0) {
		// dup2 leaves the copy open across the exec (fd 3 itself, were
		// it the socket, is made so).
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		if (sv[1] == 3 ? fcntl(3, F_SETFD, 0) == 0 : dup2(sv[1], 3) == 3)
			syscall(SYS_execveat, FD_GO, "", argv, envp, AT_EMPTY_PATH);
		_exit(127);
	}
	close(sv[1]);
	if (pid < 0) {
		logf_("starting the helper: %s", errtext(errno));
		close(sv[0]);
		return -1;
	}
	helper_gone();
	helper_sock = sv[0];
	helper_pid = pid;
	return 0;
}

// pass_on gives c, whose request frame (payload) was read, to the helper
// if its op is the helper's: one byte with the connection and a memfd
// holding the payload. 0: not passed on (not the helper's op, or no
// helper to take it: the caller hands over).
static int pass_on(struct conn *c, const char *op, const char *payload, size_t n) {
	size_t i = 0;
	while (i < sizeof helper_ops / sizeof *helper_ops && strcmp(op, helper_ops[i]))
		i++;
	if (i == sizeof helper_ops / sizeof *helper_ops)
		return 0;
	int mfd = (int)syscall(SYS_memfd_create, "paddock-request", MFD_CLOEXEC);
	if (mfd < 0)
		return 0;
	int ok = !write_all(mfd, payload, n);
	int passed = 0;
	for (int try = 0; ok && !passed && try < 2; try++) {
		if (helper_sock < 0 && start_helper())
			break;
		char one = 0;
		struct iovec iov = {&one, 1};
		union {
			char b[CMSG_SPACE(2 * sizeof(int))];
			struct cmsghdr align;
		} u;
		memset(&u, 0, sizeof u);
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof u.b};
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(2 * sizeof(int));
		int fds[2] = {c->fd, mfd};
		memcpy(CMSG_DATA(cm), fds, sizeof fds);
		ssize_t w = sendmsg(helper_sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w == 1)
			passed = 1;
		else if (w < 0 && (errno == EAGAIN || errno == EINTR))
			break; // the helper is that far behind: the Go guest takes over
		else
			helper_gone(); // it went: another
	}
	close(mfd);
	if (passed)
		close_conn(c);
	return passed;
}

// ---- the handover to the Go guest

static int handover(struct conn *trigger, const char *payload, size_t n);

// ---- starting a command

static const char *env_get(char **env, const char *key) {
	size_t kl = strlen(key);
	const char *v = NULL;
	for (; *env; env++)
		if (!strncmp(*env, key, kl) && (*env)[kl] == '=')
			v = *env + kl + 1;
	return v;
}

// merge_env is base with over's keys replaced or added, each key in its
// first place with its last value (the Go guest's mergeEnv).
static char **merge_env(char **base, int nbase, char **over, int nover, const char *home) {
	int n = nbase + nover + 1;
	char **out = xalloc(((size_t)n + 1) * sizeof *out);
	int k = 0;
	const char *extra[1] = {home};
	for (int pass = 0; pass < 3; pass++) {
		for (int i = 0;; i++) {
			const char *kv;
			if (pass == 0) {
				if (i >= nbase)
					break;
				kv = base[i];
			} else if (pass == 1) {
				if (i >= 1 || !extra[0])
					break;
				kv = extra[0];
			} else {
				if (i >= nover)
					break;
				kv = over[i];
			}
			const char *eq = strchr(kv, '=');
			size_t kl = eq ? (size_t)(eq - kv) : strlen(kv);
			int j;
			for (j = 0; j < k; j++)
				if (!strncmp(out[j], kv, kl) && (out[j][kl] == '=' || out[j][kl] == 0))
					break;
			out[j] = (char *)kv;
			if (j == k)
				k++;
		}
	}
	out[k] = NULL;
	return out;
}

static int executable(const char *p) {
	struct stat st;
	return !stat(p, &st) && !S_ISDIR(st.st_mode) && (st.st_mode & 0111);
}

// look_path finds name the way the Go guest's lookPath does; 0 if it
// cannot (the Go guest then says why).
static int look_path(const char *name, const char *path, const char *cwd, char *out, size_t n) {
	int w;
	if (strchr(name, '/')) {
		w = name[0] == '/' ? snprintf(out, n, "%s", name) : snprintf(out, n, "%s/%s", cwd, name);
		return w > 0 && (size_t)w < n && executable(out);
	}
	for (const char *p = path ? path : "";;) {
		const char *e = strchr(p, ':');
		int l = (int)(e ? (size_t)(e - p) : strlen(p));
		if (l == 0)
			w = snprintf(out, n, "%s/%s", cwd, name);
		else if (p[0] != '/')
			w = snprintf(out, n, "%s/%.*s/%s", cwd, l, p, name);
		else
			w = snprintf(out, n, "%.*s/%s", l, p, name);
		if (w > 0 && (size_t)w < n && executable(out))
			return 1;
		if (!e)
			return 0;
		p = e + 1;
	}
}

// spawn_plain starts argv (argc strings, NULL after them) as root with
// over (nover KEY=VALUE strings) over the sandbox's environment, in cwd
// (the workdir when empty), its output to be streamed to c. NULL when
// the Go guest is to start it: it then says why it cannot.
static struct proc *spawn_plain(struct conn *c, char **argv, int argc, char **over, int nover, const char *cwd) {
	if (!cwd || !*cwd)
		cwd = workdir;
	struct stat st;
	if (stat(cwd, &st) || !S_ISDIR(st.st_mode))
		return NULL;
	int has_home = 0;
	for (int i = 0; i < nover; i++)
		if (!strncmp(over[i], "HOME=", 5))
			has_home = 1;
	char **env = merge_env(serve_env, nserve_env, over, nover, has_home ? NULL : "HOME=/root");
	char argv0[4096];
	if (!look_path(argv[0], env_get(env, "PATH"), cwd, argv0, sizeof argv0)) {
		free(env);
		return NULL;
	}
	int out[2] = {-1, -1}, err[2] = {-1, -1};
	if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC)) {
		for (int k = 0; k < 2; k++)
			close(out[k]), close(err[k]);
		free(env);
		return NULL;
	}
	struct spawn sp = {.argv0 = argv0, .argv = argv, .env = env, .cwd = cwd, .out = out[1], .err = err[1]};
	run_spawn(&sp);
	close(out[1]);
	close(err[1]);
	free(env);
	pid_t pid = sp.pid;
	if (pid < 0) {
		// The Go guest says why, in its words.
		close(out[0]);
		close(err[0]);
		return NULL;
	}
	// A finished process whose pid the kernel gave this one is forgotten.
	for (struct proc **pp = &procs; *pp; pp = &(*pp)->next)
		if ((*pp)->pid == pid && (*pp)->exit) {
			struct proc *q = *pp;
			*pp = q->next;
			free_proc(q);
			break;
		}
	struct proc *p = xalloc(sizeof *p);
	p->pid = pid;
	p->ncmd = argc;
	p->cmd = xalloc((size_t)argc * sizeof *p->cmd);
	for (int i = 0; i < argc; i++)
		p->cmd[i] = xstrdup(argv[i]);
	p->cwd = xstrdup(cwd);
	p->started_ns = wall_ns();
	p->out[0] = out[0];
	p->out[1] = err[0];
	p->c = c;
	struct proc **tail = &procs;
	while (*tail)
		tail = &(*tail)->next;
	*tail = p;
	c->state = C_STREAM;
	c->p = p;
	c->sent = 0;
	c->cur = NULL;
	return p;
}

// hold_answer holds c's answer to its start of p, a frame of type t,
// until p's first output or exit, or START_HOLD_MS.
static void hold_answer(struct conn *c, struct proc *p, int t) {
	char b[64];
	int n = snprintf(b, sizeof b, "{\"pid\":%d}", p->pid);
	c->pending = xalloc(8 + (size_t)n);
	frame_hdr((unsigned char *)c->pending, t, (size_t)n);
	memcpy(c->pending + 8, b, (size_t)n);
	c->npending = 8 + (size_t)n;
	c->hold_until = now_ms() + START_HOLD_MS;
}

// start serves an attached start of a plain command; it returns 0 when
// the request is the Go guest's to serve.
static int start(struct conn *c, struct jnode *req) {
	struct jnode *cmd = jget(req, "cmd");
	const char *user = jstr(jget(req, "user"));
	struct jnode *tty = jget(req, "tty");
	int argc = jlen(cmd);
	if (!cmd || cmd->t != J_ARR || argc == 0 || !jbool(jget(req, "attach")) || (tty && tty->t != J_NULL) ||
	    jbool(jget(req, "stdin")) || jint(jget(req, "timeout_seconds"), 0) != 0 ||
	    (user && *user && strcmp(user, "root") && strcmp(user, "0")))
		return 0;
	for (struct jnode *a = cmd->kids; a; a = a->next)
		if (!jstr(a))
			return 0;
	struct jnode *envn = jget(req, "env");
	int nenv = 0;
	char **env = xalloc(((size_t)jlen(envn) + 1) * sizeof *env);
	for (struct jnode *e = envn && envn->t == J_ARR ? envn->kids : NULL; e; e = e->next)
		if (jstr(e))
			env[nenv++] = (char *)jstr(e);
	char **argv = xalloc(((size_t)argc + 1) * sizeof *argv);
	int i = 0;
	for (struct jnode *a = cmd->kids; a; a = a->next)
		argv[i++] = (char *)jstr(a);
	struct proc *p = spawn_plain(c, argv, argc, env, nenv, jstr(jget(req, "cwd")));
	free(env);
	free(argv);
	if (!p)
		return 0;
	hold_answer(c, p, F_RESPONSE);
	return 1;
}

// parse_signal reads "TERM", "SIGTERM", "sigterm" or "15" (the Go
// guest's parseSignal); 0 if it is none.
static int parse_signal(const char *name) {
	if (!name || !*name)
		return 0;
	char *end;
	long n = strtol(name, &end, 10);
	if (!*end)
		return n > 0 && n <= 64 ? (int)n : 0;
	if (!strncasecmp(name, "SIG", 3))
		name += 3;
	for (int s = 1; s < 65; s++) {
		const char *a = sig_abbrev(s);
		if (a && !strcasecmp(a, name))
			return s;
	}
	return 0;
}

static void signal_proc(struct proc *p, int sig) {
	// Each process leads its own session: the group gets it.
	if (kill(-p->pid, sig))
		kill(p->pid, sig);
}

// attach serves an attach to one of its processes that no connection
// streams (the daemon's exec log following a process whose client left):
// the answer, what is retained from the offset on (a dropped frame for
// what the cap took), then the output as it comes and the exit, as the
// Go guest's stream does. It returns 0 when the request is the Go
// guest's: a process it does not know, one streamed already, a negative
// offset.
static int attach(struct conn *c, struct jnode *req) {
	long long pid = jint(jget(req, "pid"), 0), off = jint(jget(req, "offset"), 0);
	struct proc *p = procs;
	while (p && p->pid != pid)
		p = p->next;
	// The connection streaming it may be one its client closed that the
	// loop has not come to yet (the exec log attaches as the client's
	// stream ends): it goes first.
	char peek;
	if (p && p->c && recv(p->c->fd, &peek, 1, MSG_PEEK | MSG_DONTWAIT) == 0)
		close_conn(p->c);
	if (!p || p->c || off < 0)
		return 0;
	char b[64];
	int n = snprintf(b, sizeof b, "{\"pid\":%d}", p->pid);
	if (send_frame(c, F_RESPONSE, b, (size_t)n)) {
		close_conn(c);
		return 1;
	}
	c->state = C_STREAM;
	c->p = p;
	p->c = c;
	c->sent = off < p->end ? off : p->end;
	c->cur = NULL;
	catch_up(c);
	return 1;
}

// ---- exec lanes bound to the sandbox

// A lane is a client's connection upgraded to an exec lane bound to this
// sandbox, which the daemon hands over (op "lane": the answer, then one
// byte carrying the socket; internal/guest/lane_linux.go says why, and
// how the Go guest serves them). The fast guest serves a lane's plain
// execs as it serves attached starts, streaming each to the lane, and
// reports each on the connection that handed the lane over (its start,
// its output up to a budget and then byte counts, its exit), from which
// the daemon keeps the exec log and the events. A lane closes when that
// connection does (the daemon is gone), after the exec in flight. Any
// other request on a lane hands over, the lanes with it, where each
// stands (guestapi.HandoverLane).
#define MAX_LANES 64              // the Go guest's maxLanes
#define REPORT_BUDGET (256 << 10) // reportBudget
#define MAX_REPORT_BACKLOG (1 << 20)
#define REPORT_DELAY_MS 50
#define REPORT_SOON (64 << 10)

static int nlanes;

static void lane_gone(struct lane *l) {
	l->gone = 1;
	l->out.n = l->off = 0;
	l->due = -1;
}

// report_send writes what it can of l's reports without waiting; the
// rest goes when rep is writable.
static void report_send(struct lane *l) {
	while (!l->gone && l->off < l->out.n) {
		ssize_t w = send(l->rep, l->out.b + l->off, l->out.n - l->off, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN)
			return;
		if (w <= 0) {
			lane_gone(l);
			return;
		}
		l->off += (size_t)w;
	}
	l->out.n = l->off = 0;
	l->due = -1;
}

static void report_add(struct lane *l, int t, const void *p, size_t n) {
	if (l->gone)
		return;
	if (l->out.n - l->off + 8 + n > MAX_REPORT_BACKLOG) {
		lane_gone(l);
		return;
	}
	if (l->off > 0 && l->off >= l->out.n / 2) {
		// What went is dropped before the buffer grows past twice the
		// backlog.
		memmove(l->out.b, l->out.b + l->off, l->out.n - l->off);
		l->out.n -= l->off;
		l->off = 0;
	}
	unsigned char h[8];
	frame_hdr(h, t, n);
	buf_add(&l->out, h, 8);
	buf_add(&l->out, p, n);
}

// flush_passed reports the output passed on and not carried.
static void flush_passed(struct lane *l) {
	if (l->passed > 0) {
		char b[64];
		int n = snprintf(b, sizeof b, "{\"bytes\":%lld}", l->passed);
		report_add(l, F_RELEASE, b, (size_t)n);
		l->passed = 0;
	}
}

// lane_start reports p's start on lane c; it goes with the first frame
// to the client (the held answer).
static void lane_start(struct conn *c, struct proc *p) {
	struct lane *l = c->l;
	struct buf b = {0};
	buf_printf(&b, "{\"pid\":%d,\"cmd\":[", p->pid);
	for (int i = 0; i < p->ncmd; i++) {
		if (i)
			buf_puts(&b, ",");
		buf_str(&b, p->cmd[i]);
	}
	buf_puts(&b, "]}");
	l->budget = REPORT_BUDGET;
	l->begun = 0;
	report_add(l, F_STARTED, b.b, b.n);
	free(b.b);
}

// lane_sent reports a frame lane c's client was sent (t 0: the held
// answer alone): output while the exec's budget lasts, then its count;
// the start and the exit go at once, output within REPORT_DELAY_MS.
static void lane_sent(struct conn *c, int t, const void *p, size_t n) {
	struct lane *l = c->l;
	if (t == F_STDOUT || t == F_STDERR) {
		if ((long long)n <= l->budget) {
			l->budget -= (long long)n;
			flush_passed(l);
			report_add(l, t, p, n);
		} else {
			l->budget = 0;
			l->passed += (long long)n;
		}
	} else if (t == F_DROPPED || t == F_EXIT) {
		flush_passed(l);
		report_add(l, t, p, n);
	}
	if (!l->begun || t == F_EXIT || l->out.n - l->off >= REPORT_SOON) {
		l->due = 0;
		report_send(l);
	} else if (l->due < 0 && l->out.n > l->off) {
		l->due = now_ms() + REPORT_DELAY_MS;
	}
	l->begun = 1;
}

// lane_end closes lane c's reports as c closes: a lane that leaves an
// exec before its exit says so (the daemon's copy then follows the
// process from its output), and what is queued goes if it can.
static void lane_end(struct conn *c) {
	if (c->state == C_LANE_FD)
		nlanes--;
	free(c->lane_id);
	c->lane_id = NULL;
	struct lane *l = c->l;
	if (!l)
		return;
	if (c->state == C_STREAM) {
		flush_passed(l);
		report_add(l, F_ERROR, NULL, 0);
	}
	report_send(l);
	close(l->rep);
	free(l->sandbox);
	free(l->out.b);
	free(l->in.b);
	free(l);
	c->l = NULL;
	nlanes--;
}

// sandbox_id_ok is api.IsSandboxID.
static int sandbox_id_ok(const char *id) {
	size_t n = strlen(id);
	if (!n || n > 64 || id[0] == '-')
		return 0;
	for (; *id; id++)
		if (!((*id >= 'a' && *id <= 'z') || (*id >= '0' && *id <= '9') || *id == '-'))
			return 0;
	return 1;
}

// lane_op serves op "lane": the answer, and then the lane's socket.
static int lane_op(struct conn *c, const char *id) {
	if (!id || !sandbox_id_ok(id) || nlanes >= MAX_LANES)
		return 0; // the Go guest words why not
	respond(c, "{}");
	nlanes++;
	c->state = C_LANE_FD;
	c->lane_id = xstrdup(id);
	return 1;
}

// take_lane receives the lane's socket on c (one byte with one unix
// stream socket), waiting for it only if wait is set; c becomes the
// lane, its connection the lane's reports.
static void take_lane(struct conn *c, int wait) {
	char byte, ctl[CMSG_SPACE(4 * sizeof(int))];
	struct iovec iov = {&byte, 1};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
	ssize_t n;
	do
		n = recvmsg(c->fd, &m, MSG_CMSG_CLOEXEC | (wait ? 0 : MSG_DONTWAIT));
	while (n < 0 && errno == EINTR);
	if (n < 0 && errno == EAGAIN && !wait)
		return;
	int fds[4], nfds = 0;
	for (struct cmsghdr *h = n == 1 ? CMSG_FIRSTHDR(&m) : NULL; h; h = CMSG_NXTHDR(&m, h))
		if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS)
			for (size_t i = 0; i < (h->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
				int fd;
				memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof fd);
				if (nfds < 4)
					fds[nfds++] = fd;
				else
					close(fd);
			}
	int dom = 0, type = 0;
	socklen_t len = sizeof dom;
	if (nfds == 1 && (m.msg_flags & MSG_CTRUNC) == 0 && !getsockopt(fds[0], SOL_SOCKET, SO_DOMAIN, &dom, &len) &&
	    dom == AF_UNIX && (len = sizeof type, !getsockopt(fds[0], SOL_SOCKET, SO_TYPE, &type, &len)) && type == SOCK_STREAM) {
		struct lane *l = xalloc(sizeof *l);
		l->rep = c->fd;
		l->sandbox = c->lane_id;
		l->due = -1;
		c->lane_id = NULL;
		c->fd = fds[0];
		c->l = l;
		c->state = C_IDLE;
		int sz = 1 << 20; // wire.StreamSendBuffer
		setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
		len = sizeof c->sndbuf;
		if (getsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &c->sndbuf, &len))
			c->sndbuf = sz;
		return;
	}
	logf_("taking an exec lane: expected one unix stream socket, got %d descriptors", nfds);
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	close_conn(c);
}

// lane_exec serves a lane's request when it is one the fast guest serves
// (lanereq.c) and its program and working directory are there; 0 when the
// Go guest is to serve it, or to say what is wrong with it.
static int lane_exec(struct conn *c, const char *payload, size_t n) {
	struct lane_req r;
	if (!lane_req_parse(payload, n, c->l->sandbox, &r))
		return 0;
	struct proc *p = spawn_plain(c, r.argv, r.argc, r.env, r.nenv, r.cwd);
	lane_req_free(&r);
	if (!p)
		return 0;
	hold_answer(c, p, F_STARTED);
	lane_start(c, p);
	return 1;
}

// lane_readable reads what lane c's client sent, and serves it once a
// frame is whole. A lane is read only between its execs, and without
// waiting: its client is the API's caller, who may send half a frame.
static void lane_readable(struct conn *c) {
	struct buf *in = &c->l->in;
	size_t need = 8;
	for (;;) {
		if (in->n >= 8) {
			const unsigned char *h = (const unsigned char *)in->b;
			size_t len = (size_t)h[4] << 24 | (size_t)h[5] << 16 | (size_t)h[6] << 8 | h[7];
			if (len > MAX_PAYLOAD) {
				close_conn(c);
				return;
			}
			need = 8 + len;
		}
		if (in->n == need)
			break;
		buf_reserve(in, need - in->n);
		ssize_t r = recv(c->fd, in->b + in->n, need - in->n, MSG_DONTWAIT);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && errno == EAGAIN)
			return;
		if (r <= 0) {
			close_conn(c);
			return;
		}
		in->n += (size_t)r;
	}
	int t = (unsigned char)in->b[0];
	char *payload = in->b + 8;
	size_t n = need - 8;
	if (t != F_REQUEST) {
		// Out of step: the client is confused or hostile.
		char b[192];
		int k = snprintf(b, sizeof b,
		                 "{\"code\":\"invalid_argument\",\"message\":\"invalid argument: frame: a lane takes request frames "
		                 "(type %d), not type %d\",\"status\":400}",
		                 F_REQUEST, t);
		if (!backed_up(c, (size_t)k))
			send_frame(c, F_ERROR, b, (size_t)k);
		close_conn(c);
		return;
	}
	if (lane_exec(c, payload, n)) {
		in->n = 0;
		if (in->cap > 64 << 10) {
			// A large request's room goes back.
			free(in->b);
			*in = (struct buf){0};
		}
		return;
	}
	logf_("handing over to the Go guest for a lane's request");
	handover(c, payload, n);
	const char *e = "{\"code\":\"internal\",\"message\":\"the guest could not hand over to its full server\",\"status\":500}";
	send_frame(c, F_ERROR, e, strlen(e));
	close_conn(c);
}

// request serves one request frame's payload on an idle connection.
static void request(struct conn *c, char *payload, size_t n) {
	struct jnode *req = jparse(payload, n);
	const char *op = jstr(jget(req, "op"));
	int served = 0;
	if (op && !strcmp(op, "ping")) {
		respond(c, "{\"pid\":1}");
		close_conn(c);
		served = 1;
	} else if (op && !strcmp(op, "start")) {
		served = start(c, jget(req, "start"));
	} else if (op && !strcmp(op, "attach")) {
		served = attach(c, req);
	} else if (op && !strcmp(op, "lane")) {
		served = lane_op(c, jstr(jget(req, "sandbox")));
	} else if (op) {
		served = pass_on(c, op, payload, n);
	}
	if (!served)
		logf_("handing over to the Go guest for %s", op ? op : "a request it cannot read");
	jfree(req);
	if (!served && handover(c, payload, n)) {
		respond(c, "{\"error\":{\"code\":\"internal\",\"message\":\"the guest could not hand over to its full server\"}}");
		close_conn(c);
	}
}

// readable serves what the client sent on c.
static void readable(struct conn *c) {
	if (c->l) {
		lane_readable(c);
		return;
	}
	if (c->state == C_LANE_FD) {
		take_lane(c, 0);
		return;
	}
	unsigned char h[8];
	if (read_full(c->fd, h, 8)) {
		close_conn(c);
		return;
	}
	size_t n = (size_t)h[4] << 24 | (size_t)h[5] << 16 | (size_t)h[6] << 8 | h[7];
	if (n > MAX_PAYLOAD) {
		close_conn(c);
		return;
	}
	char *b = xalloc(n + 1);
	if (read_full(c->fd, b, n)) {
		free(b);
		close_conn(c);
		return;
	}
	switch (c->state) {
	case C_IDLE:
		if (h[0] == F_REQUEST)
			request(c, b, n);
		else
			close_conn(c);
		break;
	case C_STREAM:
		// A release before the exit ends the stream; a signal goes to
		// the process; there is no stdin or terminal.
		if (h[0] == F_RELEASE) {
			close_conn(c);
		} else if (h[0] == F_SIGNAL) {
			struct jnode *j = jparse(b, n);
			int sig = parse_signal(jstr(jget(j, "signal")));
			if (sig && c->p)
				signal_proc(c->p, sig);
			jfree(j);
		}
		break;
	case C_RELEASE:
		if (h[0] == F_RELEASE)
			c->state = C_IDLE;
		break;
	case C_LANE_FD:
		break;
	}
	free(b);
}

static void accept_conn(void) {
	int fd = accept4(FD_LISTEN, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0)
		return;
	int sz = 1 << 20; // wire.StreamSendBuffer
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
	// A frame is read whole once its first byte is there: one cut short
	// ends its connection, not the guest's serving.
	struct timeval tv = {10, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	struct conn *c = xalloc(sizeof *c);
	socklen_t len = sizeof c->sndbuf;
	if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &c->sndbuf, &len))
		c->sndbuf = sz;
	c->fd = fd;
	c->next = conns;
	conns = c;
}

static int serve(int sigfd) {
	for (;;) {
		int n = 3;
		for (struct conn *c = conns; c; c = c->next)
			n += 2;
		for (struct proc *p = procs; p; p = p->next)
			n += 2;
		struct pollfd *pf = xalloc((size_t)n * sizeof *pf);
		void **who = xalloc((size_t)n * sizeof *who);
		int *kind = xalloc((size_t)n * sizeof *kind);
		int k = 0;
		long long wake = -1;
		pf[k] = (struct pollfd){FD_LISTEN, POLLIN, 0}, kind[k++] = 0;
		pf[k] = (struct pollfd){sigfd, POLLIN, 0}, kind[k++] = 1;
		// The helper sends nothing: its socket readable is the helper
		// leaving (idle, it shuts its side; it serves what it was given
		// until ours closes).
		if (helper_sock >= 0)
			pf[k] = (struct pollfd){helper_sock, POLLIN, 0}, kind[k++] = 6;
		long long now = now_ms();
		for (struct conn *c = conns; c; c = c->next) {
			// A lane is read between its execs only, as the Go guest's;
			// a stream whose reader is behind waits for room.
			short ev = (short)((!c->l || c->state == C_IDLE ? POLLIN : 0) | (behind(c) ? POLLOUT : 0));
			if (ev)
				pf[k] = (struct pollfd){c->fd, ev, 0}, who[k] = c, kind[k++] = 2;
			if (c->pending && (wake < 0 || c->hold_until < wake))
				wake = c->hold_until;
			struct lane *l = c->l;
			if (l && !l->gone) {
				// Its report connection: the daemon's close, and
				// writable when reports are due and wait.
				ev = POLLIN;
				if (l->due >= 0 && l->due <= now)
					ev |= POLLOUT;
				else if (l->due > now && (wake < 0 || l->due < wake))
					wake = l->due;
				pf[k] = (struct pollfd){l->rep, ev, 0}, who[k] = c, kind[k++] = 5;
			}
		}
		for (struct proc *p = procs; p; p = p->next)
			for (int w = 0; w < 2; w++)
				if (p->out[w] >= 0 && !holding(p))
					pf[k] = (struct pollfd){p->out[w], POLLIN, 0}, who[k] = p, kind[k++] = 3 + w;
		int r = poll(pf, (nfds_t)k, wake < 0 ? -1 : (int)(wake > now ? wake - now : 0));
		if (r < 0 && errno != EINTR) {
			logf_("poll: %s", errtext(errno));
			return 1;
		}
		now = now_ms();
		for (struct conn *c = conns, *next; c; c = next) {
			next = c->next;
			// (A few bytes: a socket is never written past half its
			// buffer but by these, one a stream.)
			if (c->pending && c->hold_until <= now) {
				struct iovec iov = {c->pending, c->npending};
				int bad = write_iov(c->fd, &iov, 1);
				free(c->pending);
				c->pending = NULL;
				if (bad) {
					close_conn(c);
					continue;
				}
				if (c->l)
					lane_sent(c, 0, NULL, 0);
			}
			if (c->l && c->l->due >= 0 && c->l->due <= now)
				report_send(c->l);
			if (c->l && c->l->gone && c->state == C_IDLE)
				close_conn(c);
		}
		// One event is served a round: serving one may free what
		// another names.
		for (int i = 0; i < k; i++) {
			if (!pf[i].revents)
				continue;
			if (kind[i] == 0) {
				accept_conn();
			} else if (kind[i] == 1) {
				struct signalfd_siginfo si;
				while (read(sigfd, &si, sizeof si) == sizeof si)
					if (si.ssi_signo != SIGCHLD && si.ssi_signo != SIGPWR)
						for (struct proc *p = procs; p; p = p->next)
							if (!p->exit)
								kill(p->pid, (int)si.ssi_signo);
				reap();
			} else if (kind[i] == 2) {
				struct conn *c = who[i];
				if (pf[i].revents & POLLIN || !behind(c))
					readable(c);
				else
					catch_up(c);
			} else if (kind[i] == 6) {
				helper_gone();
			} else if (kind[i] == 5) {
				// The daemon sends nothing on a lane's reports: its
				// connection readable is the daemon gone.
				struct conn *c = who[i];
				if (pf[i].revents & (POLLIN | POLLHUP | POLLERR))
					lane_gone(c->l);
				else
					report_send(c->l);
				if (c->l->gone && c->state == C_IDLE)
					close_conn(c);
			} else {
				read_output(who[i], kind[i] - 3);
			}
			break;
		}
		free(pf);
		free(who);
		free(kind);
	}
}

static int handover(struct conn *trigger, const char *payload, size_t n) {
	// A lane whose socket is on its way is taken first: the Go guest
	// takes lanes, not that step.
	for (struct conn *c = conns, *next; c; c = next) {
		next = c->next;
		if (c->state == C_LANE_FD)
			take_lane(c, 1);
	}
	struct buf b = {0};
	buf_puts(&b, "{\"serve\":{\"env\":[");
	for (int i = 0; i < nserve_env; i++) {
		if (i)
			buf_puts(&b, ",");
		buf_str(&b, serve_env[i]);
	}
	buf_puts(&b, "],\"workdir\":");
	buf_str(&b, workdir);
	buf_printf(&b, ",\"output_limit\":%lld,\"retain\":%lld},\"caps\":[", output_limit, retain);
	for (int i = 0; i < ncaps; i++) {
		if (i)
			buf_puts(&b, ",");
		buf_str(&b, caps[i]);
	}
	buf_printf(&b, "],\"oom_fd\":%d,\"oom_seen\":%llu,\"pids_tasks\":%d,\"procs\":[", oom_fd, oom_seen, pids_tasks);
	for (struct proc *p = procs; p; p = p->next) {
		if (p != procs)
			buf_puts(&b, ",");
		buf_printf(&b, "{\"pid\":%d,\"cmd\":[", p->pid);
		for (int i = 0; i < p->ncmd; i++) {
			if (i)
				buf_puts(&b, ",");
			buf_str(&b, p->cmd[i]);
		}
		buf_puts(&b, "],\"cwd\":");
		buf_str(&b, p->cwd);
		buf_printf(&b, ",\"started_ns\":%lld,\"stdout\":%d,\"stderr\":%d,\"dropped\":%lld,\"output\":[", p->started_ns, p->out[0], p->out[1], p->start);
		for (struct chunk *k = p->first; k; k = k->next)
			buf_printf(&b, "%s{\"type\":%d,\"len\":%zu}", k == p->first ? "" : ",", k->type, k->len);
		buf_puts(&b, "]");
		if (p->exit) {
			buf_puts(&b, ",\"exit\":");
			buf_puts(&b, p->exit);
		}
		buf_puts(&b, "}");
	}
	buf_puts(&b, "],\"conns\":[");
	for (struct conn *c = conns; c; c = c->next) {
		buf_printf(&b, "%s{\"fd\":%d", c == conns ? "" : ",", c->fd);
		struct lane *l = c->l;
		if (l) {
			buf_printf(&b, ",\"lane\":{\"report\":%d,\"sandbox\":", l->rep);
			buf_str(&b, l->sandbox);
			buf_printf(&b, ",\"budget\":%lld,\"passed\":%lld,\"begun\":%s,\"failed\":%s", l->budget, l->passed,
			           l->begun ? "true" : "false", l->gone ? "true" : "false");
			if (l->out.n > l->off) {
				buf_puts(&b, ",\"reports\":");
				buf_b64(&b, (const unsigned char *)l->out.b + l->off, l->out.n - l->off);
			}
			if (c != trigger && l->in.n) {
				buf_puts(&b, ",\"read\":");
				buf_b64(&b, (const unsigned char *)l->in.b, l->in.n);
			}
			buf_puts(&b, "}");
		}
		if (c == trigger) {
			buf_puts(&b, ",\"request\":");
			buf_b64(&b, (const unsigned char *)payload, n);
		} else if (c->state == C_STREAM && c->p) {
			buf_printf(&b, ",\"pid\":%d,\"offset\":%lld", c->p->pid, c->sent);
			if (c->pending) {
				buf_puts(&b, ",\"answer\":");
				buf_b64(&b, (const unsigned char *)c->pending, c->npending);
			}
		} else if (c->state == C_RELEASE) {
			buf_puts(&b, ",\"release\":true");
		}
		buf_puts(&b, "}");
	}
	buf_puts(&b, "]}");

	// The memfd: the JSON's length (8 bytes, little endian), the JSON,
	// then the retained output raw (guestapi.ReadHandover).
	int mfd = (int)syscall(SYS_memfd_create, "paddock-handover", 0);
	int ok = mfd >= 0;
	unsigned char jl[8];
	for (int i = 0; i < 8; i++)
		jl[i] = (unsigned char)((unsigned long long)b.n >> (8 * i));
	ok = ok && !write_all(mfd, jl, 8) && !write_all(mfd, b.b, b.n);
	free(b.b);
	for (struct proc *p = procs; ok && p; p = p->next)
		for (struct chunk *k = p->first; ok && k; k = k->next)
			ok = !write_all(mfd, k->data, k->len);
	ok = ok && lseek(mfd, 0, SEEK_SET) == 0;
	// What the Go guest takes is inherited through the exec; the rest
	// stays close-on-exec.
	int keep[4096], nkeep = 0;
	keep[nkeep++] = FD_LISTEN;
	if (oom_fd >= 0)
		keep[nkeep++] = oom_fd;
	if (pids_tasks >= 0)
		keep[nkeep++] = pids_tasks;
	for (struct proc *p = procs; p && nkeep < 4000; p = p->next)
		for (int w = 0; w < 2; w++)
			if (p->out[w] >= 0)
				keep[nkeep++] = p->out[w];
	for (struct conn *c = conns; c && nkeep < 4094; c = c->next) {
		keep[nkeep++] = c->fd;
		if (c->l)
			keep[nkeep++] = c->l->rep;
	}
	for (int i = 0; ok && i < nkeep; i++)
		ok = !fcntl(keep[i], F_SETFD, 0);
	if (ok) {
		char arg[16];
		snprintf(arg, sizeof arg, "%d", mfd);
		char *argv[] = {"paddock", ADOPT_VERB, arg, NULL};
		char *envp[] = {"GOMAXPROCS=1", "GODEBUG=memprofilerate=0", NULL};
		sigset_t none;
		sigemptyset(&none);
		prctl(PR_SET_TIMERSLACK, GO_SLACK_NS, 0, 0, 0);
		sigprocmask(SIG_SETMASK, &none, NULL);
		syscall(SYS_execveat, FD_GO, "", argv, envp, AT_EMPTY_PATH);
		logf_("handing over to the Go guest: %s", errtext(errno));
		sigaddset(&none, SIGCHLD);
		sigaddset(&none, SIGPIPE);
		sigprocmask(SIG_SETMASK, &none, NULL);
		prctl(PR_SET_TIMERSLACK, SANDBOX_SLACK_NS, 0, 0, 0);
	}
	for (int i = 0; i < nkeep; i++)
		fcntl(keep[i], F_SETFD, FD_CLOEXEC);
	if (mfd >= 0)
		close(mfd);
	return -1;
}

// ---- boot

static int recv_config(char *buf, size_t cap, int *fds, int *nfds, size_t *len) {
	static char cbuf[CMSG_SPACE(253 * sizeof(int))];
	struct iovec iov = {buf, cap};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
	ssize_t n;
	do
		n = recvmsg(FD_SYNC, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	*nfds = 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); n > 0 && cm; cm = CMSG_NXTHDR(&mh, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
			int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			if (*nfds + k > 253)
				k = 253 - *nfds;
			memcpy(fds + *nfds, CMSG_DATA(cm), (size_t)k * sizeof(int));
			*nfds += k;
		}
	if (n < 0)
		FAIL("receiving config: %s", errtext(errno));
	if (n == 0)
		FAIL("daemon closed the sync socket");
	if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
		FAIL("receiving config: packet or descriptors truncated");
	*len = (size_t)n;
	return 0;
}

static void send_ready(const char *json) {
	if (write(FD_SYNC, json, strlen(json)) < 0)
		logf_("answering the daemon: %s", errtext(errno));
}

// fail_ready tells the daemon why the guest ends (guestapi.FailReady).
static int fail_ready(void) {
	struct buf b = {0};
	buf_puts(&b, "{\"error\":");
	buf_str(&b, errmsg);
	if (*errcode) {
		buf_puts(&b, ",\"code\":");
		buf_str(&b, errcode);
	}
	buf_puts(&b, "}");
	send_ready(b.b);
	logf_("%s", errmsg);
	free(b.b);
	return 1;
}

static int prepare(struct jnode *p, int *fds, int nfds, const unsigned char *filter, size_t flen) {
	long long oomi = jint(jget(p, "oom_fd"), -1);
	if (oomi < 0 || oomi >= nfds)
		FAIL("OOM counter fd %lld not received", oomi);
	struct jnode *pt = jget(p, "pids_tasks");
	if (pt && pt->t != J_NULL) {
		long long i = jint(pt, -1);
		if (i < 0 || i >= nfds || i == oomi)
			FAIL("pids tasks fd %lld not received", i);
		pids_tasks = fds[i];
	}
	if (jbool(jget(p, "root_ready")) || jstr(jget(p, "listen")))
		FAIL("the fast guest serves native sandboxes only");
	oom_fd = fds[oomi];
	int r = parse_caps(jget(p, "caps"));
	if (!r)
		r = build_root(p, fds, nfds);
	for (int i = 0; i < nfds; i++)
		if (i != oomi && fds[i] != pids_tasks)
			close(fds[i]);
	if (r)
		return -1;
	no_new_privs = !jbool(jget(p, "allow_setuid"));
	const char *hn = jstr(jget(p, "hostname"));
	if (identify(hn ? hn : "", jbool(jget(p, "cgroup_v2"))) || start_spawner())
		return -1;
	if (no_new_privs && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
		FAILE("setting no_new_privs");
	if (flen) {
		if (flen % sizeof(struct sock_filter) || flen / sizeof(struct sock_filter) > 0xffff)
			FAIL("loading seccomp filter: %zu bytes", flen);
		struct sock_fprog prog = {(unsigned short)(flen / sizeof(struct sock_filter)), (struct sock_filter *)filter};
		// On every thread: the spawner's too.
		if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog))
			FAILE("loading seccomp filter");
	}
	return 0;
}

static int mkdir_all(const char *path) {
	char p[4096];
	snprintf(p, sizeof p, "%s", path);
	for (char *s = p + 1; *s; s++)
		if (*s == '/') {
			*s = 0;
			if (mkdir(p, 0755) && errno != EEXIST)
				return -1;
			*s = '/';
		}
	return mkdir(p, 0755) && errno != EEXIST ? -1 : 0;
}

// activate takes the sandbox's environment and working directory.
static int activate(struct jnode *a) {
	struct jnode *sv = jget(a, "serve");
	struct jnode *env = jget(sv, "env");
	serve_env = xalloc(((size_t)jlen(env) + 2) * sizeof *serve_env);
	int has_hn = 0;
	for (struct jnode *e = env ? env->kids : NULL; e; e = e->next) {
		if (!jstr(e))
			continue;
		serve_env[nserve_env++] = xstrdup(jstr(e));
		has_hn |= !strncmp(jstr(e), "HOSTNAME=", 9);
	}
	if (!has_hn) {
		char hn[300] = "HOSTNAME=";
		if (!gethostname(hn + 9, sizeof hn - 10))
			serve_env[nserve_env++] = xstrdup(hn);
	}
	const char *wd = jstr(jget(sv, "workdir"));
	workdir = xstrdup(wd ? wd : ""); // "": a start without a cwd is the Go guest's to refuse
	// As Go's os.MkdirAll: something there that is not a directory is
	// an error.
	struct stat st;
	if (wd && *wd && (mkdir_all(wd) || stat(wd, &st) || (!S_ISDIR(st.st_mode) && (errno = ENOTDIR))))
		FAIL("creating workdir %s: mkdir %s: %s", wd, wd, errtext(errno));
	long long v = jint(jget(sv, "output_limit"), 0);
	if (v > 0)
		output_limit = v;
	v = jint(jget(sv, "retain"), 0);
	if (v > 0)
		retain = v;
	return 0;
}

int main(void) {
	// Nothing in the sandbox may ptrace us, read our memory or fds, or
	// open /proc/1/exe; our descriptors stay ours.
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	prctl(PR_SET_TIMERSLACK, SANDBOX_SLACK_NS, 0, 0, 0);
	for (int fd = FD_SYNC; fd <= FD_GO; fd++)
		fcntl(fd, F_SETFD, FD_CLOEXEC);
	sigset_t s;
	sigemptyset(&s);
	int fwd[] = {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPWR};
	for (size_t i = 0; i < sizeof fwd / sizeof *fwd; i++)
		sigaddset(&s, fwd[i]);
	sigset_t blocked = s;
	sigaddset(&blocked, SIGPIPE);
	sigprocmask(SIG_BLOCK, &blocked, NULL);
	int sigfd = signalfd(-1, &s, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sigfd < 0) {
		fail_with("", "signalfd: %s", errtext(errno));
		return fail_ready();
	}
	static char buf[1 << 20];
	static int fds[256];
	int nfds, prepared = 0;
	for (;;) {
		size_t len = 0;
		if (recv_config(buf, sizeof buf, fds, &nfds, &len)) {
			for (int i = 0; i < nfds; i++)
				close(fds[i]);
			return fail_ready();
		}
		uint32_t jl = (uint32_t)(unsigned char)buf[0] | (uint32_t)(unsigned char)buf[1] << 8 |
			      (uint32_t)(unsigned char)buf[2] << 16 | (uint32_t)(unsigned char)buf[3] << 24;
		struct jnode *cfg = len >= 4 && jl <= len - 4 ? jparse(buf + 4, jl) : NULL;
		if (!cfg || cfg->t != J_OBJ) {
			fail_with("", "decoding config: %zu-byte packet", len);
			return fail_ready();
		}
		struct jnode *p = jget(cfg, "prepare");
		size_t flen = len - 4 - jl;
		if (p && p->t == J_OBJ) {
			if (prepared)
				fail_with("", "guest is already prepared");
			if (prepared || prepare(p, fds, nfds, (unsigned char *)buf + 4 + jl, flen))
				return fail_ready();
			prepared = 1;
		} else {
			for (int i = 0; i < nfds; i++)
				close(fds[i]);
			if (flen) {
				fail_with("", "decoding config: a seccomp filter without Prepare");
				return fail_ready();
			}
		}
		struct jnode *a = jget(cfg, "activate");
		if (!a || a->t != J_OBJ) {
			jfree(cfg);
			send_ready("{\"phase\":\"prepared\"}");
			continue;
		}
		if (!prepared) {
			fail_with("", "activate before prepare");
			return fail_ready();
		}
		int r = activate(a);
		jfree(cfg);
		if (r)
			return fail_ready();
		send_ready("{\"phase\":\"ready\",\"pid\":1}");
		close(FD_SYNC);
		return serve(sigfd);
	}
}
