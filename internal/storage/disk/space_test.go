package disk

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// TestAllocatedDisks: with an overcommit of 1 a disk's image is allocated
// when it is handed out, and so are the blocks of the substrate's image on the
// host under it; a disk the substrate cannot back is refused with
// ErrUnavailable naming the disk, and Space says how much is left.
func TestAllocatedDisks(t *testing.T) {
	s := testSubstrate(t, SubstrateOptions{Size: 400 << 20})
	p := substratePool(t, s, Config{Overcommit: 1})
	hostBefore := allocated(t, s.image)
	v := acquire(t, p, "a", 200<<20)
	p.backer.wait()
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

// TestPoolHoldsNoBlocks: with an overcommit of 1 the ready disks of the
// pool hold no blocks (they are promised to nobody), a disk is allocated
// when it is handed out, on the substrate and on the host below it, and
// the pool keeps only as many ready disks as the storage could back.
func TestPoolHoldsNoBlocks(t *testing.T) {
	s := testSubstrate(t, SubstrateOptions{Size: 600 << 20})
	const size = 128 << 20
	hostBefore := allocated(t, s.image)
	p := substratePool(t, s, Config{Overcommit: 1, DefaultSize: size, PoolSize: 8})
	room, err := p.room()
	if err != nil {
		t.Fatal(err)
	}
	fit := int(room / size)
	if fit < 2 || fit >= 8 {
		t.Fatalf("room for %d disks of %d MiB (%d MiB), want 2 to 7 for this test", fit, size>>20, room>>20)
	}
	waitReady(t, p, fit)
	// Given time, the refill makes no more than the storage could back.
	time.Sleep(2 * spaceRetry)
	if n := p.Ready(); n != fit {
		t.Errorf("%d ready disks with room for %d", n, fit)
	}
	// Each ready disk holds what its pristine image shares with it: a few
	// MiB of ext4 metadata, not its size.
	if grew := allocated(t, s.image) - hostBefore; grew > int64(fit)*size/4 {
		t.Errorf("the host allocated %d MiB under %d ready disks of %d MiB", grew>>20, fit, size>>20)
	}
	if sp, err := p.Space(); err != nil || sp.Promised != 0 {
		t.Errorf("Space with only ready disks = %+v, %v; want nothing promised", sp, err)
	}
	hostBefore = allocated(t, s.image)
	v := acquire(t, p, "a", 0)
	p.backer.wait()
	img := filepath.Join(filepath.Dir(v.Path), imageName)
	if got := allocated(t, img); got < v.Size {
		t.Errorf("handed out, the image allocates %d bytes of its %d", got, v.Size)
	}
	if grew := allocated(t, s.image) - hostBefore; grew < v.Size-(8<<20) {
		t.Errorf("the host allocated %d MiB for a disk of %d MiB handed out", grew>>20, v.Size>>20)
	}
	// A disk made ahead (a warm guest's) is admitted, and promised, but
	// allocated only once Rename gives it to its sandbox.
	w := acquireAhead(t, p, "warm-1")
	p.backer.wait()
	wimg := filepath.Join(filepath.Dir(w.Path), imageName)
	if got := allocated(t, wimg); got > w.Size/4 {
		t.Errorf("made ahead, the image allocates %d bytes of its %d", got, w.Size)
	}
	if sp, err := p.Space(); err != nil || sp.Promised < w.Size*3/4 {
		t.Errorf("Space with a disk made ahead = %+v, %v; want it promised", sp, err)
	}
	if err := p.Rename("warm-1", "b"); err != nil {
		t.Fatal(err)
	}
	p.backer.wait()
	if got := allocated(t, filepath.Join(p.volDir, "b", imageName)); got < w.Size {
		t.Errorf("given to its sandbox, the image allocates %d bytes of its %d", got, w.Size)
	}
	// The disk holds what was promised: written to its cap, it fails
	// with ENOSPC from its own filesystem, not from the storage below.
	if err := fillFile(filepath.Join(v.Path, "fill")); !errors.Is(err, unix.ENOSPC) {
		t.Errorf("filling the disk: %v, want ENOSPC", err)
	}
	if used, cap, err := v.Usage(); err != nil || used < cap*9/10 {
		t.Errorf("disk usage after filling: %d of %d, %v", used, cap, err)
	}
}

func acquireAhead(t *testing.T, p *Pool, id string) *Volume {
	t.Helper()
	v, err := p.AcquireAhead(context.Background(), id, 0, 1000, 1000)
	if err != nil {
		t.Fatalf("AcquireAhead(%q): %v", id, err)
	}
	return v
}

// fillFile writes zeros to path until a write fails, syncs and returns
// the error that stopped it.
func fillFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			f.Sync()
			return err
		}
	}
}

// TestStaleWalk: a walk of the promises older than promisedTTL still
// serves (a hand-out does not wait for a walk of every disk) and a new
// one replaces it behind the caller.
func TestStaleWalk(t *testing.T) {
	p := newTestPool(t, Config{})
	acquire(t, p, "a", 0)
	allocMu.Lock()
	promisedWalks[p.cfg.Dir] = &promisedWalk{at: time.Now().Add(-time.Hour), sum: 1 << 62}
	allocMu.Unlock()
	if room, err := p.room(); err != nil || room > 0 {
		t.Fatalf("room on the stale walk = %d, %v; want it negative", room, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		room, err := p.room()
		if err != nil {
			t.Fatal(err)
		}
		if room > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("room still %d: the walk was not made again", room)
		}
		time.Sleep(10 * time.Millisecond)
	}
	allocMu.Lock()
	var sum int64 = -1
	if w := promisedWalks[p.cfg.Dir]; w != nil {
		sum = w.sum
	}
	allocMu.Unlock()
	if sum < testSize/2 || sum > testSize {
		t.Errorf("the new walk sums %d promised bytes; want the thin disk of %d", sum, testSize)
	}
}
