// Package seccomp owns the sandbox syscall filter: Docker's default profile
// compiled to a classic BPF program, and installing that program.
//
// The daemon compiles once at start (Compile, which uses moby's profile and
// libseccomp) and hands the program bytes to every sandbox's PID 1, which
// installs them with internal/seccomp/load: a bare seccomp(2) call, so the
// sandbox side never links libseccomp. The package is Linux-only; elsewhere it is empty.
package seccomp
