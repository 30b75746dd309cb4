package gvisor

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackMount: a packed checkpoint, mounted as the kernel reads it,
// holds the files as they were (holes, short and incompressible blocks
// too).
func TestPackMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	dir := t.TempDir()
	noise := make([]byte, sqfsBlock+100)
	for i := range noise {
		noise[i] = byte(i*7919 ^ i>>3*31)
	}
	zeros := make([]byte, 2*sqfsBlock)
	files := map[string][]byte{
		"checkpoint.img": halfHex(100000),
		"pages_meta.img": {},
		"pages.img":      append(append(halfHex(5*sqfsBlock+4096), zeros...), noise...),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(t.TempDir(), packName)
	if err := packDir(context.Background(), dir, []string{"pages.img", "checkpoint.img", "pages_meta.img"}, p); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(p); fi.Size() > int64(len(files["pages.img"]))*6/10 {
		t.Fatalf("packed into %d bytes", fi.Size())
	}
	mnt := filepath.Join(t.TempDir(), "open")
	if err := mountPack(context.Background(), p, mnt); err != nil {
		t.Fatal(err)
	}
	defer unmountPack(mnt)
	for name, b := range files {
		got, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s read back differs (%d bytes, want %d; %v)", name, len(got), len(b), err)
		}
	}
	ents, _ := os.ReadDir(mnt)
	if len(ents) != 3 {
		t.Fatalf("the image lists %d files", len(ents))
	}
}

// TestPackDamage: a truncated or corrupt pack fails its check, and says
// why.
func TestPackDamage(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pages.img"), halfHex(3*sumChunk), 0o600); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), packName)
	if err := packDir(context.Background(), dir, []string{"pages.img"}, p); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkPack(context.Background(), p); err != nil {
		t.Fatalf("a good pack: %v", err)
	}
	flip := func(at int) []byte {
		b := bytes.Clone(good)
		b[at] ^= 0x5a
		return b
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"truncated", good[:len(good)/2], "truncated"},
		{"truncated trailer", good[:len(good)-3], "truncated"},
		{"corrupt block", flip(len(good) / 3), "checksum"},
		{"corrupt superblock", flip(10), "checksum"},
		{"corrupt trailer", flip(len(good) - 12), "trailer"},
		{"empty", nil, "too short"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := filepath.Join(t.TempDir(), packName)
			if err := os.WriteFile(bad, tc.b, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := checkPack(context.Background(), bad)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("checking a %s pack: %v; want it to say %q", tc.name, err, tc.want)
			}
		})
	}
}
