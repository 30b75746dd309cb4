package main

import (
	"strings"

	"github.com/paddock-dev/paddock/internal/storage/image"
)

// peerEnv is the environment of the peers' `echo hi` (bwrap's, runc's,
// runsc's, the host's bare fork/exec): the one the host image gives a
// sandbox's process (PATH, LANG=C.UTF-8), so that each runs the same work
// whatever the bench's own environment holds (a UTF-8 LANG has echo load
// the locale's files: 24 opens, about a fifth of its cost here).
func peerEnv() []string { return image.DefaultEnv("/") }

// bwrapArgv is bubblewrap running cmd in a sandbox comparable to a paddock
// sandbox on the host image: every namespace bwrap can unshare (user, pid,
// net, ipc, uts, cgroup, mount), the host's /usr read-only with the usual
// symlinks, a fresh /proc, a minimal /dev and a private /tmp, and the
// environment a sandbox's process gets (peerEnv).
func bwrapArgv(bwrap string, cmd ...string) []string {
	argv := []string{bwrap, "--clearenv"}
	for _, kv := range peerEnv() {
		k, v, _ := strings.Cut(kv, "=")
		argv = append(argv, "--setenv", k, v)
	}
	argv = append(argv,
		"--unshare-all",
		"--die-with-parent",
		"--ro-bind", "/usr", "/usr",
		"--symlink", "usr/bin", "/bin",
		"--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64",
		"--symlink", "usr/sbin", "/sbin",
		"--proc", "/proc",
		"--dev", "/dev",
		"--tmpfs", "/tmp",
		"--",
	)
	return append(argv, cmd...)
}
