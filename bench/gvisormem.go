package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// Issue 23, bar 3: a memory pause of a sandbox whose Python process holds
// 512 MiB.
const (
	memPauseRounds   = 3
	memPauseHeld     = 512 << 20
	memPauseMax      = 2 * time.Second
	memPauseRatioMax = 0.6
	memResumeMax     = 500 * time.Millisecond
)

// memHolder holds HELD bytes (the hex of random bytes: text with 4 bits
// of entropy a byte, made a MiB at a time: the process's peak is what it
// holds) and answers on port 8000 with its pid and a count of the
// requests it served, kept in its memory (holderScript fills it in);
// on /crc, uncounted, with the CRC-32 of the bytes it holds.
const memHolder = `import http.server, os, zlib
held = bytearray(HELD)
for i in range(0, len(held), 1 << 20):
    held[i:i + (1 << 20)] = os.urandom(1 << 19).hex().encode()
open("/root/held", "w").write("yes")
hits = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global hits
        if self.path == "/crc":
            b = ("crc %08x\n" % zlib.crc32(held)).encode()
        else:
            hits += 1
            b = ("pid %d hits %d held %d\n" % (os.getpid(), hits, len(held))).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()
`

// holderScript is memHolder holding n bytes.
func holderScript(n int64) string { return strings.Replace(memHolder, "HELD", fmt.Sprint(n), 1) }

// benchMemoryPause adds the memory pause rows to the gvisor section.
func (r *rig) benchMemoryPause(ctx context.Context, s *section) {
	s.Method = append(s.Method,
		fmt.Sprintf("**memory pause** (bar 3, %d rounds, one sandbox each): a gvisor sandbox (2 GiB memory limit) runs a Python HTTP server holding %s (the hex of random bytes, 4 bits of entropy a byte) and a count of the requests it served. **pause**: `client.Pause` (the guest reads /proc/meminfo and closes its control socket, `runsc pause`, `runsc checkpoint --leave-running --compression none` onto the sandbox's disk, its paused kernel sent a SIGKILL, its network slot detached; the answer comes then). **compressed**: from the answer until the sandbox's record says its checkpoint is compressed (the processes' exit, which frees their memory, and their cgroup's removal, `runsc delete`, then packed into a squashfs image of zstd blocks, its fastest level, on every core, then the root's unmount, all behind the answer); **checkpoint**: its size on disk then (allocated blocks), against the %s the process holds and against the cgroup's memory use. **resume → answering**: from `client.Resume` to the server's first answer through a forwarded port (the image's sums checked and the image mounted while `runsc create` starts the sandbox, `runsc restore --background` from the mounted image: nothing is expanded first, the kernel expands the blocks runsc reads and the pages load while the processes run, one read at a time per two cores; the guest binding its socket again, the port forward, the request). The server must answer with the same pid and its count one up, and then (untimed, its pages loaded) with the same CRC-32 of the bytes it holds as before the pause.", memPauseRounds, mib(memPauseHeld), mib(memPauseHeld)))
	var pauses, squeezes, resumes []time.Duration
	var ckpt, mem []int64
	continued := true
	for i := 0; i < memPauseRounds; i++ {
		p, sq, rs, ck, m, ok, err := r.memoryPauseRound(ctx)
		if err != nil {
			s.Err = fmt.Errorf("memory pause, round %d: %w", i+1, err)
			break
		}
		pauses, squeezes, resumes = append(pauses, p), append(squeezes, sq), append(resumes, rs)
		ckpt, mem = append(ckpt, ck), append(mem, m)
		continued = continued && ok
	}
	if len(pauses) == 0 {
		return
	}
	t := table{Header: []string{"memory pause (512 MiB held)", "n", "median", "p90", "min", "max"}}
	for _, row := range []struct {
		name string
		d    []time.Duration
	}{{"pause", pauses}, {"compressed (after the pause's answer)", squeezes}, {"resume → answering", resumes}} {
		sm := summarize(row.d)
		t.add(row.name, fmt.Sprint(sm.N), ms(sm.Median), ms(sm.P90), ms(sm.Min), ms(sm.Max))
	}
	s.Tables = append(s.Tables, t)
	ck, m := medianBytes(ckpt), medianBytes(mem)
	s.Tables = append(s.Tables, table{Header: []string{"checkpoint (median)", "on disk", "÷ held", "÷ cgroup memory"},
		Rows: [][]string{{"zstd fastest, compressed", mib(ck), ratio(time.Duration(ck), memPauseHeld), ratio(time.Duration(ck), time.Duration(m)) + " (" + mib(m) + ")"}}})
	pm, rm := summarize(pauses).Median, summarize(resumes).Median
	s.Bars = append(s.Bars,
		bar{Issue: 23, What: "memory pause of a sandbox holding 512 MiB (median)", Target: "≤ " + ms(memPauseMax), Value: ms(pm), Verdict: check(pm <= memPauseMax)},
		bar{Issue: 23, What: "its checkpoint on disk ÷ the 512 MiB held (median)", Target: fmt.Sprintf("≤ %.1f×", memPauseRatioMax), Value: ratio(time.Duration(ck), memPauseHeld), Verdict: check(float64(ck) <= memPauseRatioMax*memPauseHeld)},
		bar{Issue: 23, What: "resume → the process answering (median)", Target: "≤ " + ms(memResumeMax), Value: ms(rm), Verdict: check(rm <= memResumeMax)},
		bar{Issue: 23, What: "the process continues where it stopped (same pid, its count one up, the CRC-32 of its memory unchanged)", Target: "every round", Value: fmt.Sprint(continued), Verdict: check(continued)},
	)
}

// benchGvisorMem is the memory pause rows alone (bar 3).
func benchGvisorMem(ctx context.Context, r *rig) *section {
	s := &section{}
	if os.Getenv("PADDOCK_RUNSC") == "" {
		s.Skip = "PADDOCK_RUNSC is not set (make bench builds runsc and sets it)"
		return s
	}
	r.benchMemoryPause(ctx, s)
	return s
}

func medianBytes(v []int64) int64 {
	d := make([]time.Duration, len(v))
	for i, b := range v {
		d[i] = time.Duration(b)
	}
	return int64(summarize(d).Median)
}

// memoryPauseRound makes a sandbox holding memHolder's memory, pauses
// and resumes it once, and removes it.
func (r *rig) memoryPauseRound(ctx context.Context) (pause, squeeze, resume time.Duration, ckpt, mem int64, continued bool, err error) {
	sb, err := r.client.Create(ctx, api.CreateRequest{Runtime: "gvisor", Resources: api.Resources{MemoryBytes: 2 << 30}})
	if err != nil {
		return
	}
	r.track(sb.ID)
	defer func() {
		if rerr := r.remove(ctx, sb.ID); err == nil {
			err = rerr
		}
	}()
	if err = r.startHolder(ctx, sb.ID, memPauseHeld); err != nil {
		return
	}
	before, err := r.askHolder(ctx, sb.ID)
	if err != nil {
		return
	}
	crcBefore, err := r.askHolderPath(ctx, sb.ID, "/crc")
	if err != nil {
		return
	}
	r.idle(ctx)
	t0 := time.Now()
	paused, err := r.client.Pause(ctx, sb.ID)
	if err != nil {
		return
	}
	pause = time.Since(t0)
	if paused.Paused == nil || !paused.Paused.Memory {
		return 0, 0, 0, 0, 0, false, fmt.Errorf("the pause kept no memory: %+v", paused.Paused)
	}
	info := paused.Paused
	for info.Compressing {
		if time.Since(t0) > 5*time.Minute {
			return 0, 0, 0, 0, 0, false, fmt.Errorf("the checkpoint was not compressed within 5 minutes")
		}
		time.Sleep(10 * time.Millisecond)
		sb, err := r.client.Get(ctx, sb.ID)
		if err != nil {
			return 0, 0, 0, 0, 0, false, err
		}
		if info = sb.Paused; info == nil || !info.Memory {
			return 0, 0, 0, 0, 0, false, fmt.Errorf("the paused sandbox lost its checkpoint: %+v", info)
		}
	}
	squeeze = time.Since(t0) - pause
	ckpt, mem = info.CheckpointBytes, info.MemoryBytes
	r.idle(ctx)
	t0 = time.Now()
	if _, err = r.client.Resume(ctx, sb.ID); err != nil {
		return
	}
	after, err := r.askHolder(ctx, sb.ID)
	if err != nil {
		return
	}
	resume = time.Since(t0)
	// The memory it holds, once its pages have loaded (not timed).
	crcAfter, err := r.askHolderPath(ctx, sb.ID, "/crc")
	if err != nil {
		return
	}
	// "pid P hits N held H"
	b, a := strings.Fields(before), strings.Fields(after)
	continued = len(b) == 6 && len(a) == 6 && a[1] == b[1] && a[3] == fmt.Sprint(atoi(b[3])+1) && a[5] == fmt.Sprint(memPauseHeld) &&
		strings.HasPrefix(crcBefore, "crc ") && crcAfter == crcBefore
	return
}

// startHolder starts memHolder holding n bytes in sandbox id and waits
// until it holds them.
func (r *rig) startHolder(ctx context.Context, id string, n int64) error {
	if _, err := r.client.WriteFile(ctx, id, "/root/holder.py", strings.NewReader(holderScript(n)), client.WriteOptions{}); err != nil {
		return err
	}
	if _, err := r.client.StartProcess(ctx, id, api.StartRequest{Cmd: []string{"python3", "/root/holder.py"}}); err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		st, err := r.client.Exec(ctx, id, api.ExecRequest{Cmd: []string{"test", "-e", "/root/held"}}, client.ExecIO{})
		if err == nil && st.ExitCode == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the holder did not take its memory: %v %+v", err, st)
		}
		time.Sleep(time.Second)
	}
}

// askHolder asks memHolder for its pid and count through a forwarded
// port, the forward opened once, the request tried until it is answered
// (for 30 s).
func (r *rig) askHolder(ctx context.Context, id string) (string, error) {
	return r.askHolderPath(ctx, id, "/")
}

// askHolderPath is askHolder's request of path.
func (r *rig) askHolderPath(ctx context.Context, id, path string) (string, error) {
	addr, err := r.client.ForwardPort(ctx, id, 8000)
	if err != nil {
		return "", err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + path)
		if err == nil {
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode == http.StatusOK {
				return strings.TrimSpace(string(b)), nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the holder does not answer: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func atoi(s string) int {
	var n int
	fmt.Sscan(s, &n)
	return n
}

// Issue 23, bar 4: fork ×10 of a sandbox with a 256 MiB running process.
const (
	memForkCount = 10
	memForkHeld  = 256 << 20
)

// benchGvisorFork forks a gvisor sandbox whose process holds
// memForkHeld memForkCount times, its processes kept (issue 23, bar 4).
func benchGvisorFork(ctx context.Context, r *rig) *section {
	s := &section{}
	if os.Getenv("PADDOCK_RUNSC") == "" {
		s.Skip = "PADDOCK_RUNSC is not set (make bench builds runsc and sets it)"
		return s
	}
	s.Method = append(s.Method,
		fmt.Sprintf("**memory fork** (bar 4, one round): a gvisor sandbox (2 GiB memory limit) runs the memory pause's server holding %s; `client.Fork(count: %d)` (the source's guest closes its control socket, `runsc pause`, `runsc checkpoint --leave-running --compression none` into a snapshot directory, its disk captured (reflink) while the kernel is paused, then the saved kernel killed and the source restored from that checkpoint into its own slot (`runsc restore --background`), its guest answering again, then the checkpoint packed (squashfs, zstd blocks on every core) and synced; then %d × (a disk clone, a network slot, the pack mounted, `runsc restore --background` of that one checkpoint), 4 at a time). **fork call**: the client's call; **all answering**: from the call to the last fork's server answering through a forwarded port, each with the source's pid, its count one up and the %s it holds. **disk growth**: the storage filesystem's used space (statfs) after the fork less before read once all answer (the fork's checkpoint is unlinked by then, but its blocks stay until the forks' background page loads, which read from it, have ended; its size is beside it).",
			mib(memForkHeld), memForkCount, memForkCount, mib(memForkHeld)))
	res, err := r.memoryFork(ctx)
	if err != nil {
		s.Err = err
		return s
	}
	s.Tables = append(s.Tables, table{
		Header: []string{fmt.Sprintf("fork ×%d, %s held", memForkCount, mib(memForkHeld)), "value"},
		Rows: [][]string{
			{"fork call", ms(res.call)},
			{"source stopped (checkpoint + disk capture + its restore)", ms(res.stopped)},
			{"call → all forks answering", ms(res.answering)},
			{"checkpoint (compressed, unlinked after the fork)", mib(res.checkpoint)},
			{"disk growth (storage used after − before)", mib(res.growth)},
			{"forks running the process (same pid, count one up)", fmt.Sprintf("%d of %d", res.running, memForkCount)},
		},
	})
	ok := res.running == memForkCount
	s.Bars = append(s.Bars,
		bar{Issue: 23, What: fmt.Sprintf("fork ×%d of a sandbox with a %s running process: all running with it", memForkCount, mib(memForkHeld)), Target: "all", Value: fmt.Sprintf("%d of %d", res.running, memForkCount), Verdict: check(ok)},
		bar{Issue: 23, What: fmt.Sprintf("fork ×%d: call → all answering; disk growth", memForkCount), Target: "reported", Value: ms(res.answering) + "; " + mib(res.growth), Verdict: reported},
	)
	return s
}

// forkResult is what memoryFork measured.
type forkResult struct {
	call, stopped, answering time.Duration
	checkpoint, growth       int64
	running                  int
}

// memoryFork makes a sandbox holding memForkHeld, forks it
// memForkCount times, asks each fork's server, and removes them all.
func (r *rig) memoryFork(ctx context.Context) (res forkResult, err error) {
	sb, err := r.client.Create(ctx, api.CreateRequest{Runtime: "gvisor", Resources: api.Resources{MemoryBytes: 2 << 30}})
	if err != nil {
		return res, err
	}
	r.track(sb.ID)
	made := []string{sb.ID}
	defer func() {
		for _, id := range made {
			if rerr := r.remove(ctx, id); err == nil {
				err = rerr
			}
		}
	}()
	if err = r.startHolder(ctx, sb.ID, memForkHeld); err != nil {
		return res, err
	}
	before, err := r.askHolder(ctx, sb.ID)
	if err != nil {
		return res, err
	}
	storage := filepath.Join(r.root, "state", "storage")
	used0, err := usedBytes(storage)
	if err != nil {
		return res, err
	}
	r.idle(ctx)
	t0 := time.Now()
	fr, err := r.client.Fork(ctx, sb.ID, api.ForkRequest{Count: memForkCount})
	if err != nil {
		return res, err
	}
	res.call = time.Since(t0)
	for _, f := range fr.Sandboxes {
		r.track(f.ID)
		made = append(made, f.ID)
	}
	if fr.Memory == nil {
		return res, fmt.Errorf("the fork kept no memory")
	}
	res.stopped = time.Duration(fr.FrozenMS * float64(time.Millisecond))
	res.checkpoint = fr.Memory.CheckpointBytes
	b := strings.Fields(before) // "pid P hits N held H"
	for _, f := range fr.Sandboxes {
		got, err := r.askHolder(ctx, f.ID)
		if err != nil {
			return res, fmt.Errorf("fork %s: %w", f.ID, err)
		}
		a := strings.Fields(got)
		if len(b) == 6 && len(a) == 6 && a[1] == b[1] && a[3] == fmt.Sprint(atoi(b[3])+1) && a[5] == fmt.Sprint(memForkHeld) {
			res.running++
		}
	}
	res.answering = time.Since(t0)
	used1, err := usedBytes(storage)
	if err != nil {
		return res, err
	}
	res.growth = used1 - used0
	return res, nil
}

// usedBytes is the space used on the filesystem of path.
func usedBytes(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, nil
}
