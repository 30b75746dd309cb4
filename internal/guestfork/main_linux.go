package guestfork

import (
	"fmt"
	"os"

	"github.com/paddock-dev/paddock/internal/guest"
)

// The hidden verbs the daemon starts its guest binary with.
const (
	GuestVerb  = "guest"        // PID 1 of a sandbox
	ForkerVerb = "guest-forker" // the forker
)

// Main runs verb if it is one of the guest binary's and exits; any other
// verb returns.
func Main(verb string) {
	switch verb {
	case GuestVerb:
		err := guest.Run()
		fmt.Fprintln(os.Stderr, "paddock guest:", err)
		os.Exit(1)
	case ForkerVerb:
		if err := Run(); err != nil {
			fmt.Fprintln(os.Stderr, "paddock guest-forker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}
