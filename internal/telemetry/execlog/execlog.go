// Package execlog owns the daemon's copy of exec output: every process's
// stdout and stderr, kept on disk per sandbox within byte caps, so that
// `paddock logs ID [--exec PID] [--follow]` works after the process, the
// sandbox or the daemon has gone. The guest's output rings stay the live
// source; the daemon copies from them as the output arrives.
//
// Layout: <dir>/<sandbox>.log is the sandbox's log, an append-only file
// of frames: a 24-byte header (kind, stream, length, offset, seq) and a
// payload. A record frame holds a process's record (its seq, pid,
// command and exit) as JSON, written again as it changes: the last one for
// a seq is its record. An output frame holds a piece of a process's
// output, as long as the process has written at most inlineMax (16 KiB);
// past that its output moves to segment files of its own,
// <dir>/<sandbox>/<seq>.log for its newest output and <seq>.old.log for
// the output before that, each a run of 16-byte headers (stream, length,
// offset) and the bytes. Offsets count a process's output since it
// started, stdout and stderr together, as the guest counts them, so a
// reader can resume, and a copy can carry on after a daemon restart,
// where it left off.
//
// Why one file: on ext4 making a file costs 0.2-0.4 ms of CPU (the inode
// allocator looks past recently deleted inodes) and deleting it more,
// where an append costs a few microseconds. A sandbox's first `echo hi`
// used to make a directory, a records file and an output file, each
// deleted again with the sandbox: under churn that was 42% of the
// daemon's CPU. Now it makes the log alone, and removing the sandbox
// unlinks it; BenchmarkFirstExec measures the cycle (1 inode instead of
// 3, a fifth of the CPU). Most commands write far less than inlineMax,
// and the ones that write more are long enough for a file of their own
// not to matter; copying their first 16 KiB into it once is cheap.
// A removed sandbox's log is not deleted but emptied and kept as a
// spare (package spare), which the next sandbox's first frame takes, so
// that a short exec's cycle makes no inode at all. (Done first with a
// truncation by path, it measured slower: ext4 writes a file truncated
// to nothing back at its next close, which then came after the next
// sandbox's writes; spare truncates through a descriptor it closes at
// once.) A removal while a Read has the log open deletes it instead: the
// reader must not see the next sandbox's frames through it.
//
// Caps: a process keeps at most MaxProcessBytes (its newest output: when
// its current segment is half that, it becomes the old one and the older
// output goes); a sandbox keeps at most MaxSandboxBytes, dropping the
// oldest processes' output first (finished ones entirely), and at most
// MaxProcesses process records. Output dropped from the log, superseded
// records and dropped processes' frames are dead bytes: the log is
// rewritten without them (temp file and rename) once they pass both
// compactSlack and its live bytes. A finished process whose output was
// dropped has its record written again with Start at End, so that a
// restart does not revive the frames. Writes are not fsynced: after a
// crash a torn last frame or record is cut off, and a segment cut while
// output moved to it is dropped in favour of the log's frames. The logs
// live on the host's disk, outside every sandbox's disk cap, so all
// sandboxes together are bounded too: output is not kept (counted as
// dropped, like a ring's) while the logs' file system has less than
// MinFree free.
//
// A process's record is written to disk with its first output, at its
// exit, or when its writer asks (Save), whichever comes first, not when
// it starts: most processes end before there is anything else to keep.
// Until then the record lives in memory, where List and Find see it.
//
// Upgrade: a daemon from before the sandbox's log kept the records in
// <dir>/<sandbox>/records (JSON lines) or, older, one <seq>.json each.
// Loading a sandbox moves them into its log and removes them; segment
// files are where they were, so the output stays readable as it was.
package execlog

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/durable"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/reqcheck"
	"github.com/paddock-dev/paddock/internal/shrink"
	"github.com/paddock-dev/paddock/internal/spare"
	"github.com/paddock-dev/paddock/internal/telemetry/internal/gone"
	"github.com/paddock-dev/paddock/internal/telemetry/internal/jsonl"
	"github.com/paddock-dev/paddock/wire"
	"golang.org/x/sys/unix"
)

// Config configures a Store.
type Config struct {
	// Dir holds the logs; it is made if missing.
	Dir string
	// MaxProcessBytes caps one process's retained output. Default 8 MiB,
	// at least 64 KiB.
	MaxProcessBytes int64
	// MaxSandboxBytes caps a sandbox's retained output. Default 64 MiB,
	// at least MaxProcessBytes.
	MaxSandboxBytes int64
	// MaxProcesses caps the process records a sandbox keeps. Default 1024.
	MaxProcesses int
	// MinFree is what the logs leave free on their file system: below it
	// output is dropped rather than written. Default 1 GiB; negative
	// turns the check off.
	MinFree int64
	Logger  *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Process describes one process's retained output.
type Process struct {
	// Seq numbers a sandbox's processes from 1 in the order they started:
	// pids are reused, seqs are not.
	Seq uint64 `json:"seq"`
	// Container is the sandbox's container the process ran in, "" for
	// its first: each container numbers its processes on its own.
	Container string          `json:"container,omitempty"`
	PID       int             `json:"pid"`
	Cmd       []string        `json:"cmd"`
	StartedAt time.Time       `json:"started_at"`
	EndedAt   *time.Time      `json:"ended_at,omitempty"`
	Exit      *api.ExitStatus `json:"exit,omitempty"`
	// Start is the offset of the first byte kept (the bytes before were
	// dropped by the caps or never copied); End the offset after the last.
	Start int64 `json:"start"`
	End   int64 `json:"end"`
}

// Chunk is a piece of output given to Read's callback.
type Chunk struct {
	Stream wire.Type // wire.Stdout or wire.Stderr
	Offset int64
	Data   []byte // valid only during the call
}

// Store keeps exec output. It is safe for concurrent use.
type Store struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex
	boxes     map[string]*sandbox
	boxesPeak int // for shrink.Map

	space  spaceCheck
	spares *spare.Pool
	gone   gone.Set // removed sandboxes, whose stragglers are refused; under mu
}

// ErrRemoved: the sandbox's exec log was removed with the sandbox. A
// process recorded after that (an exec whose start the daemon records
// behind its answer, racing the sandbox's deletion) is a straggler of its
// teardown and is not recorded: it would make the log again, a file no
// sandbox owns (package gone).
var ErrRemoved = fmt.Errorf("%w: the sandbox's exec log was removed", errdefs.ErrNotFound)

// spaceCheck remembers whether the logs' file system was short of MinFree
// when last looked at: a statfs a second at most, not one per write.
type spaceCheck struct {
	mu      sync.Mutex
	checked time.Time
	short   bool
}

// spaceCheckEvery is how long a look at the free space stands.
const spaceCheckEvery = time.Second

// short reports whether the logs' file system has less than MinFree free,
// and logs when that changes.
func (s *Store) short() bool {
	if s.cfg.MinFree < 0 {
		return false
	}
	c := &s.space
	c.mu.Lock()
	defer c.mu.Unlock()
	now := s.cfg.Now()
	if !c.checked.IsZero() && now.Sub(c.checked) < spaceCheckEvery {
		return c.short
	}
	c.checked = now
	var st unix.Statfs_t
	if err := unix.Statfs(s.cfg.Dir, &st); err != nil {
		return c.short
	}
	free := int64(st.Bavail) * st.Bsize
	if short := free < s.cfg.MinFree; short != c.short {
		c.short = short
		if short {
			s.log.Warn("exec log: output dropped while its file system is short of space", "dir", s.cfg.Dir, "free", free, "min_free", s.cfg.MinFree)
		} else {
			s.log.Info("exec log: keeping output again", "dir", s.cfg.Dir, "free", free)
		}
	}
	return c.short
}

type sandbox struct {
	mu      sync.Mutex
	id      string
	loaded  bool
	next    uint64
	procs   []*proc // by seq
	bytes   int64   // of every segment and live output frame on disk
	removed bool
	dirMade bool  // the segments' directory exists
	size    int64 // of the sandbox's log file
	dead    int64 // bytes of the log that compact would drop
	readers int   // Reads holding the log open
}

type proc struct {
	meta    Process
	inline  []int64 // positions in the sandbox's log of its output frames
	inBytes int64   // their size, headers included
	spilled bool    // its output has gone to segments
	recSize int64   // of its newest record frame in the log
	old     segment
	cur     segment
	f       *os.File // the current segment, while a Writer writes it
	writer  bool     // a Writer holds it
	saved   bool     // its record is on disk
	changed chan struct{}
}

// kept is what the process keeps on disk.
func (p *proc) kept() int64 { return p.inBytes + p.old.size + p.cur.size }

type segment struct {
	exists bool
	start  int64 // offset of its first byte
	size   int64 // file size
}

const (
	hdrSize = 16 // of a segment's output record

	// A frame of the sandbox's log: kind, stream, 2 zero bytes, payload
	// length, offset (output frames) and seq, then the payload.
	frameHdr    = 24
	frameRecord = 'r' // the payload is a Process as JSON
	frameOutput = 'o'

	// inlineMax is how much of a process's output, frame headers
	// included, stays in the sandbox's log; past it the output moves to
	// segment files of its own. Most commands write far less.
	inlineMax = 16 << 10
	// compactSlack is how many dead bytes the log may hold beyond its
	// live ones before compact rewrites it.
	compactSlack = 64 << 10
)

// Open returns the store kept in cfg.Dir.
func Open(cfg Config) (*Store, error) {
	if cfg.Dir == "" {
		return nil, errdefs.Invalid("dir", "must be set")
	}
	if cfg.MaxProcessBytes == 0 {
		cfg.MaxProcessBytes = 8 << 20
	}
	if cfg.MaxSandboxBytes == 0 {
		cfg.MaxSandboxBytes = 64 << 20
	}
	if cfg.MaxProcesses == 0 {
		cfg.MaxProcesses = 1024
	}
	if cfg.MinFree == 0 {
		cfg.MinFree = 1 << 30
	}
	switch {
	case cfg.MaxProcessBytes < 64<<10:
		return nil, errdefs.Invalid("max_process_bytes", "must be at least 64 KiB, got %d", cfg.MaxProcessBytes)
	case cfg.MaxSandboxBytes < cfg.MaxProcessBytes:
		return nil, errdefs.Invalid("max_sandbox_bytes", "must be at least max_process_bytes, got %d", cfg.MaxSandboxBytes)
	case cfg.MaxProcesses < 1:
		return nil, errdefs.Invalid("max_processes", "must be positive, got %d", cfg.MaxProcesses)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("opening exec log: %w", err)
	}
	spares, err := spare.Open(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("opening exec log: %w", err)
	}
	return &Store{cfg: cfg, log: cfg.Logger, boxes: map[string]*sandbox{}, spares: spares}, nil
}

// box returns sandbox id's state, loaded from disk, locked.
func (s *Store) box(id string) (*sandbox, error) {
	if err := reqcheck.SandboxID("id", id); err != nil {
		return nil, err
	}
	s.mu.Lock()
	// Under s.mu, which Remove holds while it drops the box and adds id
	// to gone: no box is made for a removed sandbox.
	if s.gone.Has(id) {
		s.mu.Unlock()
		return nil, ErrRemoved
	}
	b := s.boxes[id]
	if b == nil {
		b = &sandbox{id: id, next: 1}
		s.boxes[id] = b
	}
	s.mu.Unlock()
	b.mu.Lock()
	if b.removed {
		b.mu.Unlock()
		return nil, ErrRemoved // removed while this waited for it
	}
	if !b.loaded {
		if err := s.load(b); err != nil {
			b.mu.Unlock()
			return nil, fmt.Errorf("loading exec log of %s: %w", id, err)
		}
	}
	return b, nil
}

// logPath is the sandbox's log: its records and small outputs.
func (s *Store) logPath(b *sandbox) string { return filepath.Join(s.cfg.Dir, b.id+".log") }

// dir holds the sandbox's segment files.
func (s *Store) dir(b *sandbox) string { return filepath.Join(s.cfg.Dir, b.id) }

// paths are process seq's output segments.
func (s *Store) paths(b *sandbox, seq uint64) (cur, old string) {
	n := filepath.Join(s.dir(b), strconv.FormatUint(seq, 10))
	return n + ".log", n + ".old.log"
}

// loaded is what load finds of one process in the sandbox's log.
type loaded struct {
	meta    Process
	recSize int64
	frames  []int64 // its output frames' positions
	inBytes int64
	start   int64 // offset of its first output frame's first byte
	end     int64 // after its last output frame's last byte
}

// load reads what a previous daemon left: the sandbox's log, and its
// segments. The records of a daemon from before the log (a records file
// of JSON lines in the segments' directory, or older, one <seq>.json
// each) are moved into it.
func (s *Store) load(b *sandbox) error {
	legacy, legacyPaths, err := s.loadLegacy(b)
	if err != nil {
		return err
	}
	procs, err := s.scanLog(b)
	if err != nil {
		return err
	}
	for seq, m := range legacy {
		l := procs[seq]
		if l == nil {
			l = &loaded{}
			procs[seq] = l
		}
		if l.recSize == 0 {
			l.meta = m
		}
	}
	for seq, l := range procs {
		// Seqs are not reused, even those of frames without a record: a
		// new process must not take them for its own.
		b.next = max(b.next, seq+1)
		if l.meta.Seq == 0 {
			// Output of a process whose record was dropped.
			b.dead += l.inBytes
			delete(procs, seq)
		}
	}
	for seq, l := range procs {
		p := &proc{meta: l.meta, changed: make(chan struct{}), saved: true, recSize: l.recSize}
		cur, old := s.paths(b, seq)
		var oldEnd, curEnd int64
		p.old, oldEnd = scanSegment(old, false)
		p.cur, curEnd = scanSegment(cur, true)
		if p.old.exists || p.cur.exists {
			if !p.old.exists && curEnd < l.end {
				// A crash cut the copy of its output to the segment.
				s.remove(cur)
				p.cur, curEnd = segment{}, 0
			} else {
				p.spilled = true
				b.dead += l.inBytes
			}
		}
		if !p.spilled {
			p.inline, p.inBytes = l.frames, l.inBytes
		}
		// The record has End only once finished (or Skip went past the
		// last byte kept); the output knows it otherwise.
		p.meta.End = max(p.meta.End, oldEnd, curEnd, l.end)
		switch {
		case p.old.size > 0:
			p.meta.Start = p.old.start
		case p.cur.size > 0:
			p.meta.Start = p.cur.start
		case p.inBytes > 0:
			p.meta.Start = l.start
		default:
			p.meta.Start = p.meta.End
		}
		b.procs = append(b.procs, p)
		b.bytes += p.kept()
		b.next = max(b.next, seq+1)
	}
	sort.Slice(b.procs, func(i, j int) bool { return b.procs[i].meta.Seq < b.procs[j].meta.Seq })
	b.loaded = true
	// The log still has the records of processes dropped for
	// MaxProcesses if the daemon stopped before compacting: drop them
	// again. Unfinished ones stay, as they did.
	s.trimRecords(b, func(p *proc) bool { return p.meta.Exit == nil })
	if len(legacyPaths) > 0 || b.dead > compactSlack {
		if err := s.compact(b); err != nil {
			return err
		}
	}
	for _, path := range legacyPaths {
		s.remove(path)
	}
	return nil
}

// loadLegacy reads the records of a daemon from before the sandbox's log
// and returns them with the files they came from.
func (s *Store) loadLegacy(b *sandbox) (map[uint64]Process, []string, error) {
	entries, err := os.ReadDir(s.dir(b))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	b.dirMade = true
	records := map[uint64]Process{}
	var paths []string
	for _, e := range entries {
		path := filepath.Join(s.dir(b), e.Name())
		if e.Name() == "records" {
			paths = append(paths, path)
			data, err := jsonl.ReadWhole(path, false)
			if err != nil {
				return nil, nil, err
			}
			for line := range bytes.Lines(data) {
				var m Process
				if json.Unmarshal(line, &m) == nil && m.Seq > 0 {
					records[m.Seq] = m
				}
			}
		}
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		path := filepath.Join(s.dir(b), e.Name())
		paths = append(paths, path)
		var m Process
		data, err := os.ReadFile(path)
		if seq, perr := strconv.ParseUint(name, 10, 64); perr != nil || err != nil || json.Unmarshal(data, &m) != nil || m.Seq != seq {
			continue // a record cut by a crash
		}
		if _, ok := records[m.Seq]; !ok {
			records[m.Seq] = m
		}
	}
	return records, paths, nil
}

// scanLog reads the sandbox's log: each process's newest record and its
// output frames. A torn last frame is cut off.
func (s *Store) scanLog(b *sandbox) (map[uint64]*loaded, error) {
	procs := map[uint64]*loaded{}
	f, err := os.Open(s.logPath(b))
	if errors.Is(err, os.ErrNotExist) {
		return procs, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	r := bufio.NewReaderSize(f, 64<<10)
	var (
		hdr [frameHdr]byte
		pos int64
		buf []byte
	)
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			break
		}
		n := int64(binary.BigEndian.Uint32(hdr[4:8]))
		off, seq := int64(binary.BigEndian.Uint64(hdr[8:16])), binary.BigEndian.Uint64(hdr[16:24])
		size := frameHdr + n
		if pos+size > info.Size() {
			break
		}
		l := procs[seq]
		if l == nil {
			l = &loaded{}
			procs[seq] = l
		}
		switch hdr[0] {
		case frameRecord:
			buf = slices.Grow(buf[:0], int(n))[:n]
			if _, err := io.ReadFull(r, buf); err != nil {
				return nil, err
			}
			var m Process
			if json.Unmarshal(buf, &m) != nil || m.Seq != seq {
				b.dead += size
				break
			}
			b.dead += l.recSize
			l.meta, l.recSize = m, size
		case frameOutput:
			if _, err := r.Discard(int(n)); err != nil {
				return nil, err
			}
			if !forward(off, n, l.end, len(l.frames) == 0) {
				// Output that overlaps what came before: a damaged
				// log. Reading it would give bytes twice.
				b.dead += size
				break
			}
			if len(l.frames) == 0 {
				l.start = off
			}
			l.frames = append(l.frames, pos)
			l.inBytes += size
			l.end = off + n
		default:
			b.dead += size
			if _, err := r.Discard(int(n)); err != nil {
				return nil, err
			}
		}
		pos += size
	}
	// Output frames older than the record's Start were dropped by the
	// caps (the record is saved again when they are).
	for _, l := range procs {
		if l.recSize > 0 && len(l.frames) > 0 && l.start < l.meta.Start {
			b.dead += l.inBytes
			l.frames, l.inBytes, l.end = nil, 0, 0
		}
	}
	if pos < info.Size() {
		if err := os.Truncate(s.logPath(b), pos); err != nil {
			return nil, err
		}
	}
	b.size = pos
	return procs, nil
}

// scanSegment finds a segment's start offset and the offset after its
// last whole record, cutting a torn record off the end if repair.
func scanSegment(path string, repair bool) (segment, int64) {
	f, err := os.Open(path)
	if err != nil {
		return segment{}, 0
	}
	defer f.Close()
	var (
		seg  = segment{exists: true}
		hdr  [hdrSize]byte
		pos  int64
		end  int64
		info os.FileInfo
	)
	info, err = f.Stat()
	if err != nil {
		return segment{}, 0
	}
	for first := true; ; first = false {
		if _, err := f.ReadAt(hdr[:], pos); err != nil {
			break
		}
		n, off := int64(binary.BigEndian.Uint32(hdr[4:8])), int64(binary.BigEndian.Uint64(hdr[8:]))
		if pos+hdrSize+n > info.Size() || !forward(off, n, end, first) {
			break
		}
		if first {
			seg.start = off
		}
		pos += hdrSize + n
		end = off + n
	}
	seg.size = pos
	if repair && pos < info.Size() {
		_ = os.Truncate(path, pos)
	}
	return seg, end
}

// forward reports whether output of n bytes at offset off may follow
// output that ended at end (anything may come first): offsets only
// grow, and a damaged or edited file must not make a reader give the
// same bytes twice or overflow an offset.
func forward(off, n, end int64, first bool) bool {
	return off >= 0 && off <= math.MaxInt64-n && (first || off >= end)
}

// appendFrame writes a frame at the end of the sandbox's log, making the
// log if it is empty and missing, and returns where it put it. The file
// is not kept open: a daemon with thousands of sandboxes would otherwise
// hold as many fds. A log with frames is not made again (a removed
// sandbox's stays removed), and opening it without O_CREAT spares the
// directory's lock, which every other sandbox's append takes too. The
// caller holds b.mu.
func (s *Store) appendFrame(b *sandbox, frame []byte) (int64, error) {
	flags := unix.O_WRONLY | unix.O_CLOEXEC
	if b.size == 0 {
		s.spares.Take(s.logPath(b)) // never over a log there
		flags |= unix.O_CREAT
	}
	fd, err := unix.Open(s.logPath(b), flags, 0o600)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: s.logPath(b), Err: err}
	}
	defer unix.Close(fd)
	pos := b.size
	for done := 0; done < len(frame); {
		n, err := unix.Pwrite(fd, frame[done:], pos+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, &os.PathError{Op: "write", Path: s.logPath(b), Err: err}
		}
		done += n
	}
	b.size += int64(len(frame))
	return pos, nil
}

// frame returns the header of a frame of the sandbox's log.
func frame(kind byte, stream wire.Type, seq uint64, off int64, n int) [frameHdr]byte {
	var hdr [frameHdr]byte
	hdr[0], hdr[1] = kind, byte(stream)
	binary.BigEndian.PutUint32(hdr[4:8], uint32(n))
	binary.BigEndian.PutUint64(hdr[8:16], uint64(off))
	binary.BigEndian.PutUint64(hdr[16:24], seq)
	return hdr
}

// Writer copies one process's output into the store. It is not safe for
// concurrent use.
type Writer struct {
	s   *Store
	b   *sandbox
	p   *proc
	buf []byte
}

// ProcessCap is how many of a process's newest output bytes are kept.
func (s *Store) ProcessCap() int64 { return s.cfg.MaxProcessBytes }

// Start records a new process of container container ("" for the first)
// of sandbox id and returns its Writer.
func (s *Store) Start(id, container string, pid int, cmd []string, started time.Time) (*Writer, error) {
	b, err := s.box(id)
	if err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	p := &proc{
		meta:    Process{Seq: b.next, Container: container, PID: pid, Cmd: cmd, StartedAt: started.UTC()},
		writer:  true,
		changed: make(chan struct{}),
	}
	b.next++
	b.procs = append(b.procs, p)
	s.trimRecords(b, writing)
	return &Writer{s: s, b: b, p: p}, nil
}

// Resume returns a Writer for process seq of sandbox id that has not
// finished: after a daemon restart, the copy carries on from Offset.
func (s *Store) Resume(id string, seq uint64) (*Writer, error) {
	b, err := s.box(id)
	if err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	p := b.find(seq)
	switch {
	case p == nil:
		return nil, errdefs.NotFound("exec log", fmt.Sprintf("%s/%d", id, seq))
	case p.meta.Exit != nil:
		return nil, errdefs.Conflict("process %d of %s has finished", seq, id)
	case p.writer:
		return nil, errdefs.Conflict("process %d of %s is being written", seq, id)
	}
	p.writer = true
	return &Writer{s: s, b: b, p: p}, nil
}

// Save writes the process's record to disk if it is not there yet.
func (w *Writer) Save() error {
	w.b.mu.Lock()
	defer w.b.mu.Unlock()
	return w.saveLocked()
}

func (w *Writer) saveLocked() error {
	if w.p.saved || w.b.removed {
		return nil
	}
	if err := w.s.saveRecord(w.b, w.p); err != nil {
		return fmt.Errorf("saving exec log record: %w", err)
	}
	w.p.saved = true
	return nil
}

// Seq is the process's number in the store.
func (w *Writer) Seq() uint64 { return w.p.meta.Seq }

// Offset is where the copy is: the next byte to write.
func (w *Writer) Offset() int64 {
	w.b.mu.Lock()
	defer w.b.mu.Unlock()
	return w.p.meta.End
}

// Skip records that n bytes of output were lost before they reached the
// copy (the guest's ring dropped them: its Dropped frame).
func (w *Writer) Skip(n int64) {
	if n <= 0 {
		return
	}
	w.b.mu.Lock()
	defer w.b.mu.Unlock()
	w.skipLocked(n)
}

func (w *Writer) skipLocked(n int64) {
	w.p.meta.End += n
	if w.p.kept() == 0 {
		w.p.meta.Start = w.p.meta.End
	}
}

// Write appends output of one stream (wire.Stdout or wire.Stderr).
func (w *Writer) Write(stream wire.Type, data []byte) error {
	b, p, s := w.b, w.p, w.s
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.removed {
		return errdefs.NotFound("exec log", "removed")
	}
	if err := w.saveLocked(); err != nil {
		return err
	}
	if s.short() {
		w.skipLocked(int64(len(data)))
		close(p.changed)
		p.changed = make(chan struct{})
		return nil
	}
	if !p.spilled && p.inBytes+frameHdr+int64(len(data)) <= inlineMax {
		if err := w.writeInline(stream, data); err != nil {
			return err
		}
		s.trimBytes(b)
		close(p.changed)
		p.changed = make(chan struct{})
		return nil
	}
	if !p.spilled {
		if err := w.spill(); err != nil {
			return err
		}
	}
	segMax := s.cfg.MaxProcessBytes / 2
	for len(data) > 0 {
		n := min(int64(len(data)), segMax/4)
		chunk := data[:n]
		data = data[n:]
		if p.cur.size > 0 && p.cur.size+hdrSize+n > segMax {
			if err := w.rotate(); err != nil {
				return err
			}
		}
		if p.f == nil {
			if err := w.openSegment(); err != nil {
				return err
			}
		}
		w.buf = appendRecord(w.buf[:0], stream, p.meta.End, chunk)
		if _, err := p.f.Write(w.buf); err != nil {
			return fmt.Errorf("writing exec log: %w", err)
		}
		if p.kept() == 0 {
			p.meta.Start = p.meta.End
		}
		p.cur.size += hdrSize + n
		b.bytes += hdrSize + n
		p.meta.End += n
	}
	s.trimBytes(b)
	close(p.changed)
	p.changed = make(chan struct{})
	return nil
}

// appendRecord appends a segment's output record to buf.
func appendRecord(buf []byte, stream wire.Type, off int64, data []byte) []byte {
	var hdr [hdrSize]byte
	hdr[0] = byte(stream)
	binary.BigEndian.PutUint32(hdr[4:8], uint32(len(data)))
	binary.BigEndian.PutUint64(hdr[8:], uint64(off))
	return append(append(buf, hdr[:]...), data...)
}

// writeInline appends output to the sandbox's log; the caller holds b.mu.
func (w *Writer) writeInline(stream wire.Type, data []byte) error {
	b, p := w.b, w.p
	hdr := frame(frameOutput, stream, p.meta.Seq, p.meta.End, len(data))
	w.buf = append(append(w.buf[:0], hdr[:]...), data...)
	pos, err := w.s.appendFrame(b, w.buf)
	if err != nil {
		return fmt.Errorf("writing exec log: %w", err)
	}
	if p.kept() == 0 {
		p.meta.Start = p.meta.End
	}
	p.inline = append(p.inline, pos)
	p.inBytes += int64(len(w.buf))
	b.bytes += int64(len(w.buf))
	p.meta.End += int64(len(data))
	return nil
}

// openSegment opens the process's current segment for appending, making
// the sandbox's directory and the file if they are missing; the caller
// holds b.mu.
func (w *Writer) openSegment() error {
	b, p := w.b, w.p
	if !b.dirMade {
		if err := os.MkdirAll(w.s.dir(b), 0o700); err != nil {
			return fmt.Errorf("writing exec log: %w", err)
		}
		b.dirMade = true
	}
	cur, _ := w.s.paths(b, p.meta.Seq)
	f, err := os.OpenFile(cur, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("writing exec log: %w", err)
	}
	p.f = f
	if !p.cur.exists || p.cur.size == 0 {
		p.cur = segment{exists: true, start: p.meta.End}
	}
	return nil
}

// spill moves the process's output from the sandbox's log to its
// current segment, which the output goes to from now on; the caller holds
// b.mu. The frames left in the log are dead: a restart that finds the
// segment holding all they held knows so.
func (w *Writer) spill() error {
	b, p := w.b, w.p
	var data []byte
	if len(p.inline) > 0 {
		f, err := os.Open(w.s.logPath(b))
		if err != nil {
			return fmt.Errorf("moving exec log output: %w", err)
		}
		defer f.Close()
		for _, pos := range p.inline {
			c, err := readFrame(f, pos, w.buf)
			if err != nil {
				return fmt.Errorf("moving exec log output: %w", err)
			}
			w.buf = c.Data[:0]
			data = appendRecord(data, c.Stream, c.Offset, c.Data)
		}
	}
	if err := w.openSegment(); err != nil {
		return err
	}
	if len(data) > 0 {
		p.cur = segment{exists: true, start: p.meta.Start}
		if _, err := p.f.Write(data); err != nil {
			return fmt.Errorf("moving exec log output: %w", err)
		}
		p.cur.size = int64(len(data))
	}
	b.bytes += p.cur.size - p.inBytes
	b.dead += p.inBytes
	p.inline, p.inBytes, p.spilled = nil, 0, true
	return nil
}

// rotate makes the current segment the old one; the caller holds b.mu.
func (w *Writer) rotate() error {
	b, p := w.b, w.p
	cur, old := w.s.paths(b, p.meta.Seq)
	if p.f != nil {
		p.f.Close()
		p.f = nil
	}
	if err := os.Rename(cur, old); err != nil {
		return fmt.Errorf("rotating exec log: %w", err)
	}
	b.bytes -= p.old.size
	p.old, p.cur = p.cur, segment{}
	p.meta.Start = p.old.start
	return nil
}

// Finish records the process's exit and ends the Writer.
func (w *Writer) Finish(exit api.ExitStatus) error {
	b, p := w.b, w.p
	b.mu.Lock()
	defer b.mu.Unlock()
	if p.f != nil {
		p.f.Close()
		p.f = nil
	}
	p.writer = false
	now := w.s.cfg.Now().UTC()
	p.meta.Exit, p.meta.EndedAt = &exit, &now
	close(p.changed)
	p.changed = make(chan struct{})
	if b.removed {
		return nil
	}
	if err := w.s.saveRecord(b, p); err != nil {
		return fmt.Errorf("finishing exec log: %w", err)
	}
	p.saved = true
	w.s.trimRecords(b, writing)
	return nil
}

// Close ends the Writer without an exit (the daemon is stopping; Resume
// carries on), saving the record first.
func (w *Writer) Close() error {
	w.b.mu.Lock()
	defer w.b.mu.Unlock()
	if w.p.f != nil {
		w.p.f.Close()
		w.p.f = nil
	}
	w.p.writer = false
	return w.saveLocked()
}

// saveRecord appends p's record to the sandbox's log, and compacts the
// log when its dead bytes outnumber the live ones. The caller holds b.mu.
func (s *Store) saveRecord(b *sandbox, p *proc) error {
	line, err := json.Marshal(p.meta)
	if err != nil {
		return err
	}
	hdr := frame(frameRecord, 0, p.meta.Seq, 0, len(line))
	if _, err := s.appendFrame(b, append(hdr[:], line...)); err != nil {
		return err
	}
	b.dead += p.recSize
	p.recSize = frameHdr + int64(len(line))
	if b.dead > compactSlack && b.dead > b.size-b.dead {
		return s.compact(b)
	}
	return nil
}

// compact rewrites the sandbox's log with the newest record of each saved
// process and the output kept in it: temp file and rename, so that it is
// whole, and so that a reader holding the old file reads on undisturbed.
// The caller holds b.mu.
func (s *Store) compact(b *sandbox) error {
	var old *os.File
	defer func() {
		if old != nil {
			old.Close()
		}
	}()
	var (
		data []byte
		buf  []byte
		pos  = map[*proc][]int64{}
	)
	for _, p := range b.procs {
		if !p.saved {
			continue
		}
		line, err := json.Marshal(p.meta)
		if err != nil {
			return err
		}
		hdr := frame(frameRecord, 0, p.meta.Seq, 0, len(line))
		data = append(append(data, hdr[:]...), line...)
		for _, at := range p.inline {
			if old == nil {
				if old, err = os.Open(s.logPath(b)); err != nil {
					return fmt.Errorf("compacting exec log: %w", err)
				}
			}
			c, err := readFrame(old, at, buf)
			if err != nil {
				return fmt.Errorf("compacting exec log: %w", err)
			}
			buf = c.Data[:0]
			pos[p] = append(pos[p], int64(len(data)))
			hdr := frame(frameOutput, c.Stream, p.meta.Seq, c.Offset, len(c.Data))
			data = append(append(data, hdr[:]...), c.Data...)
		}
	}
	if err := durable.Replace(s.logPath(b), data, 0o600); err != nil {
		return fmt.Errorf("compacting exec log: %w", err)
	}
	for _, p := range b.procs {
		if p.saved {
			line, _ := json.Marshal(p.meta)
			p.recSize = frameHdr + int64(len(line))
			p.inline = pos[p]
		}
	}
	b.size, b.dead = int64(len(data)), 0
	return nil
}

// trimBytes drops the oldest output until the sandbox is within its cap:
// oldest process first, its old segment and then, if it has finished,
// its current one or its output in the log. A finished process whose
// output went has its record saved again, so that a restart does not
// take the frames left in the log for kept output. The caller holds b.mu.
func (s *Store) trimBytes(b *sandbox) {
	for _, p := range b.procs {
		if b.bytes <= s.cfg.MaxSandboxBytes {
			return
		}
		cur, old := s.paths(b, p.meta.Seq)
		if p.old.exists {
			s.remove(old)
			b.bytes -= p.old.size
			p.old = segment{}
			p.meta.Start = p.cur.start
			if p.cur.size == 0 {
				p.meta.Start = p.meta.End
			}
		}
		if b.bytes <= s.cfg.MaxSandboxBytes || p.writer {
			continue
		}
		dropped := p.cur.exists || p.inBytes > 0
		if p.cur.exists {
			s.remove(cur)
			b.bytes -= p.cur.size
			p.cur = segment{}
		}
		if p.inBytes > 0 {
			b.bytes -= p.inBytes
			b.dead += p.inBytes
			p.inline, p.inBytes = nil, 0
		}
		if dropped {
			p.meta.Start = p.meta.End
			if p.saved {
				if err := s.saveRecord(b, p); err != nil {
					s.log.Warn("saving exec log record", "sandbox", b.id, "err", err)
				}
			}
		}
	}
}

// trimRecords drops the oldest processes beyond MaxProcesses, except those
// keep says to keep.
func (s *Store) trimRecords(b *sandbox, keep func(*proc) bool) {
	for len(b.procs) > s.cfg.MaxProcesses {
		i := 0
		for i < len(b.procs) && keep(b.procs[i]) {
			i++
		}
		if i == len(b.procs) {
			return
		}
		p := b.procs[i]
		// Most short commands wrote nothing, so have no files: not
		// looking for them saves two unlinks per exec in a sandbox at
		// its record limit.
		cur, old := s.paths(b, p.meta.Seq)
		if p.cur.exists {
			s.remove(cur)
		}
		if p.old.exists {
			s.remove(old)
		}
		b.bytes -= p.kept()
		b.dead += p.recSize + p.inBytes
		b.procs = append(b.procs[:i], b.procs[i+1:]...)
	}
}

// writing keeps the processes whose output is being copied.
func writing(p *proc) bool { return p.writer }

func (s *Store) remove(path string) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("removing exec log", "path", path, "err", err)
	}
}

func (b *sandbox) find(seq uint64) *proc {
	i := sort.Search(len(b.procs), func(i int) bool { return b.procs[i].meta.Seq >= seq })
	if i < len(b.procs) && b.procs[i].meta.Seq == seq {
		return b.procs[i]
	}
	return nil
}

// List returns sandbox id's processes, oldest first.
func (s *Store) List(id string) ([]Process, error) {
	b, err := s.box(id)
	if err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	out := make([]Process, len(b.procs))
	for i, p := range b.procs {
		out[i] = p.meta
	}
	return out, nil
}

// Find returns the newest process with pid of container container ("" for
// the first) of sandbox id.
func (s *Store) Find(id, container string, pid int) (Process, error) {
	b, err := s.box(id)
	if err != nil {
		return Process{}, err
	}
	defer b.mu.Unlock()
	for i := len(b.procs) - 1; i >= 0; i-- {
		if m := b.procs[i].meta; m.PID == pid && m.Container == container {
			return m, nil
		}
	}
	return Process{}, errdefs.NotFound("exec log of process", strconv.Itoa(pid))
}

// Read calls fn with process seq's output from offset from on, in order.
// A first chunk whose Offset is past from means the bytes between were
// dropped. With follow, Read waits for more output until the process
// finishes or ctx ends; without, it returns at the end of what is kept.
func (s *Store) Read(ctx context.Context, id string, seq uint64, from int64, follow bool, fn func(Chunk) error) error {
	buf := make([]byte, 64<<10)
	for {
		b, err := s.box(id)
		if err != nil {
			return err
		}
		p := b.find(seq)
		if p == nil {
			b.mu.Unlock()
			return errdefs.NotFound("exec log", fmt.Sprintf("%s/%d", id, seq))
		}
		var (
			fl     *os.File
			inline []int64
		)
		if len(p.inline) > 0 {
			if fl, _ = os.Open(s.logPath(b)); fl != nil {
				b.readers++
			}
			inline = slices.Clone(p.inline)
		}
		cur, old := s.paths(b, seq)
		fo, _ := os.Open(old)
		fc, _ := os.Open(cur)
		changed, finished := p.changed, p.meta.Exit != nil
		b.mu.Unlock()

		before := from
		if fl != nil {
			from, buf, err = readInline(fl, inline, from, buf, fn)
			fl.Close()
			b.mu.Lock()
			b.readers--
			b.mu.Unlock()
			if err != nil {
				closeAll(fo, fc)
				return err
			}
		}
		for _, f := range []*os.File{fo, fc} {
			if f == nil {
				continue
			}
			from, buf, err = readSegment(f, from, buf, fn)
			f.Close()
			if err != nil {
				if fc != nil && f != fc {
					fc.Close()
				}
				return err
			}
		}
		switch {
		case !follow:
			return nil
		case from != before:
			continue // read again: more may have come meanwhile
		case finished:
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// closeAll closes the files that are open.
func closeAll(fs ...*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}

// readFrame reads the output frame at pos of a sandbox's log into buf
// (grown if need be).
func readFrame(f *os.File, pos int64, buf []byte) (Chunk, error) {
	var hdr [frameHdr]byte
	if _, err := f.ReadAt(hdr[:], pos); err != nil {
		return Chunk{}, err
	}
	n := int(binary.BigEndian.Uint32(hdr[4:8]))
	data := slices.Grow(buf[:0], n)[:n]
	if _, err := f.ReadAt(data, pos+frameHdr); err != nil {
		return Chunk{}, err
	}
	return Chunk{Stream: wire.Type(hdr[1]), Offset: int64(binary.BigEndian.Uint64(hdr[8:16])), Data: data}, nil
}

// readInline calls fn with the output frames at positions inline of a
// sandbox's log from offset from on and returns the offset after the
// last one it gave.
func readInline(f *os.File, inline []int64, from int64, buf []byte, fn func(Chunk) error) (int64, []byte, error) {
	for _, pos := range inline {
		c, err := readFrame(f, pos, buf)
		if err != nil {
			return from, buf, err
		}
		buf = c.Data[:0]
		end := c.Offset + int64(len(c.Data))
		if end <= from {
			continue
		}
		skip := max(0, from-c.Offset)
		c.Offset += skip
		c.Data = c.Data[skip:]
		if err := fn(c); err != nil {
			return from, buf, err
		}
		from = end
	}
	return from, buf, nil
}

// readSegment calls fn with the records of f from offset from on and
// returns the offset after the last one it gave.
func readSegment(f *os.File, from int64, buf []byte, fn func(Chunk) error) (int64, []byte, error) {
	var (
		hdr [hdrSize]byte
		pos int64
		end int64
	)
	for first := true; ; first = false {
		if _, err := f.ReadAt(hdr[:], pos); err != nil {
			return from, buf, nil // the end, or a record being written
		}
		n, off := int64(binary.BigEndian.Uint32(hdr[4:8])), int64(binary.BigEndian.Uint64(hdr[8:]))
		if !forward(off, n, end, first) {
			return from, buf, nil // damaged from here on (scanSegment stops here too)
		}
		end = off + n
		if off+n <= from {
			pos += hdrSize + n
			continue
		}
		if int64(cap(buf)) < n {
			buf = make([]byte, n)
		}
		data := buf[:n]
		if _, err := f.ReadAt(data, pos+hdrSize); err != nil {
			if err == io.EOF {
				return from, buf, nil
			}
			return from, buf, err
		}
		skip := max(0, from-off)
		if err := fn(Chunk{Stream: wire.Type(hdr[0]), Offset: off + skip, Data: data[skip:]}); err != nil {
			return from, buf, err
		}
		from = off + n
		pos += hdrSize + n
	}
}

// Remove deletes sandbox id's output (the sandbox was deleted).
func (s *Store) Remove(id string) error {
	b, err := s.box(id)
	if errors.Is(err, ErrRemoved) {
		return nil // removed already
	}
	if err != nil {
		return err
	}
	defer b.mu.Unlock()
	for _, p := range b.procs {
		if p.f != nil {
			p.f.Close()
			p.f = nil
		}
		close(p.changed)
		p.changed = make(chan struct{})
	}
	b.removed, b.procs, b.bytes = true, nil, 0
	s.mu.Lock()
	if s.boxes[id] == b {
		delete(s.boxes, id)
		s.boxes = shrink.Map(s.boxes, &s.boxesPeak)
	}
	s.gone.Add(id)
	s.mu.Unlock()
	if b.readers > 0 || !s.spares.Give(s.logPath(b), spare.Truncate) {
		if err := os.Remove(s.logPath(b)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing exec log: %w", err)
		}
	}
	if b.dirMade {
		if err := os.RemoveAll(s.dir(b)); err != nil {
			return fmt.Errorf("removing exec log: %w", err)
		}
	}
	return nil
}

// IDs lists the sandboxes with output on disk, for the daemon's reconcile.
func (s *Store) IDs() ([]string, error) {
	entries, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("listing exec logs: %w", err)
	}
	var ids []string
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".log")
		if e.IsDir() {
			id, ok = e.Name(), true
		}
		if ok && api.IsSandboxID(id) {
			ids = append(ids, id)
		}
	}
	// A sandbox may have both a log and a directory of segments.
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

// Bytes is what sandbox id's output takes on disk.
func (s *Store) Bytes(id string) (int64, error) {
	b, err := s.box(id)
	if err != nil {
		return 0, err
	}
	defer b.mu.Unlock()
	return b.bytes, nil
}
