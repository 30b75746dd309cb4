// Package guestfork is the forker: the helper process that forks each
// guest (`guest`) into its fresh namespaces and execs it from the sealed
// guest binary, apart from the daemon. It is written in C
// (forker_linux.c) and runs from the daemon's own binary (`guest-forker`):
// a constructor takes the process before the Go runtime starts, so the
// forker is one thread with a few pages of memory, which is what makes
// each fork cheap. The Go side holds what the daemon and the guest binary
// share with it: the verbs, the descriptors' order, the request and reply.
//
// The daemon's end of the forker (starting it, sending it requests) is in
// internal/runtime/native.
package guestfork
