package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

const (
	cleanupTimeout = 3 * time.Minute
	opTimeout      = 2 * time.Minute
)

// rig is what the benchmarks share: the private daemon and its client, and
// the peers. Everything it makes lives under root, under cgroupParent (the
// daemon's sandboxes) or under cgroupParent+"-runc" (runc's containers),
// and close removes all of it.
type rig struct {
	opts         options
	log          *slog.Logger
	root         string
	cgroupParent string
	daemon       *daemon
	client       *client.Client
	bwrap        string     // "" when bubblewrap is not installed
	runc         *runcRig   // nil when runc is not installed
	served       bool       // the daemon came up at least once
	netName      string     // the daemon's network (nftables table, link prefix)
	egress       *egressNet // the egress benchmark's upstream; nil unless it runs
	e2b          *e2bEndpoint
	baseline     *baselineDaemon // the -baseline daemon; nil unless it runs
	nodeAddr     string          // the daemon's TCP listener, for the gateway section
	egressErr    error           // why egress is nil when it should run

	mu      sync.Mutex
	made    map[string]bool // sandboxes created and not yet removed
	closed  bool
	closeMu sync.Mutex
}

// newRig makes the private directories, starts the daemon and prepares
// the peers. On error everything made so far is removed.
func newRig(ctx context.Context, opts options, log *slog.Logger) (_ *rig, retErr error) {
	root, err := os.MkdirTemp("", "paddock-bench-")
	if err != nil {
		return nil, fmt.Errorf("making private dir: %w", err)
	}
	// Sandbox uids must traverse root to reach the daemon's image layers.
	if err := os.Chmod(root, 0o711); err != nil {
		os.RemoveAll(root)
		return nil, fmt.Errorf("making private dir: %w", err)
	}
	pid := os.Getpid()
	r := &rig{
		opts:         opts,
		log:          log,
		root:         root,
		cgroupParent: fmt.Sprintf("paddock-bench-%d", pid),
		made:         map[string]bool{},
	}
	defer func() {
		if retErr != nil {
			r.close(true)
		}
	}()
	// A uid window of its own, away from the default daemon's 1<<28.
	uidStart := uint32(1<<30 + (pid%8)<<27)
	// A network of its own too: a daemon running on the host keeps its
	// nftables table and addresses.
	r.netName = fmt.Sprintf("pb%05x", pid&0xfffff)
	extra := []string{"--network-name", r.netName, "--network-subnet", freeSubnet(pid)}
	if opts.selected("egress") {
		// Made before the daemon, which must know its DNS server and CA. A
		// failure fails that benchmark only.
		if r.egress, r.egressErr = newEgressNet(root, log); r.egressErr == nil {
			extra = append(extra, r.egress.DaemonArgs()...)
		}
	}
	if churnProfile != "" || densityPprof {
		extra = append(extra, "--debug-socket")
	}
	if opts.selected("gvisor") || opts.selected("gvisorwork") || opts.selected("gvisorfork") {
		extra = append(extra, gvisorArgs()...)
	}
	if opts.selected("gateway") {
		addr, args, err := gatewayArgs()
		if err != nil {
			return nil, err
		}
		r.nodeAddr = addr
		extra = append(extra, args...)
	}
	if r.daemon, err = newDaemon(opts.bin, root, r.cgroupParent, uidStart, extra...); err != nil {
		return nil, err
	}
	r.client = r.daemon.client
	if r.e2b, err = setupE2B(root, r.daemon); err != nil {
		return nil, err
	}
	log.Info("starting daemon", "bin", opts.bin, "dir", root, "cgroup_parent", r.cgroupParent)
	if err := r.daemon.start(ctx); err != nil {
		return nil, err
	}
	r.served = true
	if err := r.preparePeers(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *rig) preparePeers(ctx context.Context) error {
	if p, err := exec.LookPath("bwrap"); err == nil {
		r.bwrap = p
	} else {
		r.log.Warn("bubblewrap is not installed; its rows are skipped (make bench installs it)")
	}
	p, err := exec.LookPath("runc")
	if err != nil {
		r.log.Warn("runc is not installed; its rows are skipped (make bench installs it)")
		return nil
	}
	r.runc, err = prepareRunc(ctx, p, filepath.Join(r.root, "runc"), r.cgroupParent+"-runc")
	if err != nil {
		return fmt.Errorf("preparing runc bundle: %w", err)
	}
	return nil
}

// create makes a sandbox and remembers it for the final sweep.
func (r *rig) create(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error) {
	sb, err := r.client.Create(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("creating sandbox: %w", err)
	}
	r.track(sb.ID)
	return sb, nil
}

// track remembers a sandbox made outside create (in a timed region).
func (r *rig) track(id string) {
	r.mu.Lock()
	r.made[id] = true
	r.mu.Unlock()
}

// madeIDs lists the sandboxes created and not yet removed.
func (r *rig) madeIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, 0, len(r.made))
	for id := range r.made {
		ids = append(ids, id)
	}
	return ids
}

// remove deletes a sandbox made by create.
func (r *rig) remove(ctx context.Context, id string) error {
	if err := r.client.Delete(ctx, id, true); err != nil && !client.IsNotFound(err) {
		return fmt.Errorf("removing sandbox %s: %w", id, err)
	}
	r.mu.Lock()
	delete(r.made, id)
	r.mu.Unlock()
	return nil
}

// removeAll deletes sandboxes made by create, without a deadline of the
// caller's: it runs on the way out of a benchmark, also after an error or
// an interrupt.
func (r *rig) removeAll(ids []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	var errs []error
	for _, id := range ids {
		errs = append(errs, r.remove(ctx, id))
	}
	return errors.Join(errs...)
}

// runtimeOf is what the daemon reports of a sandbox's host side: its
// guest's host pid and its cgroup (zero values if it reports nothing).
func (r *rig) runtimeOf(ctx context.Context, id string) api.RuntimeInfo {
	sb, err := r.client.Get(ctx, id)
	if err != nil || sb.Runtime == nil {
		return api.RuntimeInfo{}
	}
	return *sb.Runtime
}

// idle waits until the daemon's background work is done (see waitIdle).
func (r *rig) idle(ctx context.Context) {
	if r.daemon.running() {
		waitIdle(ctx, r.daemon.pid())
	}
}

// exec runs a command in a sandbox, untimed, and fails unless it exits 0.
func (r *rig) exec(ctx context.Context, id string, stdout io.Writer, cmd ...string) error {
	var stderr strings.Builder
	st, err := r.client.Exec(ctx, id, api.ExecRequest{Cmd: cmd}, client.ExecIO{Stdout: stdout, Stderr: &stderr})
	return execResult(cmd, st, err, stderr.String())
}

func execResult(cmd []string, st *api.ExitStatus, err error, stderr string) error {
	switch {
	case err != nil:
		return fmt.Errorf("exec %q: %w", strings.Join(cmd, " "), err)
	case st.Error != "":
		return fmt.Errorf("exec %q: %s", strings.Join(cmd, " "), st.Error)
	case st.ExitCode != 0 || st.Signal != "":
		return fmt.Errorf("exec %q: exit %d%s (stderr: %s)", strings.Join(cmd, " "), st.ExitCode, signalSuffix(st), truncate(stderr, 300))
	}
	return nil
}

func signalSuffix(st *api.ExitStatus) string {
	var s string
	if st.Signal != "" {
		s += ", signal " + st.Signal
	}
	if st.OOMKilled {
		s += ", OOM-killed"
	}
	return s
}

// freeSubnet picks a /16 of 10.232.0.0/12 for the daemon's sandboxes,
// starting from one chosen by seed, that no address on the host falls in
// (other daemons' sandbox links among them). If all are taken it returns
// the first, and the daemon says why it cannot start.
func freeSubnet(seed int) string {
	addrs, _ := net.InterfaceAddrs()
	var first string
	for i := range 16 {
		p := netip.MustParsePrefix(fmt.Sprintf("10.%d.0.0/16", 232+(seed+i)%16))
		if first == "" {
			first = p.String()
		}
		used := false
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(ipn.IP); ok && p.Contains(ip.Unmap()) {
					used = true
				}
			}
		}
		if !used {
			return p.String()
		}
	}
	return first
}
