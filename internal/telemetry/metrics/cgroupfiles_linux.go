package metrics

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// CgroupDirs are a group's directories: on v1 one per controller (they
// may be the same directory where controllers are co-mounted), on v2 the
// same directory in every field.
type CgroupDirs struct {
	Mode                      cgroup.Mode
	CPU, CPUAcct, Memory, Pid string
}

// GroupDirs are g's directories, as the cgroup manager of mode placed it.
func GroupDirs(mode cgroup.Mode, g *cgroup.Group) CgroupDirs {
	return CgroupDirs{Mode: mode, CPU: g.ControllerDir("cpu"), CPUAcct: g.ControllerDir("cpuacct"),
		Memory: g.ControllerDir("memory"), Pid: g.ControllerDir("pids")}
}

// The control files CgroupFiles reads, by what they hold.
const (
	fCPU       = iota // v1 cpuacct.usage; v2 cpu.stat (usage and throttling)
	fThrottled        // v1 cpu.stat
	fMem              // v1 memory.usage_in_bytes; v2 memory.current
	fPeak             // v1 memory.max_usage_in_bytes; v2 memory.peak (5.19+)
	fLimit            // v1 memory.limit_in_bytes; v2 memory.max
	fOOM              // v1 memory.oom_control; v2 memory.events (oom_kill and max)
	fFailcnt          // v1 memory.failcnt
	fFailcntSw        // v1 memory.memsw.failcnt: with swap accounted, paddock's equal memory+swap limit is the one hit
	fPressure         // v2 memory.pressure
	fStat             // memory.stat
	fPids             // pids.current
	fPidsMax          // pids.max
	nFiles
)

// CgroupFiles reads a group's counters through control files it keeps
// open: each read is one pread(2) from offset 0, which makes the kernel
// regenerate the file. On the development VM that is about 2 µs a file
// against 10 µs for open, read and close, which is what keeps sampling 200
// sandboxes a second under 1% of a core. It holds up to 11 descriptors
// (v1; 9 on v2); Close releases them.
//
// It also reads what the autoscaler needs and cgroup.Stats lacks: v1
// memory.failcnt and memory.memsw.failcnt (summed), v2 memory.events "max" and memory.pressure, and the
// inactive page cache from memory.stat (read only while usage is at
// least half the limit: it is the dearest file).
//
// A group whose CPU time has not moved since the last read is quiet: its
// tasks did not run, so nothing they charge (memory, pids, OOM kills,
// throttling) moved either, but for what the kernel frees behind them
// (a process's pages uncharged after it exited) and what is charged to
// the group without its CPU (socket buffers filled by the network).
// After quietFull quiet reads, a read of a quiet group takes only its
// CPU time and its limits, which the daemon may change, and keeps the
// rest from the last full read; every quietEvery-th quiet read is full.
// A thousand idle sandboxes cost the daemon 6.5% of a core, two thirds
// of it these reads (issue 21).
//
// CgroupFiles is not safe for concurrent use: the sampler calls it from
// its one goroutine.
type CgroupFiles struct {
	mode cgroup.Mode
	fds  [nFiles]int
	buf  []byte // lent by cgroupBufs while ReadCgroup runs

	read1 bool    // a read was made
	cpu   uint64  // CPU time at the last read
	quiet int     // reads since the CPU time last moved
	kept  charged // the last full read's
}

// Quiet reads: see CgroupFiles.
const (
	quietFull  = 3
	quietEvery = 10
)

// charged is what a Reading holds that only the group's own running
// moves.
type charged struct {
	throttled, failcnt, stall, oom  uint64
	memory, peak, reclaimable, pids int64
}

func (k *charged) save(r *Reading) {
	*k = charged{r.CPUThrottledNanos, r.MemoryFailcnt, r.MemoryStallNanos, r.OOMKills,
		r.MemoryBytes, r.MemoryPeakBytes, r.MemoryReclaimableBytes, r.Pids}
}

func (k *charged) restore(r *Reading) {
	r.CPUThrottledNanos, r.MemoryFailcnt, r.MemoryStallNanos, r.OOMKills = k.throttled, k.failcnt, k.stall, k.oom
	r.MemoryBytes, r.MemoryPeakBytes, r.MemoryReclaimableBytes, r.Pids = k.memory, k.peak, k.reclaimable, k.pids
}

// skip reports whether a read whose CPU time is cpu may keep the charged
// fields of the last full read.
func (c *CgroupFiles) skip(cpu uint64) bool {
	if !c.read1 || cpu != c.cpu {
		c.read1, c.cpu, c.quiet = true, cpu, 0
		return false
	}
	c.quiet++
	return c.quiet > quietFull && c.quiet%quietEvery != 0
}

// cgroupBufs lends CgroupFiles their read buffer for one ReadCgroup: the
// sampler reads one group at a time, and a buffer kept by each group (2
// KiB) was a tenth of what the daemon held per idle sandbox (issue 21).
var cgroupBufs = sync.Pool{New: func() any {
	b := make([]byte, 0, 2048)
	return &b
}}

// OpenCgroupFiles opens the control files in dirs. A file the kernel does
// not have (v2 memory.peak before 5.19, a controller not enabled) is
// skipped and its fields read as zero; a missing group fails with an
// error wrapping errdefs.ErrNotFound.
func OpenCgroupFiles(dirs CgroupDirs) (*CgroupFiles, error) {
	c := &CgroupFiles{mode: dirs.Mode}
	for i := range c.fds {
		c.fds[i] = -1
	}
	var paths [nFiles]string
	switch dirs.Mode {
	case cgroup.V1:
		paths = [nFiles]string{
			fCPU:       dirs.CPUAcct + "/cpuacct.usage",
			fThrottled: dirs.CPU + "/cpu.stat",
			fMem:       dirs.Memory + "/memory.usage_in_bytes",
			fPeak:      dirs.Memory + "/memory.max_usage_in_bytes",
			fLimit:     dirs.Memory + "/memory.limit_in_bytes",
			fOOM:       dirs.Memory + "/memory.oom_control",
			fFailcnt:   dirs.Memory + "/memory.failcnt",
			fFailcntSw: dirs.Memory + "/memory.memsw.failcnt",
			fStat:      dirs.Memory + "/memory.stat",
			fPids:      dirs.Pid + "/pids.current",
			fPidsMax:   dirs.Pid + "/pids.max",
		}
	case cgroup.V2:
		d := dirs.Memory
		paths = [nFiles]string{
			fCPU:      d + "/cpu.stat",
			fMem:      d + "/memory.current",
			fPeak:     d + "/memory.peak",
			fLimit:    d + "/memory.max",
			fOOM:      d + "/memory.events",
			fPressure: d + "/memory.pressure",
			fStat:     d + "/memory.stat",
			fPids:     d + "/pids.current",
			fPidsMax:  d + "/pids.max",
		}
	default:
		return nil, errdefs.Invalid("mode", "unknown cgroup mode %v", dirs.Mode)
	}
	for i, p := range paths {
		if p == "" {
			continue
		}
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		switch {
		case err == nil:
			c.fds[i] = fd
		case err == unix.ENOENT && i != fCPU:
			// Not on this kernel or controller not enabled.
		case err == unix.ENOENT:
			c.Close()
			return nil, fmt.Errorf("opening cgroup files: %w", errdefs.NotFound("cgroup", p))
		default:
			c.Close()
			return nil, fmt.Errorf("opening cgroup files: %w", &os.PathError{Op: "open", Path: p, Err: err})
		}
	}
	return c, nil
}

// Has reports whether the group has memory and pids counters: a v2 group
// whose parent enables no controllers for it has cpu.stat alone.
func (c *CgroupFiles) Has() (memory, pids bool) {
	return c.fds[fMem] >= 0, c.fds[fPids] >= 0
}

// LocalOOM reports whether the group's OOM kill count leaves out its
// children's: v1 counts a memory event in its own group only.
func (c *CgroupFiles) LocalOOM() bool { return c.mode == cgroup.V1 }

// Close releases the descriptors.
func (c *CgroupFiles) Close() error {
	for i, fd := range c.fds {
		if fd >= 0 {
			unix.Close(fd)
			c.fds[i] = -1
		}
	}
	return nil
}

// read regenerates file i into c.buf; ok is false if the file is not open.
func (c *CgroupFiles) read(i int) (ok bool, err error) {
	fd := c.fds[i]
	if fd < 0 {
		return false, nil
	}
	b := c.buf[:cap(c.buf)]
	for {
		n, err := unix.Pread(fd, b, 0)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.ENODEV || err == unix.ENOENT:
			return false, fmt.Errorf("%w: the cgroup was removed", errdefs.ErrNotFound)
		case err != nil:
			return false, err
		case n == len(b):
			// memory.stat can outgrow the buffer on big machines.
			c.buf = make([]byte, 0, 2*len(b))
			b = c.buf[:cap(c.buf)]
			continue
		}
		c.buf = b[:n]
		return true, nil
	}
}

var _ CgroupReader = (*CgroupFiles)(nil)

// ReadCgroup implements CgroupReader.
func (c *CgroupFiles) ReadCgroup(r *Reading) error {
	bp := cgroupBufs.Get().(*[]byte)
	c.buf = *bp
	defer func() {
		*bp, c.buf = c.buf[:0], nil // grown, perhaps (memory.stat)
		cgroupBufs.Put(bp)
	}()
	v2 := c.mode == cgroup.V2
	quiet := false
	for i := 0; i < nFiles; i++ {
		if quiet && i != fLimit && i != fPidsMax {
			continue
		}
		// memory.stat is the dearest file by far, and the inactive cache
		// only matters to the autoscaler near a limit.
		if i == fStat && (r.MemoryLimitBytes == 0 || r.MemoryBytes < r.MemoryLimitBytes/2) {
			continue
		}
		ok, err := c.read(i)
		if err != nil {
			return fmt.Errorf("reading cgroup: %w", err)
		}
		if !ok {
			continue
		}
		b := c.buf
		switch i {
		case fCPU:
			if v2 {
				r.CPUNanos = keyed(b, "usage_usec") * 1000
				r.CPUThrottledNanos = keyed(b, "throttled_usec") * 1000
			} else {
				r.CPUNanos = uint64(number(b))
			}
		case fThrottled:
			r.CPUThrottledNanos = keyed(b, "throttled_time")
		case fMem:
			r.MemoryBytes = number(b)
		case fPeak:
			r.MemoryPeakBytes = number(b)
		case fLimit:
			r.MemoryLimitBytes = limit(b)
		case fOOM:
			r.OOMKills = keyed(b, "oom_kill")
			if v2 {
				r.MemoryFailcnt = keyed(b, "max")
			}
		case fFailcnt, fFailcntSw:
			r.MemoryFailcnt += uint64(number(b))
		case fPressure:
			// "some avg10=0.00 avg60=0.00 avg300=0.00 total=N" (µs)
			if line, _, _ := bytes.Cut(b, []byte{'\n'}); bytes.HasPrefix(line, []byte("some ")) {
				if _, v, ok := bytes.Cut(line, []byte("total=")); ok {
					r.MemoryStallNanos = uint64(number(v)) * 1000
				}
			}
		case fStat:
			if v2 {
				r.MemoryReclaimableBytes = int64(keyed(b, "inactive_file"))
			} else {
				r.MemoryReclaimableBytes = int64(keyed(b, "total_inactive_file"))
			}
		case fPids:
			r.Pids = number(b)
		case fPidsMax:
			r.PidsLimit = limit(b)
		}
		if i == fCPU {
			quiet = c.skip(r.CPUNanos)
		}
	}
	if quiet {
		c.kept.restore(r)
	} else {
		c.kept.save(r)
	}
	return nil
}

// keyed finds "key N" on a line of a flat keyed file; 0 if absent.
func keyed(b []byte, key string) uint64 {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if len(line) > len(key) && line[len(key)] == ' ' && string(line[:len(key)]) == key {
			return uint64(number(line[len(key)+1:]))
		}
	}
	return 0
}

// number parses the decimal number at the start of b (after blanks),
// without allocating; what is not a number reads as 0, and "-1" too.
func number(b []byte) int64 {
	b = bytes.TrimLeft(b, " \t")
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			break
		}
		if n > (math.MaxInt64-9)/10 {
			return math.MaxInt64
		}
		n = n*10 + int64(c-'0')
	}
	return n
}

// limit parses a limit file: "max" and v1's page-rounded huge values
// mean unlimited, 0.
func limit(b []byte) int64 {
	if bytes.HasPrefix(b, []byte("max")) {
		return 0
	}
	if n := number(b); n < 1<<62 {
		return n
	}
	return 0
}
