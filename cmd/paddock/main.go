// Command paddock is the daemon (paddock serve), the CLI (every other verb)
// and, hidden, the guest that runs as PID 1 in each sandbox.
package main

import (
	"fmt"
	"os"

	"github.com/paddock-dev/paddock/internal/cli"
	"github.com/paddock-dev/paddock/internal/guest"
	"github.com/paddock-dev/paddock/internal/runtime/native"
)

func main() {
	// The guest path must stay light: it runs at every sandbox start.
	if len(os.Args) > 1 && os.Args[1] == "guest" {
		err := guest.Run()
		fmt.Fprintln(os.Stderr, "paddock guest:", err)
		os.Exit(1)
	}
	if len(os.Args) > 1 && os.Args[1] == "guest-forker" {
		if err := native.RunForker(); err != nil {
			fmt.Fprintln(os.Stderr, "paddock guest-forker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(cli.Run(os.Args[1:]))
}
