// Package guestbin holds the slim guest binary (cmd/paddock-guest) and the
// fast guest (internal/guestc) inside the paddock binary, so that users
// install one file. make build builds
// the guest into this directory first (the file paddock-guest, ignored by
// git) and then paddock with the embedguest tag. A build without the tag
// (go build, go test, go vet, the macOS client) embeds nothing, and the
// daemon runs its own binary's guest verbs instead.
package guestbin

import (
	"bytes"
	"io"
	"os"
)

// Binary returns the embedded guest binary, or nil when this build
// embeds none.
func Binary() []byte { return binary }

// Fast returns the embedded fast guest (internal/guestc: PID 1 in C,
// which hands over to the guest binary for what it does not serve), or
// nil when this build embeds none.
func Fast() []byte { return fast }

// Embedded reports whether this build embeds the guest.
func Embedded() bool { return len(binary) > 0 }

// Open returns the guest binary a runtime runs: the file at path; when
// path is empty, the one this build embeds, or else the running binary.
func Open(path string) (io.ReadCloser, error) {
	if path == "" && Embedded() {
		return io.NopCloser(bytes.NewReader(binary)), nil
	}
	if path == "" {
		path = "/proc/self/exe"
	}
	return os.Open(path)
}
