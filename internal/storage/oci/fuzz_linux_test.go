package oci

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/tartest"
)

// FuzzUnpackLayer: whatever a layer's tar says (names, links, hard links,
// whiteouts, xattrs, devices, sizes), unpacking it makes nothing outside
// the layer's directory and stays within the limits. Inputs are tartest
// scripts. It needs root (the unpacker sets owners and makes device
// nodes) and skips without.
func FuzzUnpackLayer(f *testing.F) {
	for _, s := range []string{
		"d a/\nf a/f x\nl a/l /etc/passwd\nh a/h a/f",
		"l l /\nf l/evil x",
		"l l ../../outside\nf l/evil x",
		"h h ../outside/secret",
		"f ../evil x",
		"f .wh.a\nf d/.wh..wh..opq",
		"d d/\nl d /tmp\nf d/evil x",
		"x x security.capability=bad",
		"x x trusted.overlay.opaque=y",
		"c c",
		"f big 1048577",
		"f a 600000\nf b 600000",
		"s sparse 1099511627776",
	} {
		f.Add(s)
	}
	needRoot(f)
	o := tartest.NewOutside(f)
	lim := Limits{MaxLayerSize: 1 << 20, MaxImageSize: 1 << 20, MaxEntries: 1000, MaxXattrSize: 4096}
	log := slog.New(slog.DiscardHandler)
	f.Fuzz(func(t *testing.T, script string) {
		defer o.Check(t, "layer")
		dest, err := os.MkdirTemp(o.Base, "layer")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dest)
		root, err := unix.Open(dest, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(root)
		var left atomic.Int64
		left.Store(lim.MaxImageSize)
		a := newApplier(root, lim, &left, log)
		a.apply(context.Background(), bytes.NewReader(tartest.Script(script)))
		if n := tartest.FileBytes(dest); n > lim.MaxLayerSize {
			t.Fatalf("unpacked %d bytes of files, past the %d-byte limit", n, lim.MaxLayerSize)
		}
	})
}
