package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/archive/s3test"
	"github.com/paddock-dev/paddock/internal/freeport"
)

// archiveBytes is what the archived sandbox holds: incompressible files,
// the worst case for the archive's zstd.
const archiveBytes = 1 << 30

// archiveRun is what the archive section measured.
type archiveRun struct {
	Archive, Restore time.Duration
	Stored           int64 // bytes in the store
	SameID, Intact   bool
	NodeAfter        string
}

// benchArchive is issue 22's bar 6: a paused sandbox holding 1 GiB of
// files archived to a real object store (SeaweedFS on loopback), its
// node stopped for good, then resumed on another node through a gateway.
func benchArchive(ctx context.Context, r *rig) *section {
	s := &section{Method: []string{
		"Two more `paddock serve` nodes (tags `x` and `y`, each with its own directories, network and cgroup) archive to " +
			"SeaweedFS (`weed server -s3`, scripts/s3-bins.sh) on loopback; a `paddock gateway` with a nodes file fronts them.",
		"A sandbox on node x writes 1 GiB of random bytes (4 files of 256 MiB from /dev/urandom) and its checksums (`sha256sum`); " +
			"it is paused, then **archive** is timed: `POST /v1/sandboxes/{id}/archive` on node x (capture, zstd, multipart upload, " +
			"size check, record written and read back, local disk removed).",
		"Node x is then stopped and taken out of the gateway's table for good. **restore** is timed: `POST /v1/sandboxes/{id}/resume` " +
			"through the gateway, which finds the sandbox's record in the store, places it on node y, which downloads, checks the " +
			"checksum, writes the disk back (holes kept) and starts it. The files' checksums are compared after.",
	}}
	var run archiveRun
	s.Err = r.archiveRun(ctx, &run)
	t := table{Header: []string{"step", "time", "rate"}}
	if run.Archive > 0 {
		t.add("archive 1 GiB (paused sandbox → store)", ms(run.Archive), fmt.Sprintf("%.0f MB/s", mbps(archiveBytes, run.Archive)))
	}
	if run.Restore > 0 {
		t.add("restore 1 GiB on another node (resume through the gateway → running)", ms(run.Restore), fmt.Sprintf("%.0f MB/s", mbps(archiveBytes, run.Restore)))
	}
	if run.Stored > 0 {
		s.note("The store held %.1f MiB for the sandbox's disk (zstd of its data extents).", float64(run.Stored)/(1<<20))
	}
	s.Tables = append(s.Tables, t)
	b := bar{Issue: 22, What: "paused sandbox archived, its node gone, resumed on another node", Target: "files intact, same id", Value: noPeerValue, Verdict: notMeasured}
	if run.Restore > 0 {
		b.Value = fmt.Sprintf("same id: %v, files intact: %v, now on %s; archive %s, restore %s for 1 GiB", run.SameID, run.Intact, run.NodeAfter, ms(run.Archive), ms(run.Restore))
		b.Verdict = check(run.SameID && run.Intact)
	}
	s.Bars = []bar{b}
	return s
}

// archiveNode is one of the section's nodes.
type archiveNode struct {
	name, tag, addr string
	d               *daemon
}

func (r *rig) archiveRun(ctx context.Context, run *archiveRun) (retErr error) {
	dir := filepath.Join(r.root, "archive")
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return err
	}
	store, err := s3test.Run(filepath.Join(dir, "s3"))
	if err != nil {
		return err
	}
	defer store.Stop()
	os.Setenv("PADDOCK_ARCHIVE_ACCESS_KEY", s3test.AccessKey)
	os.Setenv("PADDOCK_ARCHIVE_SECRET_KEY", s3test.SecretKey)
	token := "archive-bench-" + fmt.Sprint(time.Now().UnixNano())
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		return err
	}
	arch := []string{"--archive-endpoint", store.Endpoint, "--archive-bucket", "bench"}
	var nodes []*archiveNode
	defer func() {
		for _, n := range nodes {
			retErr = errors.Join(retErr, n.uninstall(ctx))
		}
	}()
	pid := os.Getpid()
	for i, tag := range []string{"x", "y"} {
		addr, err := freeport.Addr()
		if err != nil {
			return err
		}
		n := &archiveNode{name: "bench-" + tag, tag: tag, addr: addr}
		root := filepath.Join(dir, tag)
		if err := os.MkdirAll(root, 0o711); err != nil {
			return err
		}
		extra := append([]string{"--listen", "tcp://" + addr, "--token-file", tokenFile, "--id-prefix", tag, "--node-name", n.name,
			"--network-name", fmt.Sprintf("pa%04x%d", pid&0xffff, i), "--network-subnet", freeSubnet(pid + 97 + i*13)}, arch...)
		if n.d, err = newDaemon(r.opts.bin, root, fmt.Sprintf("%s-arch%d", r.cgroupParent, i), uint32(1<<30+(pid%8)<<27)+uint32(i+1)<<23, extra...); err != nil {
			return err
		}
		nodes = append(nodes, n)
		if err := n.d.start(ctx); err != nil {
			return err
		}
	}
	nodesFile := filepath.Join(dir, "nodes.json")
	writeNodes := func(ns []*archiveNode) error {
		var recs []api.Node
		for _, n := range ns {
			recs = append(recs, api.Node{Name: n.name, Tag: n.tag, Address: "http://" + n.addr, State: api.NodeReady})
		}
		b, _ := json.Marshal(recs)
		if err := os.WriteFile(nodesFile+".tmp", b, 0o600); err != nil {
			return err
		}
		return os.Rename(nodesFile+".tmp", nodesFile)
	}
	if err := writeNodes(nodes); err != nil {
		return err
	}
	gwAddr, err := freeport.Addr()
	if err != nil {
		return err
	}
	gw := exec.Command(r.opts.bin, append([]string{"gateway", "--listen", "tcp://" + gwAddr, "--token-file", tokenFile,
		"--node-token-file", tokenFile, "--nodes-file", nodesFile}, arch...)...)
	logf, err := os.Create(filepath.Join(dir, "gateway.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	gw.Stdout, gw.Stderr = logf, logf
	gw.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := gw.Start(); err != nil {
		return err
	}
	defer func() { gw.Process.Signal(syscall.SIGTERM); gw.Wait() }()
	through, err := client.New("tcp://"+gwAddr, client.WithToken(token))
	if err != nil {
		return err
	}
	defer through.Close()
	x, err := client.New("tcp://"+nodes[0].addr, client.WithToken(token))
	if err != nil {
		return err
	}
	defer x.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := through.Version(ctx); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the gateway did not serve within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}

	sb, err := x.Create(ctx, api.CreateRequest{Resources: api.Resources{DiskBytes: 4 << 30}})
	if err != nil {
		return err
	}
	id := sb.ID
	sums, err := shOutput(ctx, x, id, "mkdir -p /root/data && cd /root/data && for i in 1 2 3 4; do head -c 268435456 /dev/urandom > f$i; done && sync && sha256sum f1 f2 f3 f4")
	if err != nil {
		return fmt.Errorf("writing 1 GiB: %w", err)
	}
	if _, err := x.Pause(ctx, id); err != nil {
		return err
	}
	r.idle(ctx)
	t0 := time.Now()
	if _, err := x.Archive(ctx, id); err != nil {
		return err
	}
	run.Archive = time.Since(t0)
	r.log.Info("archive: archived", "took", run.Archive)

	// Node x is gone for good.
	if err := nodes[0].d.stop(); err != nil {
		return err
	}
	if err := writeNodes(nodes[1:]); err != nil {
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		ns, err := through.Nodes(ctx)
		if err == nil && len(ns) == 1 {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the gateway did not take the new nodes file")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if out, err := exec.Command("du", "-sb", filepath.Join(dir, "s3", "data")).Output(); err == nil {
		fmt.Sscan(string(out), &run.Stored)
	}
	r.idle(ctx)
	t0 = time.Now()
	back, err := through.Resume(ctx, id)
	if err != nil {
		return fmt.Errorf("resume through the gateway: %w", err)
	}
	run.Restore = time.Since(t0)
	r.log.Info("archive: restored", "took", run.Restore)
	run.SameID = back.ID == id && back.State == api.StateRunning
	again, err := shOutput(ctx, through, id, "cd /root/data && sha256sum f1 f2 f3 f4")
	if err != nil {
		return err
	}
	run.Intact = again == sums
	y, err := client.New("tcp://"+nodes[1].addr, client.WithToken(token))
	if err != nil {
		return err
	}
	defer y.Close()
	if list, err := y.List(ctx, client.ListOptions{}); err == nil && len(list) == 1 && list[0].ID == id {
		run.NodeAfter = nodes[1].name
	}
	return nil
}

// shOutput runs a shell script in sandbox id through c and returns its
// stdout.
func shOutput(ctx context.Context, c *client.Client, id, script string) (string, error) {
	var out, errb strings.Builder
	cmd := []string{"sh", "-c", script}
	st, err := c.Exec(ctx, id, api.ExecRequest{Cmd: cmd}, client.ExecIO{Stdout: &out, Stderr: &errb})
	return out.String(), execResult(cmd, st, err, errb.String())
}

// uninstall removes every trace of the node: its sandboxes, storage,
// network, cgroups and directories (paddock serve --uninstall).
func (n *archiveNode) uninstall(ctx context.Context) error {
	if n.d.running() {
		if list, err := n.d.client.List(ctx, client.ListOptions{}); err == nil {
			for _, sb := range list {
				n.d.client.Delete(ctx, sb.ID, true)
			}
		}
	}
	n.d.stop()
	out, err := exec.CommandContext(ctx, n.d.bin, append(n.d.args, "--uninstall")...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("uninstalling node %s: %v: %s", n.name, err, out)
	}
	return nil
}
