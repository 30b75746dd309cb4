package disk

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// FuzzDropUnread runs trimCopy (the journal's and the free blocks'
// trimming) over arbitrary bytes where an image's metadata would be (the
// start of a 16 MiB file): it may not panic, grow the file or hang,
// whatever the superblock, group descriptors, journal inode or bitmaps
// say.
func FuzzDropUnread(f *testing.F) {
	const size = 16 << 20
	if mkfs, err := findMkfs(""); err == nil {
		img := filepath.Join(f.TempDir(), "seed.img")
		if err := os.WriteFile(img, nil, 0o600); err != nil {
			f.Fatal(err)
		}
		if err := os.Truncate(img, size); err != nil {
			f.Fatal(err)
		}
		if out, err := exec.Command(mkfs, append(append([]string{}, mkfsArgs...), img)...).CombinedOutput(); err != nil {
			f.Fatalf("%v: %s", err, out)
		}
		b, err := os.ReadFile(img)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[:16<<10])
	}
	f.Add(make([]byte, 4096))
	f.Fuzz(func(t *testing.T, head []byte) {
		if len(head) > 64<<10 {
			return
		}
		img, err := os.Create(filepath.Join(t.TempDir(), "img"))
		if err != nil {
			t.Fatal(err)
		}
		defer img.Close()
		if err := img.Truncate(size); err != nil {
			t.Fatal(err)
		}
		if _, err := img.WriteAt(head, 0); err != nil {
			t.Fatal(err)
		}
		trimCopy(img)
		if fi, err := img.Stat(); err != nil || fi.Size() != size {
			t.Fatalf("image is %v bytes (%v), want %d", fi.Size(), err, size)
		}
	})
}
