package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/runtime"
)

// renew replaces the kernel of sandbox sb, paused and just saved to
// image (CheckpointTo's save), by one restored from that image: the
// sandbox runs on from a restored kernel, as after a resume. On gVisor's
// systrap platform a kernel saved and resumed in place, again and again,
// faults or kills its processes within a few saves; a restored one does
// not (TestGvisorRepeatedSnapshots). The sandbox keeps what it is: its
// processes and their pids (the kernel's), its disk, cgroup and network
// slot (the namespace is held across the change and given its addresses
// back: the old netstack took them off), and its Sandbox, whose Done does
// not fire; only the sentry's host pid changes. Its connected TCP
// sockets to the outside are cut, as a resume cuts them.
//
// On failure before the old kernel is killed nothing has changed and
// ended is false (the caller resumes it); after, the sandbox has ended
// (its Done fires) and ended is true.
func (r *Runtime) renew(sb *Sandbox, image string, mark func(string)) (ended bool, err error) {
	id := sb.id
	// Not the caller's context: once the old kernel is killed, the
	// sandbox must come back even when the call was cut short.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := r.cfg.Disks.Open(id)
	if err != nil {
		return false, fmt.Errorf("opening disk: %w", err)
	}
	var netns *os.File
	var readdress func() error
	if r.cfg.Network != nil {
		re, ok := r.cfg.Network.(runtime.Readdresser)
		if !ok {
			return false, fmt.Errorf("%w: the network cannot give a restored sandbox its addresses back", errdefs.ErrUnavailable)
		}
		if netns, err = sb.netns(); err != nil {
			return false, err
		}
		defer netns.Close()
		readdress = func() error { return re.Readdress(id, int(netns.Fd())) }
		// The bundle names the slot by a path of the process that
		// started the sandbox (maybe an earlier daemon's): now this one.
		if err := setBundleNetns(r.dir(id), fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), netns.Fd())); err != nil {
			return false, err
		}
	}
	left, err := sb.leave()
	if err != nil {
		return false, err
	}
	arrived := false
	fail := func(err error) (bool, error) {
		if arrived {
			sb.Kill()
		} else {
			// A sentry restored that did not arrive goes too.
			sb.cg.Kill()
			sb.end()
		}
		r.runsc(context.Background(), "delete", "--force", id).Run()
		return true, fmt.Errorf("restoring the sandbox from its checkpoint: %w; it has ended", err)
	}
	if err := sb.Kill(); err != nil {
		return fail(fmt.Errorf("ending its saved kernel: %w", err))
	}
	select {
	case <-left:
	case <-ctx.Done():
		return fail(errors.New("its saved kernel does not exit"))
	}
	// Its gofer exits with it; the memory it held is freed before the
	// new kernel's is loaded (the cgroup's limit holds them both).
	for {
		pids, err := sb.cg.Pids()
		if err != nil || len(pids) == 0 {
			break
		}
		if ctx.Err() != nil {
			return fail(errors.New("its saved kernel's processes do not exit"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	mark("old kernel gone")
	if out, err := r.runsc(ctx, "delete", "--force", id).CombinedOutput(); err != nil {
		return fail(fmt.Errorf("runsc delete: %s", runscError(err, out)))
	}
	if readdress != nil {
		if err := readdress(); err != nil {
			return fail(err)
		}
	}
	// restoreRun's watch finds sb awaiting its new sentry: it arrives.
	if _, err := r.restoreRun(ctx, id, r.dir(id), image, filepath.Join(v.Path, checkpointName+".open")); err != nil {
		return fail(err)
	}
	arrived = true
	mark("restored")
	if err := r.relisten(ctx, id); err != nil {
		return fail(err)
	}
	mark("relistened")
	return false, nil
}

// netns opens the network namespace s's sentry runs in.
func (s *Sandbox) netns() (*os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pidFile == nil {
		return nil, errdefs.Conflict("sandbox %s has ended", s.id)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", s.st.PID))
	if err != nil {
		return nil, fmt.Errorf("opening the sandbox's network namespace: %w", err)
	}
	// The sentry was still there once it was open: the pid was not
	// another process's.
	if err := unix.PidfdSendSignal(int(s.pidFile.Fd()), 0, nil, 0); err != nil {
		f.Close()
		return nil, errdefs.Conflict("sandbox %s has ended", s.id)
	}
	return f, nil
}

// setBundleNetns points the bundle in dir at the network namespace path.
func setBundleNetns(dir, path string) error {
	file := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("reading bundle: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("reading bundle: %w", err)
	}
	found := false
	if spec.Linux != nil {
		for i, ns := range spec.Linux.Namespaces {
			if ns.Type == specs.NetworkNamespace && ns.Path != "" {
				spec.Linux.Namespaces[i].Path = path
				found = true
			}
		}
	}
	if !found {
		return fmt.Errorf("the bundle in %s names no network namespace", dir)
	}
	if b, err = json.MarshalIndent(&spec, "", "\t"); err != nil {
		return err
	}
	tmp := file + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing bundle: %w", err)
	}
	return os.Rename(tmp, file)
}
