package guest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
)

// control is the guest's control socket: its listener and the
// connections it accepted. Under gVisor the socket is bound in a host
// directory, which the sentry cannot save in a checkpoint: quiesce closes
// it (and every connection) before one, and relisten binds it again once
// the sandbox runs again (guestapi.OpQuiesce, guestapi.RelistenSignal).
type control struct {
	// dir is the socket's directory, opened before it was covered, so
	// that the socket can be bound there again; nil for an inherited
	// listener (the native tier's), which cannot be.
	dir  *os.File
	name string

	mu    sync.Mutex
	bound *sync.Cond   // signalled when ln is set again
	ln    net.Listener // nil while quiesced
	conns map[net.Conn]bool
}

func newControl(ln net.Listener, dir *os.File, name string) *control {
	c := &control{dir: dir, name: name, ln: ln, conns: map[net.Conn]bool{}}
	c.bound = sync.NewCond(&c.mu)
	return c
}

// listener returns the listener, waiting while the guest is quiesced.
func (c *control) listener() net.Listener {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.ln == nil {
		c.bound.Wait()
	}
	return c.ln
}

// quiesced reports whether quiesce closed the listener.
func (c *control) quiesced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ln == nil
}

// add tracks a connection of the host's; false while quiesced (the
// caller closes it).
func (c *control) add(conn net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ln == nil {
		return false
	}
	c.conns[conn] = true
	return true
}

func (c *control) remove(conn net.Conn) {
	c.mu.Lock()
	delete(c.conns, conn)
	c.mu.Unlock()
}

// quiesceWait bounds how long quiesce waits for the handlers of the
// connections it closed to let go of them.
const quiesceWait = 5 * time.Second

// quiesce closes the listener and every tracked connection but self, and
// waits until their handlers have let go of them.
func (c *control) quiesce(self net.Conn) error {
	c.mu.Lock()
	if c.dir == nil {
		c.mu.Unlock()
		return errdefs.Invalid("op", "this guest's control socket was inherited: it cannot be bound again after a checkpoint")
	}
	if c.ln != nil {
		c.ln.Close()
		c.ln = nil
		// Unlinked too: a restore looks up every file the sentry knew,
		// and the host may remove the socket meanwhile.
		unix.Unlink(c.path())
	}
	for conn := range c.conns {
		if conn != self {
			conn.Close()
		}
	}
	c.mu.Unlock()
	deadline := time.Now().Add(quiesceWait)
	for {
		c.mu.Lock()
		n := len(c.conns)
		c.mu.Unlock()
		if n <= 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d connections of the host's are still open after %v", n-1, quiesceWait)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// relisten binds the control socket again if quiesce closed it. The
// directory is reached through the descriptor opened before it was
// covered.
func (c *control) relisten() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ln != nil || c.dir == nil {
		return nil
	}
	path := c.path()
	unix.Unlink(path) // the socket of before the checkpoint
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("binding the control socket again: %w", err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	c.ln = ln
	c.bound.Broadcast()
	return nil
}

// path names the socket through the directory's descriptor.
func (c *control) path() string { return fmt.Sprintf("/proc/self/fd/%d/%s", c.dir.Fd(), c.name) }

// relistenOn binds the control socket again on each signal from ch,
// once the sandbox's files follow its hostname: the daemon waits for the
// socket before it calls.
func (c *control) relistenOn(ch <-chan os.Signal, s *server) {
	for range ch {
		if err := s.followHostname(); err != nil {
			s.log.Warn("taking the new hostname", "err", err)
		}
		if err := c.relisten(); err != nil {
			s.log.Warn("relistening", "err", err)
		}
	}
}

// followHostname gives the sandbox's files and new processes the kernel's
// hostname when a restore changed it: runsc restores a memory snapshot's
// copy with the copy's id for hostname, while its /etc/hostname and the
// HOSTNAME of the environment were the source's. A HOSTNAME that a create
// set to anything else is kept.
func (s *server) followHostname() error {
	h, err := os.Hostname()
	if err != nil || h == s.hostname {
		return err
	}
	old := s.hostname
	s.hostname = h
	for {
		cur := s.setEnv.Load()
		env := s.cfg.Env
		if cur != nil {
			env = *cur
		}
		if v, ok := lookupEnv(env, "HOSTNAME"); ok && v != old {
			break
		}
		next := mergeEnv(env, []string{"HOSTNAME=" + h})
		if s.setEnv.CompareAndSwap(cur, &next) {
			break
		}
	}
	return writeIdentity(h)
}

// lookupEnv is the value of key in env.
func lookupEnv(env []string, key string) (string, bool) {
	if i := indexKey(env, key); i >= 0 {
		_, v, _ := strings.Cut(env[i], "=")
		return v, true
	}
	return "", false
}

func init() {
	extraOps[guestapi.OpQuiesce] = (*server).opQuiesce
	extraOps[guestapi.OpSetEnv] = (*server).opSetEnv
}

// env is the environment new processes start with (before their own).
func (s *server) env() []string {
	if e := s.setEnv.Load(); e != nil {
		return *e
	}
	return s.cfg.Env
}

// opSetEnv replaces variables of the environment new processes get.
func (s *server) opSetEnv(c *opConn, req guestapi.Request) {
	for _, kv := range req.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			c.respond(guestapi.Response{}, errdefs.Invalid("env", "%q is not KEY=VALUE", kv))
			return
		}
	}
	env := mergeEnv(s.env(), req.Env)
	s.setEnv.Store(&env)
	c.respond(guestapi.Response{}, nil)
}

// opQuiesce closes the control socket and every other connection of the
// host's, answers, and lets the handler close this one.
func (s *server) opQuiesce(c *opConn, req guestapi.Request) {
	if s.ctl == nil {
		c.respond(guestapi.Response{}, errdefs.Invalid("op", "this guest serves no control socket"))
		return
	}
	// Reading meminfo has gVisor's sentry learn which of its memory's
	// pages the processes committed (it scans with mincore): its save
	// then writes them out as they are, instead of reading every page
	// it does not know of to tell zero pages apart, which took most of
	// a checkpoint's time behind a lock the rest of the save waits on.
	os.ReadFile("/proc/meminfo")
	err := s.ctl.quiesce(c.conn)
	if err == nil {
		// The cgroup's OOM counter is the host's file too: exits after
		// a restore are not told apart as OOM kills.
		if oom := s.oom.Swap(nil); oom != nil {
			oom.Close()
		}
	}
	c.respond(guestapi.Response{}, err)
}

// controlListener is the control socket: the inherited listener, or one
// bound at path (Prepare.Listen), whose directory is then covered so that
// only the host reaches it.
func controlListener(path string) (*control, error) {
	if path == "" {
		lf := os.NewFile(fdListen, "listener")
		defer lf.Close()
		ln, err := net.FileListener(lf)
		if err != nil {
			return nil, fmt.Errorf("opening control listener: %w", err)
		}
		return newControl(ln, nil, ""), nil
	}
	dir, err := os.OpenFile(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the control socket's directory: %w", err)
	}
	os.Remove(path) // an earlier guest's, on a resume
	ln, err := net.Listen("unix", path)
	if err != nil {
		dir.Close()
		return nil, fmt.Errorf("binding control socket: %w", err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	// Covered, not unmounted: under gVisor an unmount ends the host
	// socket's listener too. The sandbox's processes lack CAP_SYS_ADMIN
	// to uncover it.
	if err := unix.Mount("tmpfs", filepath.Dir(path), "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k"); err != nil {
		ln.Close()
		dir.Close()
		return nil, fmt.Errorf("hiding control socket: %w", err)
	}
	return newControl(ln, dir, filepath.Base(path)), nil
}
