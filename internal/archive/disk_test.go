package archive

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/paddock-dev/paddock/internal/sparse"
)

// sparseImage makes a file of size bytes with data at the given offsets.
func sparseImage(t *testing.T, size int64, at ...int64) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for _, off := range at {
		b := make([]byte, 100<<10)
		rand.Read(b)
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func encode(t *testing.T, f *os.File) []byte {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	ex, err := sparse.Extents(f, fi.Size())
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := writeDisk(&buf, f, fi.Size(), ex); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestDiskStreamRoundTrip(t *testing.T) {
	const size = 64 << 20
	src := sparseImage(t, size, 0, 5<<20, size-(100<<10))
	stream := encode(t, src)
	if len(stream) > 1<<20 {
		t.Fatalf("the stream of 300 KiB of data is %d bytes: holes travelled", len(stream))
	}
	dst, err := os.Create(filepath.Join(t.TempDir(), "restored.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if err := ReadDisk(bytes.NewReader(stream), dst, size); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(src.Name())
	got, _ := os.ReadFile(dst.Name())
	if !bytes.Equal(want, got) {
		t.Fatal("the restored image differs from the archived one")
	}
	ex, err := sparse.Extents(dst, size)
	if err != nil {
		t.Fatal(err)
	}
	if n := sparse.Bytes(ex); n > 1<<20 {
		t.Errorf("the restored image holds %d bytes of data: its holes were filled", n)
	}
}

func TestDiskStreamRefusesDamage(t *testing.T) {
	const size = 8 << 20
	stream := encode(t, sparseImage(t, size, 1<<20))
	flipped := bytes.Clone(stream)
	flipped[len(flipped)/2] ^= 0xff
	for _, tc := range []struct {
		name   string
		stream []byte
		size   int64
	}{
		{"truncated", stream[:len(stream)/2], size},
		{"one byte short", stream[:len(stream)-1], size},
		{"flipped byte", flipped, size},
		{"empty", nil, size},
		{"not zstd", bytes.Repeat([]byte("x"), 4096), size},
		{"other size", stream, size * 2},
		{"trailing bytes", append(bytes.Clone(stream), stream...), size},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst, err := os.Create(filepath.Join(t.TempDir(), "restored.img"))
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Close()
			if err := ReadDisk(bytes.NewReader(tc.stream), dst, tc.size); err == nil {
				t.Fatal("a damaged stream was taken")
			} else {
				t.Log(err)
			}
		})
	}
}
