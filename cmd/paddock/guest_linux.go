package main

import "github.com/paddock-dev/paddock/internal/guestmain"

// runGuest runs the hidden verbs a sandbox's start execs (the guest, PID
// 1, and the warm guests' forker) and exits; any other verb returns. They
// run from this binary only in a build that embeds no slim guest
// (internal/guestbin).
func runGuest(verb string) { guestmain.Main(verb) }
