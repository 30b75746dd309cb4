// Package guestbin holds the slim guest binary (cmd/paddock-guest) inside
// the paddock binary, so that users install one file. make build builds
// the guest into this directory first (the file paddock-guest, ignored by
// git) and then paddock with the embedguest tag. A build without the tag
// (go build, go test, go vet, the macOS client) embeds nothing, and the
// daemon runs its own binary's guest verbs instead.
package guestbin

// Binary returns the embedded guest binary, or nil when this build
// embeds none.
func Binary() []byte { return binary }

// Embedded reports whether this build embeds the guest.
func Embedded() bool { return len(binary) > 0 }
