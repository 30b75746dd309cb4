package oci

import (
	"archive/tar"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// benchImage builds an image of about 50 MB of file content: 5 layers of
// 100 files of 100 KiB, each half random bytes and half text, so that gzip
// shrinks it about as much as it does real binaries and libraries.
func benchImage(b *testing.B) (v1.Image, int64) {
	b.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	text := []byte(strings.Repeat("the quick brown fox jumps over the lazy sandbox; ", 2000))
	var layers []v1.Layer
	var total int64
	for l := range 5 {
		var hdrs []*tar.Header
		var data [][]byte
		hdrs = append(hdrs, &tar.Header{Name: fmt.Sprintf("opt/l%d/", l), Typeflag: tar.TypeDir, Mode: 0o755, ModTime: fixtureTime})
		data = append(data, nil)
		for f := range 100 {
			content := make([]byte, 100<<10)
			for i := 0; i < len(content)/2; i += 8 {
				v := rng.Uint64()
				for j := 0; j < 8; j++ {
					content[i+j] = byte(v >> (8 * j))
				}
			}
			copy(content[len(content)/2:], text)
			hdrs = append(hdrs, &tar.Header{Name: fmt.Sprintf("opt/l%d/f%03d", l, f), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(content)), ModTime: fixtureTime})
			data = append(data, content)
			total += int64(len(content))
		}
		layers = append(layers, tarLayer(b, writeTar(b, hdrs, data)))
	}
	return testImage(b, layers...), total
}

// BenchmarkPull measures a pull of a ~50 MB image from the loopback
// registry into an empty store: fetch, digest checks, gunzip, unpack,
// syncfs and rename, layers in parallel.
func BenchmarkPull(b *testing.B) {
	needRoot(b)
	img, total := benchImage(b)
	reg := newRegistry(b)
	ref := reg.push(b, "bench/big:v1", img)
	var compressed int64
	ls, _ := img.Layers()
	for _, l := range ls {
		n, _ := l.Size()
		compressed += n
	}
	b.Logf("image: %d layers, %.1f MB of files, %.1f MB compressed", len(ls), float64(total)/1e6, float64(compressed)/1e6)
	b.SetBytes(total)
	root := b.TempDir()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		dir := filepath.Join(root, fmt.Sprint(i))
		s, err := Open(dir, testLogger(b))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.Pull(context.Background(), ref, insecure); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		s.Close()
		os.RemoveAll(dir)
		b.StartTimer()
	}
}
