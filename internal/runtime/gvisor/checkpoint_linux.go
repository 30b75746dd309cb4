package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/runtime"
)

// checkpointName is the directory on a sandbox's disk (beside its root's
// upper layer: out of the sandbox's sight, counted against its disk's
// size, copied with the disk) that holds its memory checkpoint while it
// is paused.
const checkpointName = "checkpoint"

var _ runtime.Checkpointer = (*Runtime)(nil)

// Checkpoint implements runtime.Checkpointer: the sandbox is saved to
// its disk (save, uncompressed) and left stopped for the caller's Stop;
// once stopped, its files are compressed behind the answer, and its stop
// ends then (squeezeLater).
func (r *Runtime) Checkpoint(ctx context.Context, id string) (runtime.Checkpoint, error) {
	t0 := time.Now()
	v, err := r.cfg.Disks.Open(id)
	if err != nil {
		return runtime.Checkpoint{}, fmt.Errorf("opening disk: %w", err)
	}
	var phases []any
	mark := func(name string) { phases = append(phases, name, time.Since(t0).Round(time.Microsecond).String()) }
	defer func() { r.log.Debug("gvisor checkpoint phases", append([]any{"sandbox", id}, phases...)...) }()
	mem := r.memoryOf(id)
	final := filepath.Join(v.Path, checkpointName)
	tmp := final + ".new"
	wake, err := r.save(ctx, id, tmp, "none", mark)
	if err != nil {
		return runtime.Checkpoint{}, err
	}
	commit := func() error {
		if err := writeBootID(tmp); err != nil {
			return err
		}
		if err := os.RemoveAll(final); err != nil {
			return err
		}
		return os.Rename(tmp, final)
	}
	if err := commit(); err != nil {
		os.RemoveAll(tmp)
		return runtime.Checkpoint{}, errors.Join(err, wake())
	}
	mark("committed")
	squeezed := r.squeezeLater(id, final, nil)
	return runtime.Checkpoint{Bytes: dirBytes(final), MemoryBytes: mem, Took: time.Since(t0), Squeezed: squeezed}, nil
}

// CheckpointTo implements runtime.Checkpointer: the sandbox is saved to
// dir (save, uncompressed), during runs while it is stopped, then it
// runs on from a kernel restored from dir (renew), not the one saved:
// the processes and everything of the sandbox are the same, its stop
// lasts until they run again; their pages load in the background.
// Then the checkpoint is packed (squeezeDir: zstd blocks on every core,
// synced), the form a copy restores from as a resume does; checkpoints
// of earlier versions (flate, checkpoint.img alone) still restore.
func (r *Runtime) CheckpointTo(ctx context.Context, id, dir string, during func() error) (runtime.Checkpoint, error) {
	t0 := time.Now()
	var phases []any
	mark := func(name string) { phases = append(phases, name, time.Since(t0).Round(time.Microsecond).String()) }
	defer func() { r.log.Debug("gvisor checkpoint-to phases", append([]any{"sandbox", id}, phases...)...) }()
	r.mu.Lock()
	sb := r.live[id]
	r.mu.Unlock()
	if sb == nil {
		return runtime.Checkpoint{}, errdefs.Conflict("sandbox %s is not running", id)
	}
	mem := r.memoryOf(id)
	wake, err := r.save(ctx, id, dir, "none", mark)
	if err != nil {
		return runtime.Checkpoint{}, err
	}
	if during != nil {
		err = during()
		mark("during")
	}
	if err == nil {
		var ended bool
		if ended, err = r.renew(sb, dir, mark); ended {
			os.RemoveAll(dir)
			return runtime.Checkpoint{}, err
		}
	}
	if err != nil {
		err = errors.Join(err, wake())
		os.RemoveAll(dir)
		return runtime.Checkpoint{}, err
	}
	stopped := time.Since(t0)
	// The restored kernel holds the files it loads from open: they may
	// go once packed.
	if err := squeezeDir(ctx, dir); err != nil {
		os.RemoveAll(dir)
		return runtime.Checkpoint{}, err
	}
	if err := syncDir(dir); err != nil {
		os.RemoveAll(dir)
		return runtime.Checkpoint{}, fmt.Errorf("writing the checkpoint: %w", err)
	}
	mark("packed")
	return runtime.Checkpoint{Bytes: dirBytes(dir), MemoryBytes: mem, Took: time.Since(t0), Stopped: stopped}, nil
}

// memoryOf is the memory sandbox id's cgroup holds (0 if unknown).
func (r *Runtime) memoryOf(id string) int64 {
	if cg, err := r.cfg.Cgroups.Load(id); err == nil {
		if st, err := cg.Stats(); err == nil {
			return st.MemoryCurrent
		}
	}
	return 0
}

// save writes sandbox id's kernel to dir, a new directory, with a copy
// of its guest binary (keepGuest). The guest first closes its control
// socket (gVisor cannot save a socket bound on the host); runsc then pauses the kernel and saves it (compressed as
// compression says: none or flate-best-speed), leaving it paused: a save that fails leaves it to be resumed, which a
// save without --leave-running would not (it ends the sandbox either
// way). wake resumes the kernel and has the guest bind its socket again;
// on failure save has done that itself and removed dir.
func (r *Runtime) save(ctx context.Context, id, dir, compression string, mark func(string)) (wake func() error, err error) {
	os.RemoveAll(dir)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("making the checkpoint's directory: %w", err)
	}
	// While the guest quiesces and the kernel is saved (files of their
	// own beside runsc's): the guest binary a restore must bind, and
	// whether it must bind the root's /tmp.
	keeping := make(chan error, 1)
	go func() {
		err := r.keepGuest(id, dir)
		if err == nil {
			err = r.keepTmp(id, dir)
		}
		keeping <- err
	}()
	var kept error
	waitKept := func() error {
		if keeping != nil {
			kept, keeping = <-keeping, nil
		}
		return kept
	}
	paused := false
	wake = func() error {
		// Not the caller's context: the sandbox must run again even
		// when the call was cut short.
		bg, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		if paused {
			if out, rerr := r.runsc(bg, "resume", id).CombinedOutput(); rerr != nil {
				err = fmt.Errorf("resuming the sandbox: %s", runscError(rerr, out))
			}
		}
		return errors.Join(err, r.relisten(bg, id))
	}
	fail := func(err error) (func() error, error) {
		waitKept()
		os.RemoveAll(dir)
		return nil, errors.Join(err, wake())
	}
	c := guestapi.NewClient(r.dialer(id))
	err = c.Quiesce(ctx)
	c.Close()
	if err != nil {
		return fail(fmt.Errorf("readying the guest: %w", err))
	}
	mark("quiesced")
	if out, err := r.runsc(ctx, "pause", id).CombinedOutput(); err != nil {
		return fail(fmt.Errorf("runsc pause: %s", runscError(err, out)))
	}
	paused = true
	mark("paused")
	out, err := r.runsc(ctx, "checkpoint", "--leave-running", "--compression", compression,
		"--image-path", dir, id).CombinedOutput()
	if err != nil {
		return fail(fmt.Errorf("runsc checkpoint: %s", runscError(err, out)))
	}
	mark("saved")
	if err := waitKept(); err != nil {
		return fail(err)
	}
	mark("guest kept")
	if compression != "none" {
		// An uncompressed one is synced as it is compressed.
		if err := syncDir(dir); err != nil {
			return fail(fmt.Errorf("writing the checkpoint: %w", err))
		}
	}
	return wake, nil
}

// restoreRun restores the checkpoint at image for the bundle in dir
// (whose spec names the sandbox's cgroup) and returns the sandbox,
// watching the sentry's process. A packed checkpoint is checked and
// mounted at scratch (a new directory on the sandbox's disk) while runsc
// creates the sandbox, one squeezed file by file is expanded there; it
// is restored from there. runsc loads its pages in the background, the
// processes running meanwhile (a page they touch first is loaded first;
// from a pack, the kernel expands the blocks runsc reads). scratch is
// unmounted (lazily: runsc reads on from the files it opened) and goes
// once runsc holds the files.
func (r *Runtime) restoreRun(ctx context.Context, id, dir, image, scratch string) (*Sandbox, error) {
	r.stopSqueezing(id)
	defer unmountPack(scratch)
	plan, err := planImage(image)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", runtime.ErrCheckpointUnusable, err)
	}
	// runsc's stdio becomes the restored guest's: a file, which the
	// detached sandbox may keep open (a pipe would keep Run waiting).
	logFile, err := os.OpenFile(filepath.Join(dir, "guest.log"), os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	logged, err := logFile.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, err
	}
	failed := func(what string, err error) error {
		out := make([]byte, 4096)
		n, _ := logFile.ReadAt(out, logged)
		return fmt.Errorf("%w: %s: %s", runtime.ErrCheckpointUnusable, what, runscError(err, out[:n]))
	}
	pidFile := filepath.Join(dir, "sentry.pid")
	os.Remove(pidFile)
	runLog := filepath.Join(dir, "runsc.log")
	var args []string
	t0 := time.Now()
	var (
		mu     sync.Mutex
		phases []any
	)
	mark := func(name string) {
		mu.Lock()
		defer mu.Unlock()
		phases = append(phases, name, time.Since(t0).Round(time.Microsecond).String())
	}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		r.log.Debug("gvisor restore phases", append([]any{"sandbox", id}, phases...)...)
	}()
	if plan.packed || plan.squeezed() {
		expanded := make(chan error, 1)
		go func() {
			var err error
			if plan.packed {
				err = mountPack(ctx, filepath.Join(image, packName), scratch)
				mark("checked and mounted")
			} else {
				err = plan.expand(ctx, scratch)
				mark("expanded")
			}
			expanded <- err
		}()
		cmd := r.runsc(ctx, "--log", runLog, "create", "--bundle", dir, "--pid-file", pidFile, id)
		cmd.Stdout, cmd.Stderr = logFile, logFile
		cerr := cmd.Run()
		mark("created")
		if err := <-expanded; err != nil {
			if plan.packed && !errors.Is(err, errDamaged) {
				return nil, fmt.Errorf("opening the checkpoint: %w", err)
			}
			return nil, fmt.Errorf("%w: %v", runtime.ErrCheckpointUnusable, err)
		}
		if cerr != nil {
			return nil, failed("runsc create", cerr)
		}
		args = []string{"--log", runLog, "restore", "--detach", "--image-path", scratch}
	} else {
		args = []string{"--log", runLog, "restore", "--detach", "--image-path", image, "--bundle", dir, "--pid-file", pidFile}
	}
	if plan.pages {
		args = append(args, "--background")
	}
	cmd := r.runsc(ctx, append(args, id)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Run(); err != nil {
		return nil, failed("runsc restore", err)
	}
	mark("restored")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return nil, fmt.Errorf("reading the sandbox's pid: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("reading the sandbox's pid: %w", err)
	}
	group, err := r.cfg.Cgroups.Load(id)
	if err != nil {
		return nil, fmt.Errorf("loading cgroup: %w", err)
	}
	return r.watch(id, pid, group)
}

// relisten has a quiesced guest bind its control socket again and waits
// until it answers.
func (r *Runtime) relisten(ctx context.Context, id string) error {
	if out, err := r.runsc(ctx, "kill", id, "PWR").CombinedOutput(); err != nil {
		return fmt.Errorf("signalling the guest: %s", runscError(err, out))
	}
	c := guestapi.NewClient(r.dialer(id))
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.Ping(pctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the guest does not answer on its control socket again: %w", err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// dialer dials sandbox id's guest, as Sandbox.Dial does.
func (r *Runtime) dialer(id string) func(context.Context) (net.Conn, error) {
	socket := filepath.Join(r.dir(id), "ctl", "guest.sock")
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}
}

// runscError is the first line of what a failed runsc command printed
// (runsc adds a goroutine dump to some errors), or its exit status.
func runscError(err error, out []byte) string {
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	line = strings.TrimSuffix(strings.TrimSpace(line), ":")
	if line == "" {
		return err.Error()
	}
	if len(line) > 400 {
		line = line[:400] + "…"
	}
	return line
}

// syncDir flushes the files in dir, and dir itself, to disk.
func syncDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range append(entries, nil) {
		p := dir
		if e != nil {
			p = filepath.Join(dir, e.Name())
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// dirBytes is the space the files under dir take.
func dirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					n += st.Blocks * 512
				}
			}
		}
		return nil
	})
	return n
}
