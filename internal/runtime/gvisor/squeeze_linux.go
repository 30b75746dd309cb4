package gvisor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
)

// A checkpoint file squeezed, as checkpoints were before packs
// (pack_linux.go; a resume still reads them): runsc wrote it
// uncompressed, and the runtime compressed it behind the pause's
// answer, on every core, into name+squeezedExt, which a resume expands
// again on every core. The file is independent zstd frames, one per
// squeezeChunk of the original, each with its content's size and
// checksum (XXH64), then a skippable frame with the index: so the whole
// is a zstd stream (`zstd -d` reads it), any frame decodes on its own,
// and damage or a truncation fails the expansion.
//
// The index frame's content: the compressed size of each frame
// (uint32), the original's size (uint64), the chunk size (uint32), the
// frame count (uint32) and squeezeMagic, little-endian; the last 8
// bytes of the file are thus the frame count and the magic.
const (
	squeezedExt  = ".zst"
	squeezeChunk = 4 << 20
	squeezeMagic = 0x31584b50 // "PKX1"
	// skippableMagic is the first of zstd's skippable frame magics.
	skippableMagic = 0x184d2a50
	// maxSqueezeFrames bounds what an index may claim (4 TiB at 4 MiB).
	maxSqueezeFrames = 1 << 20
)

// The encoder is zstd's fastest level, with literals entropy-coded
// even when no match is found: a page of text or of hex has few
// repeats but half its bits to spare (0.50× here against flate's 0.53×,
// at several times its speed).
var (
	encOnce sync.Once
	enc     *zstd.Encoder
	dec     *zstd.Decoder
	encErr  error
)

func coders() (*zstd.Encoder, *zstd.Decoder, error) {
	encOnce.Do(func() {
		n := goruntime.NumCPU()
		enc, encErr = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest),
			zstd.WithAllLitEntropyCompression(true), zstd.WithEncoderCRC(true), zstd.WithEncoderConcurrency(n))
		if encErr != nil {
			return
		}
		dec, encErr = zstd.NewReader(nil, zstd.WithDecoderConcurrency(n), zstd.WithDecoderMaxMemory(2*squeezeChunk))
	})
	return enc, dec, encErr
}

// squeezeIndex is a squeezed file's index.
type squeezeIndex struct {
	size   int64   // the original's
	chunk  int64   // the original's bytes per frame
	offset []int64 // each frame's in the squeezed file, and its end last
}

func readSqueezeIndex(f *os.File) (*squeezeIndex, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	total := fi.Size()
	var tail [8]byte
	if total < 28 {
		return nil, errors.New("too short for its index")
	}
	if _, err := f.ReadAt(tail[:], total-8); err != nil {
		return nil, err
	}
	if binary.LittleEndian.Uint32(tail[4:]) != squeezeMagic {
		return nil, errors.New("no index at its end (truncated?)")
	}
	frames := int64(binary.LittleEndian.Uint32(tail[:4]))
	if frames > maxSqueezeFrames {
		return nil, fmt.Errorf("its index claims %d frames", frames)
	}
	indexLen := 4*frames + 20
	start := total - 8 - indexLen
	if start < 0 {
		return nil, errors.New("too short for its index")
	}
	b := make([]byte, 8+indexLen)
	if _, err := f.ReadAt(b, start); err != nil {
		return nil, err
	}
	if binary.LittleEndian.Uint32(b) != skippableMagic || int64(binary.LittleEndian.Uint32(b[4:])) != indexLen {
		return nil, errors.New("its index frame is damaged")
	}
	b = b[8:]
	ix := &squeezeIndex{offset: make([]int64, 0, frames+1)}
	var off int64
	for i := int64(0); i < frames; i++ {
		ix.offset = append(ix.offset, off)
		off += int64(binary.LittleEndian.Uint32(b[4*i:]))
	}
	ix.offset = append(ix.offset, off)
	rest := b[4*frames:]
	ix.size = int64(binary.LittleEndian.Uint64(rest))
	ix.chunk = int64(binary.LittleEndian.Uint32(rest[8:]))
	if off != start {
		return nil, fmt.Errorf("its frames take %d bytes, its index says %d", start, off)
	}
	if ix.chunk <= 0 || ix.chunk > squeezeChunk || (ix.size+ix.chunk-1)/ix.chunk != frames {
		return nil, fmt.Errorf("its index's sizes do not agree (%d bytes in %d frames of %d)", ix.size, frames, ix.chunk)
	}
	return ix, nil
}

// expandFile writes the original of squeezed file src to dst, a new
// file, on every core. Damage (a frame that does not decode, whose
// checksum or size is not its index's) is an error.
func expandFile(ctx context.Context, src, dst string) (retErr error) {
	_, dec, err := coders()
	if err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	ix, err := readSqueezeIndex(in)
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(src), err)
	}
	out, err := createNew(dst)
	if err != nil {
		return err
	}
	defer closeNew(out, &retErr)
	if err := out.Truncate(ix.size); err != nil {
		return err
	}
	frames := len(ix.offset) - 1
	err = eachOnCores(ctx, frames, func() func(i int) error {
		var cbuf []byte
		buf := make([]byte, 0, ix.chunk)
		return func(i int) error {
			n := ix.offset[i+1] - ix.offset[i]
			if int64(cap(cbuf)) < n {
				cbuf = make([]byte, n)
			}
			if _, err := in.ReadAt(cbuf[:n], ix.offset[i]); err != nil {
				return err
			}
			want := min(ix.chunk, ix.size-int64(i)*ix.chunk)
			got, err := dec.DecodeAll(cbuf[:n], buf[:0])
			if err != nil {
				return fmt.Errorf("frame %d: %w", i, err)
			}
			if int64(len(got)) != want {
				return fmt.Errorf("frame %d holds %d bytes, not %d", i, len(got), want)
			}
			_, err = out.WriteAt(got, int64(i)*ix.chunk)
			return err
		}
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("%s: %w", filepath.Base(src), err)
	}
	return err
}

// eachOnCores runs a worker on each core; they call do (each worker's
// own, from newWorker) for 0..n-1 between them, until one fails or ctx
// ends, and the first error is returned.
func eachOnCores(ctx context.Context, n int, newWorker func() func(i int) error) error {
	var (
		mu   sync.Mutex
		next int
		errs []error
		wg   sync.WaitGroup
	)
	take := func() int {
		mu.Lock()
		defer mu.Unlock()
		if len(errs) > 0 || next == n || ctx.Err() != nil {
			return -1
		}
		next++
		return next - 1
	}
	for w := 0; w < goruntime.NumCPU(); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			do := newWorker()
			for i := take(); i >= 0; i = take() {
				if err := do(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return errs[0]
	}
	return ctx.Err()
}

// createNew creates dst, a new file, to be written (and read back).
func createNew(dst string) (*os.File, error) {
	return os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
}

// closeNew closes out, a file createNew made, and removes it if it
// could not be closed or *errp says its writing failed.
func closeNew(out *os.File, errp *error) {
	if err := out.Close(); *errp == nil {
		*errp = err
	}
	if *errp != nil {
		os.Remove(out.Name())
	}
}

// copyFile copies src into dst, a new file.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := createNew(dst)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// The files of a checkpoint directory: runsc's (the kernel's state, and
// with --compression none its memory's pages apart, with their
// metadata), each there as it is or squeezed, and bootName.
var checkpointFiles = []string{"checkpoint.img", "pages_meta.img", "pages.img"}

// bootName, in a checkpoint directory, holds the host's boot id when
// runsc wrote it: its uncompressed files are not synced (only their
// squeezed copies are), so after a host restart they cannot be trusted.
const bootName = "boot_id"

func bootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b)), err
}

func writeBootID(dir string) error {
	id, err := bootID()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, bootName), []byte(id+"\n"), 0o600)
}

// imagePlan says where each file of a checkpoint comes from.
type imagePlan struct {
	dir    string
	packed bool     // all of them from packName (pack_linux.go)
	raw    []string // used as they are
	zst    []string // expanded (checkpoints squeezed file by file, before packs)
	pages  bool     // it has a pages file: runsc can load it in the background
}

func (p *imagePlan) squeezed() bool { return len(p.zst) > 0 }

// planImage reads checkpoint directory dir: its pack if it has one
// (whole once there: the files it was made of may still be beside it),
// else each file there as it is (once its boot is this one), else its
// squeezed copy.
func planImage(dir string) (*imagePlan, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	has := map[string]bool{}
	for _, e := range entries {
		has[e.Name()] = true
	}
	if has[packName] {
		return &imagePlan{dir: dir, packed: true, pages: true}, nil
	}
	trusted := true
	if has[bootName] {
		b, err := os.ReadFile(filepath.Join(dir, bootName))
		if err != nil {
			return nil, err
		}
		now, err := bootID()
		if err != nil {
			return nil, err
		}
		trusted = strings.TrimSpace(string(b)) == now
	}
	p := &imagePlan{dir: dir}
	for _, name := range checkpointFiles {
		switch {
		case has[name] && trusted:
			p.raw = append(p.raw, name)
		case has[name+squeezedExt]:
			p.zst = append(p.zst, name)
		case has[name]:
			return nil, fmt.Errorf("the host restarted before the checkpoint's %s was compressed onto disk", name)
		case name == "checkpoint.img":
			return nil, fmt.Errorf("the checkpoint has no %s", name)
		default:
			continue
		}
		if name == "pages.img" {
			p.pages = true
		}
	}
	return p, nil
}

// expand makes dst, a new directory, the checkpoint runsc restores:
// its squeezed files expanded, the others linked (or copied).
func (p *imagePlan) expand(ctx context.Context, dst string) error {
	unmountPack(dst)
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	for _, name := range p.raw {
		src := filepath.Join(p.dir, name)
		if err := os.Link(src, filepath.Join(dst, name)); err != nil {
			if err := copyFile(src, filepath.Join(dst, name)); err != nil {
				return err
			}
		}
	}
	for _, name := range p.zst {
		if err := expandFile(ctx, filepath.Join(p.dir, name+squeezedExt), filepath.Join(dst, name)); err != nil {
			return err
		}
	}
	return nil
}

// squeezeDir packs the files of checkpoint directory dir that are
// there as they are into packName (pack_linux.go): into a new file,
// synced, renamed; then they go. At every step the checkpoint is whole
// in one form or both (planImage takes the pack once it is there), so
// a kill (of the daemon) leaves one a resume can use.
func squeezeDir(ctx context.Context, dir string) error {
	packed := filepath.Join(dir, packName)
	var names []string
	for _, name := range checkpointFiles {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			names = append(names, name)
		}
	}
	if _, err := os.Stat(packed); err != nil {
		if len(names) == 0 {
			return nil // squeezed file by file, before packs
		}
		if b, err := os.ReadFile(filepath.Join(dir, bootName)); err == nil {
			now, err := bootID()
			if err != nil {
				return err
			}
			if strings.TrimSpace(string(b)) != now {
				return errors.New("its uncompressed files were written before the host restarted")
			}
		}
		tmp := packed + ".new"
		os.Remove(tmp)
		if err := packDir(ctx, dir, names, tmp); err != nil {
			return fmt.Errorf("compressing the checkpoint: %w", err)
		}
		// The copy of the guest binary outlives the host's restart
		// with the pack.
		for _, name := range []string{guestCopyName, guestSumName} {
			if err := syncPath(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				os.Remove(tmp)
				return err
			}
		}
		if err := os.Rename(tmp, packed); err != nil {
			os.Remove(tmp)
			return err
		}
		if err := syncPath(dir); err != nil {
			return err
		}
	}
	for _, name := range names {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return syncPath(dir)
}

func syncPath(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// squeezer is a paused sandbox's checkpoint being squeezed in the
// background, with the end of the sandbox's stop: runsc's record of it
// deleted and its root unmounted. The unmount waits for the squeeze: it
// syncs the disk, which would otherwise write the uncompressed
// checkpoint out (the squeeze removes it first, and its pages were
// never written). handoff, until Stop hands it the rest of the stop or
// the squeezer ends, is where Stop does.
type squeezer struct {
	cancel  context.CancelFunc
	done    chan struct{}
	handoff chan func()
}

// squeezeLater squeezes checkpoint directory dir of sandbox id in the
// background, once the sandbox has stopped: rest is the rest of its
// stop, or nil to wait for Stop to hand it over. The channel yields
// the checkpoint's size on disk once done, and closes (without one if
// it stopped: stopSqueezing, or an error, which leaves it as it was).
func (r *Runtime) squeezeLater(id, dir string, rest func()) <-chan int64 {
	ctx, cancel := context.WithCancel(context.Background())
	s := &squeezer{cancel: cancel, done: make(chan struct{})}
	handoff := make(chan func(), 1)
	if rest == nil {
		s.handoff = handoff
	} else {
		handoff <- rest
	}
	report := make(chan int64, 1)
	r.mu.Lock()
	if old := r.squeezers[id]; old != nil {
		old.cancel()
	}
	r.squeezers[id] = s
	r.mu.Unlock()
	go func() {
		defer close(s.done)
		defer close(report)
		defer cancel()
		defer func() {
			r.mu.Lock()
			if r.squeezers[id] == s {
				delete(r.squeezers, id)
			}
			r.mu.Unlock()
		}()
		var rest func()
		select {
		case rest = <-handoff:
		case <-ctx.Done():
			r.mu.Lock()
			s.handoff = nil
			r.mu.Unlock()
			select {
			case rest = <-handoff: // handed over as it was stopped
			default:
				return
			}
		}
		rest()
		t0 := time.Now()
		err := squeezeDir(ctx, dir)
		// Stopped or not: the unmount syncs the sandbox's files.
		unmountRoot(filepath.Join(r.dir(id), "rootfs"))
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("compressing a checkpoint; it stays uncompressed", "sandbox", id, "err", err)
			}
			return
		}
		n := dirBytes(dir)
		r.log.Info("checkpoint compressed", "sandbox", id, "bytes", n, "took", time.Since(t0).Round(time.Millisecond))
		report <- n
	}()
	return report
}

// handOver gives sandbox id's squeezer, if it waits for the sandbox to
// stop, the rest of its stop; false if none waits.
func (r *Runtime) handOver(id string, rest func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.squeezers[id]
	if s == nil || s.handoff == nil {
		return false
	}
	s.handoff <- rest
	s.handoff = nil
	return true
}

// Squeeze implements runtime.Checkpointer: paused sandbox id's
// checkpoint is squeezed (again: a daemon that stopped left it part
// done).
func (r *Runtime) Squeeze(id string) <-chan int64 {
	v, err := r.cfg.Disks.Open(id)
	if err == nil {
		dir := filepath.Join(v.Path, checkpointName)
		if _, err = os.Stat(dir); err == nil {
			// Its stop may not have ended either (a daemon that
			// ended right after the pause's answer).
			return r.squeezeLater(id, dir, func() {
				cg, err := r.cfg.Cgroups.Load(id)
				if err != nil {
					cg = nil
				}
				r.finishStop(id, cg)
			})
		}
	}
	r.log.Warn("compressing a checkpoint", "sandbox", id, "err", err)
	none := make(chan int64)
	close(none)
	return none
}

// stopSqueezing stops the squeezing of sandbox id's checkpoint, if it
// runs, and waits until it has stopped: the sandbox's stop has ended
// then (its root unmounted).
func (r *Runtime) stopSqueezing(id string) {
	r.mu.Lock()
	s := r.squeezers[id]
	r.mu.Unlock()
	if s != nil {
		s.cancel()
		<-s.done
	}
}

// stopAllSqueezing is stopSqueezing of every sandbox.
func (r *Runtime) stopAllSqueezing() {
	r.mu.Lock()
	all := make([]*squeezer, 0, len(r.squeezers))
	for _, s := range r.squeezers {
		all = append(all, s)
	}
	r.mu.Unlock()
	for _, s := range all {
		s.cancel()
		<-s.done
	}
}
