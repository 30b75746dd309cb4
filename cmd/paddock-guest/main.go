//go:build linux

// Command paddock-guest is the slim binary each sandbox runs as PID 1
// (`paddock-guest guest`). It holds the guest's packages and nothing of
// the daemon's or the CLI's, so a guest starts in a fraction
// of the full binary's time and memory. make build builds it first and
// embeds it in paddock (internal/guestbin), which still installs as one
// file; the daemon runs it from a sealed memfd, never from a path.
package main

import (
	"fmt"
	"os"

	"github.com/paddock-dev/paddock/internal/guestmain"
)

func main() {
	if len(os.Args) > 1 {
		guestmain.Main(os.Args[1]) // returns unless the verb is the guest's
	}
	fmt.Fprintln(os.Stderr, "paddock-guest: the paddock daemon starts this binary; it has no verbs for people")
	os.Exit(2)
}
