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
	if sp.Free >= 200<<20 || sp.Free <= 0 || sp.Promised != 0 || sp.Short != 0 || sp.Overcommit != 1 {
		t.Errorf("Space = %+v, want under 200 MiB free and nothing promised", sp)
	}
	_, err = p.Acquire(context.Background(), "b", 200<<20, 1000, 1000)
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "disk: 200 MiB requested") {
		t.Errorf("a second disk of 200 MiB: %v, want ErrUnavailable naming the disk", err)
	}
	if ids, _ := p.List(); len(ids) != 1 {
		t.Errorf("disks after the refusal: %v", ids)
	}
	// Thin, the same disk is admitted and promised.
	thin := newTestPool(t, Config{Dir: filepath.Join(s.Dir(), "thin"), Substrate: s, Overcommit: 4})
	acquire(t, thin, "c", 200<<20)
	if sp, err := thin.Space(); err != nil || sp.Promised < 150<<20 {
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
