// Package load installs a compiled seccomp program (internal/seccomp's
// Compile) with a bare seccomp(2) call. It is apart from the compiler so
// that the guest, which only installs the program the daemon compiled,
// links neither libseccomp nor cgo.
package load
