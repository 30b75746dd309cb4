package gvisor

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// squeezeFile compresses src into dst, a new file (synced), on every
// core, as checkpoints were squeezed file by file before packs: the
// tests make such checkpoints with it.
func squeezeFile(ctx context.Context, src, dst string) (retErr error) {
	enc, _, err := coders()
	if err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := createNew(dst)
	if err != nil {
		return err
	}
	defer closeNew(out, &retErr)
	size := fi.Size()
	frames := int((size + squeezeChunk - 1) / squeezeChunk)
	index := make([]byte, 0, 4*frames+20)
	write := func(b []byte) error {
		_, err := out.Write(b)
		index = binary.LittleEndian.AppendUint32(index, uint32(len(b)))
		return err
	}
	err = compressBlocks(ctx, in, squeezeChunk, enc.EncodeAll, func(b []byte, raw int) error {
		if b == nil {
			b = enc.EncodeAll(make([]byte, raw), nil)
		}
		return write(b)
	}, func(b []byte) error { return write(enc.EncodeAll(b, nil)) })
	if err != nil {
		return err
	}
	index = binary.LittleEndian.AppendUint64(index, uint64(size))
	index = binary.LittleEndian.AppendUint32(index, squeezeChunk)
	index = binary.LittleEndian.AppendUint32(index, uint32(frames))
	index = binary.LittleEndian.AppendUint32(index, squeezeMagic)
	head := binary.LittleEndian.AppendUint32(nil, skippableMagic)
	head = binary.LittleEndian.AppendUint32(head, uint32(len(index)))
	if _, err := out.Write(append(head, index...)); err != nil {
		return err
	}
	return out.Sync()
}

// halfHex is n bytes of text with 4 bits of entropy a byte, a zero run
// in its middle.
func halfHex(n int) []byte {
	b := make([]byte, n)
	r := make([]byte, n/2)
	rand.Read(r)
	hex.Encode(b, r)
	if n > 2*squeezeChunk {
		clear(b[n/3 : n/3+squeezeChunk])
	}
	return b
}

func TestSqueezeRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 4096, squeezeChunk, 3*squeezeChunk + 12345} {
		dir := t.TempDir()
		orig := halfHex(n)
		src, sq, back := filepath.Join(dir, "pages.img"), filepath.Join(dir, "pages.img.zst"), filepath.Join(dir, "back")
		if err := os.WriteFile(src, orig, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := squeezeFile(context.Background(), src, sq); err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if err := expandFile(context.Background(), sq, back); err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		got, err := os.ReadFile(back)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, orig) {
			t.Fatalf("%d bytes: the expansion differs", n)
		}
		if fi, _ := os.Stat(sq); n > squeezeChunk && fi.Size() > int64(n)*6/10 {
			t.Fatalf("%d bytes squeezed into %d", n, fi.Size())
		}
	}
}

// TestSqueezeDamage: a truncated or corrupt squeezed file does not
// expand, and says why; nothing is left at the destination.
func TestSqueezeDamage(t *testing.T) {
	dir := t.TempDir()
	src, sq := filepath.Join(dir, "pages.img"), filepath.Join(dir, "pages.img.zst")
	if err := os.WriteFile(src, halfHex(3*squeezeChunk), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := squeezeFile(context.Background(), src, sq); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(sq)
	if err != nil {
		t.Fatal(err)
	}
	flip := func(at int) []byte {
		b := bytes.Clone(good)
		for i := at; i < min(at+16, len(b)); i++ {
			b[i] ^= 0x5a
		}
		return b
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"truncated", good[:len(good)/2], "truncated"},
		{"truncated index", good[:len(good)-3], "truncated"},
		{"corrupt frame", flip(len(good) / 3), "frame"},
		{"corrupt index", flip(len(good) - 30), "index"},
		{"empty", nil, "too short"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad, back := filepath.Join(t.TempDir(), "bad.zst"), filepath.Join(t.TempDir(), "back")
			if err := os.WriteFile(bad, tc.b, 0o600); err != nil {
				t.Fatal(err)
			}
			err := expandFile(context.Background(), bad, back)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("expanding a %s file: %v; want it to say %q", tc.name, err, tc.want)
			}
			if _, err := os.Stat(back); !os.IsNotExist(err) {
				t.Fatalf("a failed expansion left its destination: %v", err)
			}
		})
	}
}

// TestSqueezeDirPlan: a checkpoint directory is planned from whatever
// its files are: uncompressed, packed (squeezeDir), or squeezed file by
// file (before packs); a file left uncompressed by an earlier boot is
// refused.
func TestSqueezeDirPlan(t *testing.T) {
	dir := t.TempDir()
	files := map[string][]byte{"checkpoint.img": halfHex(100000), "pages_meta.img": halfHex(5000), "pages.img": halfHex(2*squeezeChunk + 4096)}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeBootID(dir); err != nil {
		t.Fatal(err)
	}
	p, err := planImage(dir)
	if err != nil || p.squeezed() || p.packed || len(p.raw) != 3 || !p.pages {
		t.Fatalf("an uncompressed checkpoint's plan: %+v, %v", p, err)
	}
	if err := squeezeDir(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	p, err = planImage(dir)
	if err != nil || !p.packed || !p.pages {
		t.Fatalf("a packed checkpoint's plan: %+v, %v", p, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Fatalf("a packed checkpoint's directory holds %d files, want the pack and the boot id", len(ents))
	}

	// Squeezed file by file, as before packs.
	old := t.TempDir()
	for name, b := range files {
		raw := filepath.Join(old, name)
		if err := os.WriteFile(raw, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := squeezeFile(context.Background(), raw, raw+squeezedExt); err != nil {
			t.Fatal(err)
		}
		os.Remove(raw)
	}
	os.WriteFile(filepath.Join(old, bootName), []byte("another boot\n"), 0o600)
	p, err = planImage(old)
	if err != nil || len(p.zst) != 3 || len(p.raw) != 0 {
		t.Fatalf("a checkpoint squeezed file by file: %+v, %v", p, err)
	}
	if err := squeezeDir(context.Background(), old); err != nil {
		t.Fatalf("squeezing again one squeezed file by file: %v", err)
	}
	out := filepath.Join(t.TempDir(), "open")
	if err := p.expand(context.Background(), out); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		got, err := os.ReadFile(filepath.Join(out, name))
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s expanded differs (%v)", name, err)
		}
	}
	// An uncompressed file of another boot, beside nothing squeezed.
	os.Remove(filepath.Join(old, "pages.img.zst"))
	os.WriteFile(filepath.Join(old, "pages.img"), files["pages.img"], 0o600)
	if _, err := planImage(old); err == nil || !strings.Contains(err.Error(), "host restarted") {
		t.Fatalf("an uncompressed file of another boot: %v", err)
	}
}

// TestSqueezeAfterStop: a checkpoint's squeezer starts once Stop hands
// it the rest of the sandbox's stop, runs that first, and reports the
// squeezed size; one stopped before the hand-over reports nothing and
// takes none, so that the stop is whole where it happens.
func TestSqueezeAfterStop(t *testing.T) {
	r := &Runtime{cfg: Config{RunDir: t.TempDir()}, log: slog.New(slog.DiscardHandler), squeezers: map[string]*squeezer{}}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pages.img"), halfHex(2*squeezeChunk), 0o600); err != nil {
		t.Fatal(err)
	}
	report := r.squeezeLater("a", dir, nil)
	time.Sleep(20 * time.Millisecond)
	if _, err := os.Stat(filepath.Join(dir, "pages.img")); err != nil {
		t.Fatalf("squeezed before the stop was handed over: %v", err)
	}
	ran := false
	if !r.handOver("a", func() { ran = true }) {
		t.Fatal("no squeezer took the rest of the stop")
	}
	n, ok := <-report
	if !ok || n <= 0 || !ran {
		t.Fatalf("report %d %v, the rest of the stop ran: %v", n, ok, ran)
	}
	if _, err := os.Stat(filepath.Join(dir, packName)); err != nil {
		t.Fatal(err)
	}
	if r.handOver("a", func() {}) {
		t.Fatal("a finished squeezer took a stop")
	}

	report = r.squeezeLater("b", t.TempDir(), nil)
	r.stopSqueezing("b")
	if n, ok := <-report; ok {
		t.Fatalf("a squeezer stopped before its sandbox reported %d", n)
	}
	if r.handOver("b", func() {}) {
		t.Fatal("a stopped squeezer took a stop")
	}
}
