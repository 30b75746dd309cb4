//go:build embedguest

package guestbin

import _ "embed"

//go:embed paddock-guest
var binary []byte

//go:embed paddock-guest-fast
var fast []byte
