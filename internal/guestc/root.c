// The fast guest's Prepare: the sandbox's root filesystem assembled from
// the detached mounts the daemon sent, entered, and the sandbox's
// identity. It does what internal/guest's buildRoot, enterRoot and
// identify do, in the same order and with the same flags (their comments
// say why each step is there): every path is resolved beneath the root
// (openat2 with RESOLVE_IN_ROOT), nothing is joined on the host.
#define _GNU_SOURCE
#include "guest.h"

#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <linux/openat2.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

// glibc's <sys/mount.h> has these since 2.36; musl's has not.
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif
#ifndef MOVE_MOUNT_T_EMPTY_PATH
#define MOVE_MOUNT_T_EMPTY_PATH 0x00000040
#endif

// mount_move is move_mount(2), by its number: musl has no wrapper.
static int mount_move(int from_fd, const char *from, int to_fd, const char *to, unsigned flags) {
	return (int)syscall(SYS_move_mount, from_fd, from, to_fd, to, flags);
}

static int open_in_root(int root, const char *path, int flags) {
	while (*path == '/')
		path++;
	if (!*path)
		path = ".";
	struct open_how how = {.flags = (uint64_t)(O_PATH | O_CLOEXEC | flags), .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
	return (int)syscall(SYS_openat2, root, path, &how, sizeof how);
}

static int mkdir_all_in_root(int root, const char *path) {
	int fd = open_in_root(root, path, 0);
	if (fd >= 0 || errno != ENOENT)
		return fd;
	char buf[4096], prefix[4096] = "";
	snprintf(buf, sizeof buf, "%s", path);
	int cur = open_in_root(root, "/", 0);
	for (char *save = NULL, *p = strtok_r(buf, "/", &save); p; p = strtok_r(NULL, "/", &save)) {
		if (!strcmp(p, ".") || !strcmp(p, "..")) {
			close(cur);
			errno = EINVAL;
			return -1;
		}
		strncat(prefix, "/", sizeof prefix - strlen(prefix) - 1);
		strncat(prefix, p, sizeof prefix - strlen(prefix) - 1);
		int next = open_in_root(root, prefix, 0);
		if (next < 0 && errno == ENOENT) {
			if (mkdirat(cur, p, 0755) && errno != EEXIST) {
				close(cur);
				return -1;
			}
			next = open_in_root(root, prefix, 0);
		}
		close(cur);
		if (next < 0)
			return -1;
		cur = next;
	}
	return cur;
}

static void procpath(char *out, size_t n, int fd) { snprintf(out, n, "/proc/self/fd/%d", fd); }

// target resolves path inside the root, making it (a directory, or an
// empty file with file set) if missing, and returns an O_PATH handle; -1
// with errmsg set.
static int target(int root, const char *path, int file) {
	int h = open_in_root(root, path, O_NOFOLLOW);
	if (h >= 0) {
		struct stat st;
		int ok = !fstat(h, &st);
		if (ok && (st.st_mode & S_IFMT) == (file ? S_IFREG : S_IFDIR))
			return h;
		close(h);
		if (ok && !file && S_ISLNK(st.st_mode))
			return fail_with("invalid_argument", "the image has a symbolic link at %s, where the sandbox mounts a directory; it must be a directory or absent", path);
	}
	if (!file) {
		h = mkdir_all_in_root(root, path);
		if (h < 0 && (errno == ENOTDIR || errno == ENOENT || errno == ELOOP || errno == EXDEV))
			return fail_with("invalid_argument", "the image cannot hold a directory at %s, where the sandbox mounts one: %s", path, errtext(errno));
		if (h < 0)
			return fail_with("", "creating %s: %s", path, errtext(errno));
		return h;
	}
	char dir[4096];
	snprintf(dir, sizeof dir, "%s", path);
	char *slash = strrchr(dir, '/');
	const char *name = path;
	if (slash) {
		*slash = 0;
		name = path + (slash - dir) + 1;
	}
	int d = mkdir_all_in_root(root, dir[0] ? dir : "/");
	if (d < 0)
		return fail_with("", "creating %s: %s", dir[0] ? dir : "/", errtext(errno));
	int fd = openat(d, name, O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_RDONLY, 0644);
	if (fd < 0 && errno == ELOOP && !unlinkat(d, name, 0))
		fd = openat(d, name, O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_RDONLY, 0644);
	int e = errno;
	close(d);
	if (fd < 0 && e != EEXIST)
		return fail_with("", "creating %s: %s", path, errtext(e));
	if (fd >= 0)
		close(fd);
	h = open_in_root(root, path, 0);
	if (h < 0)
		return fail_with("", "opening %s: %s", path, errtext(errno));
	return h;
}

static int mount_in_root(int root, const char *path, const char *src, const char *fs, unsigned long flags, const char *data) {
	int t = target(root, path, 0);
	if (t < 0)
		return -1;
	char p[64];
	procpath(p, sizeof p, t);
	int r = mount(src, p, fs, flags, data);
	close(t);
	if (r)
		FAIL("mounting %s on %s: %s", fs, path, errtext(errno));
	return 0;
}

static int remount_ro(const char *path) {
	unsigned long flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV;
	struct statfs st;
	if (statfs(path, &st))
		return -1;
	if (st.f_flags & ST_NOEXEC) flags |= MS_NOEXEC;
	if (st.f_flags & ST_NOATIME) flags |= MS_NOATIME;
	if (st.f_flags & ST_NODIRATIME) flags |= MS_NODIRATIME;
	if (st.f_flags & ST_RELATIME) flags |= MS_RELATIME;
	return mount("", path, NULL, flags, NULL);
}

static const char *devices[] = {"null", "zero", "full", "random", "urandom", "tty"};

static int build_dev(int root) {
	if (mount_in_root(root, "/dev", "tmpfs", "tmpfs", MS_NOSUID | MS_STRICTATIME, "mode=755,size=65536k"))
		return -1;
	int dev = open_in_root(root, "/dev", 0);
	if (dev < 0)
		FAILE("opening /dev");
	char in[64], p[128];
	procpath(in, sizeof in, dev);
	for (size_t i = 0; i < sizeof devices / sizeof *devices; i++) {
		int fd = openat(dev, devices[i], O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_RDONLY, 0644);
		if (fd < 0)
			FAILE(devices[i]);
		close(fd);
		char src[64];
		snprintf(src, sizeof src, "/dev/%s", devices[i]);
		snprintf(p, sizeof p, "%s/%s", in, devices[i]);
		if (mount(src, p, NULL, MS_BIND, NULL))
			FAILE(src);
	}
	struct { const char *name, *src, *fs; unsigned long flags; const char *data; int optional; } ms[] = {
		{"pts", "devpts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5", 0},
		{"shm", "shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777,size=65536k", 0},
		{"mqueue", "mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, "", 1},
	};
	for (size_t i = 0; i < 3; i++) {
		if (mkdirat(dev, ms[i].name, 0755))
			FAILE(ms[i].name);
		snprintf(p, sizeof p, "%s/%s", in, ms[i].name);
		if (mount(ms[i].src, p, ms[i].fs, ms[i].flags, ms[i].data) && !ms[i].optional)
			FAILE(ms[i].name);
	}
	const char *links[][2] = {{"ptmx", "pts/ptmx"}, {"fd", "/proc/self/fd"}, {"stdin", "/proc/self/fd/0"}, {"stdout", "/proc/self/fd/1"}, {"stderr", "/proc/self/fd/2"}};
	for (size_t i = 0; i < 5; i++)
		if (symlinkat(links[i][1], dev, links[i][0]))
			FAILE(links[i][0]);
	close(dev);
	return 0;
}

static const char *masked[] = {"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap"};
static const char *readonly[] = {"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"};

static int mask(int root) {
	int null = open_in_root(root, "/dev/null", 0);
	if (null < 0)
		FAILE("/dev/null");
	char np[64], hp[64];
	procpath(np, sizeof np, null);
	for (size_t i = 0; i < sizeof masked / sizeof *masked; i++) {
		int h = open_in_root(root, masked[i], 0);
		if (h < 0)
			continue;
		struct stat st;
		fstat(h, &st);
		procpath(hp, sizeof hp, h);
		int r = S_ISDIR(st.st_mode) ? mount("tmpfs", hp, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=0,mode=0555") : mount(np, hp, NULL, MS_BIND, NULL);
		close(h);
		if (r)
			FAILE(masked[i]);
	}
	close(null);
	for (size_t i = 0; i < sizeof readonly / sizeof *readonly; i++) {
		int h = open_in_root(root, readonly[i], 0);
		if (h < 0)
			continue;
		procpath(hp, sizeof hp, h);
		int r = mount(hp, hp, NULL, MS_BIND | MS_REC, NULL);
		close(h);
		if (r)
			FAILE(readonly[i]);
		h = open_in_root(root, readonly[i], 0);
		procpath(hp, sizeof hp, h);
		r = remount_ro(hp);
		close(h);
		if (r)
			FAILE(readonly[i]);
	}
	return 0;
}

static int boot_id(int root) {
	const char *path = "/proc/sys/kernel/random/boot_id";
	int t = open_in_root(root, path, 0);
	if (t < 0)
		return 0;
	int dev = open_in_root(root, "/dev", 0);
	int fd = openat(dev, ".paddock-boot-id", O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0444);
	if (fd < 0)
		FAILE("boot id");
	unsigned char b[16];
	if (getrandom(b, 16, 0) != 16)
		FAILE("getrandom");
	b[6] = (b[6] & 0x0f) | 0x40;
	b[8] = (b[8] & 0x3f) | 0x80;
	char id[64];
	int n = snprintf(id, sizeof id, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n", b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
	if (write(fd, id, n) != n)
		FAILE("boot id");
	char sp[64], tp[64];
	procpath(sp, sizeof sp, fd);
	procpath(tp, sizeof tp, t);
	int r = mount(sp, tp, NULL, MS_BIND, NULL);
	unlinkat(dev, ".paddock-boot-id", 0);
	close(fd);
	close(dev);
	close(t);
	if (r)
		FAILE("binding boot id");
	t = open_in_root(root, path, 0);
	procpath(tp, sizeof tp, t);
	r = remount_ro(tp);
	close(t);
	if (r)
		FAILE("making the boot id read-only");
	return 0;
}

static int enter_root(int root) {
	if (fchdir(root))
		FAILE("entering rootfs");
	if (mount(".", "/", NULL, MS_MOVE, NULL))
		FAILE("moving rootfs");
	if (umount2("/tmp", MNT_DETACH))
		FAILE("detaching staging");
	if (mount("/tmp", "/proc", NULL, MS_BIND, NULL) || mount("/tmp", "/sys", NULL, MS_BIND, NULL))
		FAILE("covering");
	if (chroot("."))
		FAILE("chroot");
	return chdir("/");
}

static int fd_of(struct jnode *m, int *fds, int nfds) {
	long long i = jint(jget(m, "fd"), -1);
	return i >= 0 && i < nfds ? fds[i] : -1;
}

int build_root(struct jnode *p, int *fds, int nfds) {
	if (mount("", "/", NULL, MS_REC | MS_SLAVE, NULL))
		FAILE("slaves");
	if (mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0700,size=64k"))
		FAILE("staging tmpfs");
	char opts[8192] = "lowerdir=";
	struct jnode *layers = jget(p, "layers");
	int i = 0;
	for (struct jnode *l = layers ? layers->kids : NULL; l; l = l->next, i++) {
		char d[64];
		snprintf(d, sizeof d, "/tmp/l%d", i);
		int fd = fd_of(l, fds, nfds);
		if (fd < 0 || mkdir(d, 0700) || mount_move(fd, "", AT_FDCWD, d, MOVE_MOUNT_F_EMPTY_PATH))
			FAIL("layer %d: %s", i, errtext(errno));
		if (i)
			strcat(opts, ":");
		strcat(opts, d);
	}
	int disk = fd_of(jget(p, "disk"), fds, nfds);
	if (disk < 0 || mkdir("/tmp/disk", 0700) || mount_move(disk, "", AT_FDCWD, "/tmp/disk", MOVE_MOUNT_F_EMPTY_PATH))
		FAILE("disk");
	strcat(opts, ",upperdir=/tmp/disk/upper,workdir=/tmp/disk/work,userxattr");
	if (mkdir("/tmp/rootfs", 0755) || mount("overlay", "/tmp/rootfs", "overlay", 0, opts))
		FAILE("overlay");
	int root = open("/tmp/rootfs", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root < 0)
		FAILE("rootfs");
	struct jnode *binds = jget(p, "binds");
	for (struct jnode *b = binds ? binds->kids : NULL; b; b = b->next) {
		const char *dest = jstr(jget(b, "dest"));
		int fd = fd_of(b, fds, nfds);
		if (!dest || fd < 0)
			FAIL("bind without dest or fd");
		int t = target(root, dest, jbool(jget(b, "file")));
		if (t < 0)
			return -1;
		int r = mount_move(fd, "", t, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH);
		close(t);
		if (r)
			FAIL("attaching %s: %s", dest, errtext(errno));
	}
	if (mount_in_root(root, "/proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, ""))
		return -1;
	int netready = jbool(jget(p, "net_ready"));
	if (!netready && mount_in_root(root, "/sys", "sysfs", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, ""))
		return -1;
	if (build_dev(root) || mask(root) || boot_id(root))
		return -1;
	if (!netready) {
		int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		struct ifreq ifr = {0};
		strcpy(ifr.ifr_name, "lo");
		int r = s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr);
		ifr.ifr_flags |= IFF_UP;
		r = r || ioctl(s, SIOCSIFFLAGS, &ifr);
		if (s >= 0)
			close(s);
		if (r)
			FAILE("bringing lo up");
		int f = open("/proc/sys/net/ipv4/ping_group_range", O_WRONLY | O_CLOEXEC);
		if (f < 0 || write(f, "0 65535", 7) != 7)
			FAILE("allowing ICMP echo sockets");
		close(f);
	}
	int r = enter_root(root);
	close(root);
	return r;
}

static int write_file(const char *path, const char *s) {
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -1;
	ssize_t n = write(fd, s, strlen(s));
	close(fd);
	return n == (ssize_t)strlen(s) ? 0 : -1;
}

int identify(const char *hostname, int v2) {
	if (unshare(CLONE_NEWCGROUP))
		FAILE("cgroup ns");
	if (v2) {
		int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
		int r = mount_in_root(root, "/sys/fs/cgroup", "cgroup2", "cgroup2", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "");
		close(root);
		if (r)
			return -1;
	}
	if (sethostname(hostname, strlen(hostname)))
		FAILE("hostname");
	mkdir("/etc", 0755);
	char hosts[1024], hn[300];
	snprintf(hosts, sizeof hosts, "127.0.0.1\tlocalhost %s\n::1\tlocalhost ip6-localhost ip6-loopback %s\n", hostname, hostname);
	if (write_file("/etc/hosts", hosts) && errno != EROFS)
		FAILE("/etc/hosts");
	snprintf(hn, sizeof hn, "%s\n", hostname);
	if (write_file("/etc/hostname", hn) && errno != EROFS)
		FAILE("/etc/hostname");
	return 0;
}

