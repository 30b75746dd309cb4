// Command paddock is the daemon (paddock serve), the CLI (every other verb)
// and, hidden, the guest that runs as PID 1 in each sandbox. Built for
// another system than Linux it is the CLI alone: a client of a daemon
// elsewhere.
package main

import (
	"os"

	"github.com/paddock-dev/paddock/internal/cli"
)

func main() {
	// The guest path must stay light: it runs at every sandbox start.
	if len(os.Args) > 1 {
		runGuest(os.Args[1]) // returns unless the verb is the guest's
	}
	os.Exit(cli.Run(os.Args[1:]))
}
