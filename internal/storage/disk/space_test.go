package disk

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// TestAllocatedDisks: with an overcommit of 1 a disk's image is allocated
// when it is made, and so are the blocks of the substrate's image on the
// host under it; a disk the substrate cannot back is refused with
// ErrUnavailable naming the disk, and Space says how much is left.
func TestAllocatedDisks(t *testing.T) {
	s := testSubstrate(t, SubstrateOptions{Size: 400 << 20})
	p := substratePool(t, s, Config{Overcommit: 1})
	hostBefore := allocated(t, s.image)
	v := acquire(t, p, "a", 200<<20)
	img := filepath.Join(filepath.Dir(v.Path), imageName)
	if got := allocated(t, img); got < v.Size {
		t.Errorf("image allocates %d bytes of its %d", got, v.Size)
	}
	// Less what the host had allocated there already (a few KiB).
	if grew := allocated(t, s.image) - hostBefore; grew < v.Size-(1<<20) {
		t.Errorf("the substrate's image on the host grew by %d bytes for a disk of %d", grew, v.Size)
	}
	sp, err := p.Space()
	if err != nil {
		t.Fatal(err)
	}
	// Promised: only the few blocks it shares with its pristine image
	// (what mkfs wrote), which it would need anew to rewrite.
	if sp.Free >= 200<<20 || sp.Free <= 0 || sp.Promised > v.Size/100 || sp.Short != 0 || sp.Overcommit != 1 {
		t.Errorf("Space = %+v, want under 200 MiB free and at most 1%% of the disk promised", sp)
	}
	_, err = p.Acquire(context.Background(), "b", 200<<20, 1000, 1000)
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "disk: 200 MiB requested") {
		t.Errorf("a second disk of 200 MiB: %v, want ErrUnavailable naming the disk", err)
	}
	if ids, _ := p.List(); len(ids) != 1 {
		t.Errorf("disks after the refusal: %v", ids)
	}
	// A snapshot by reflink makes the disk's blocks shared: each is one it
	// needs anew when it rewrites it.
	acquire(t, p, "s", 32<<20)
	writeFile(t, filepath.Join(v.Path, "data"), 64<<20)
	writeFile(t, filepath.Join(filepath.Dir(filepath.Dir(v.Path)), "s", rootName, "data"), 24<<20)
	noPause := func() (func(), error) { return func() {}, nil }
	if _, err := p.Snapshot(context.Background(), "a", filepath.Join(s.Dir(), "a.img"), noPause); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a snapshot sharing 64 MiB with %d MiB free: %v, want ErrUnavailable", sp.Free>>20, err)
	}
	if _, err := p.Snapshot(context.Background(), "s", filepath.Join(s.Dir(), "s.img"), noPause); err != nil {
		t.Fatalf("a snapshot sharing 24 MiB: %v", err)
	}
	if sp, err := p.Space(); err != nil || sp.Promised < 24<<20 {
		t.Errorf("Space after a snapshot = %+v, %v; want the shared 24 MiB promised", sp, err)
	}
	if _, err := p.Acquire(context.Background(), "t", 32<<20, 1000, 1000); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "promised") {
		t.Errorf("a disk that would leave the shared blocks no room: %v, want ErrUnavailable naming what is promised", err)
	}
	// Thin, the same disk is admitted and promised.
	thin := newTestPool(t, Config{Dir: filepath.Join(s.Dir(), "thin"), Substrate: s, Overcommit: 50})
	acquire(t, thin, "c", 200<<20)
	if sp, err := thin.Space(); err != nil || sp.Promised < 200<<20 {
		t.Errorf("thin Space = %+v, %v; want its disk promised", sp, err)
	}
}

// BenchmarkAllocate measures what allocating a 10 GiB disk adds to making
// it (mkfs, loop device, mount), on the host's filesystem and on an XFS
// substrate.
func BenchmarkAllocate(b *testing.B) {
	for _, xfs := range []bool{false, true} {
		for _, overcommit := range []float64{100, 1} {
			name := map[bool]string{false: "host", true: "xfs"}[xfs] + map[float64]string{100: "/thin", 1: "/allocated"}[overcommit]
			b.Run(name, func(b *testing.B) {
				var p *Pool
				if xfs {
					p = substratePool(b, testSubstrate(b, SubstrateOptions{Size: 16 << 30}), Config{Overcommit: overcommit, DefaultSize: DefaultSize})
				} else {
					p = newTestPool(b, Config{Overcommit: overcommit, DefaultSize: DefaultSize})
				}
				var made time.Duration
				for i := 0; b.Loop(); i++ {
					t0 := time.Now()
					acquire(b, p, "bench", 0)
					made += time.Since(t0)
					if err := p.Remove(context.Background(), "bench"); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(made.Microseconds())/float64(b.N)/1000, "ms/make")
			})
		}
	}
}
