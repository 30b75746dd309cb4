// Package execlog owns the daemon's copy of exec output: every process's
// stdout and stderr, kept on disk per sandbox within byte caps, so that
// `paddock logs ID [--exec PID] [--follow]` works after the process, the
// sandbox or the daemon has gone. The guest's output rings stay the live
// source; the daemon copies from them as the output arrives.
//
// Layout: <dir>/<sandbox>/records holds the sandbox's process records (a
// process's seq, pid, command and exit) as JSON lines, appended as they
// change; the last line for a seq is its record. <seq>.log holds process
// seq's newest output and <seq>.old.log the output before that. Each output record is a 16-byte
// header (stream, length, offset) and the bytes. Offsets count a
// process's output since it started, stdout and stderr together, as the
// guest counts them, so a reader can resume, and a copy can carry on
// after a daemon restart, where it left off.
//
// Caps: a process keeps at most MaxProcessBytes (its newest output: when
// its current segment is half that, it becomes the old one and the older
// output goes); a sandbox keeps at most MaxSandboxBytes, dropping the
// oldest processes' output first (finished ones entirely), and at most
// MaxProcesses process records. Writes are not fsynced: after a crash a
// torn last record is cut off. The logs live on the host's disk, outside
// every sandbox's disk cap, so all sandboxes together are bounded too:
// output is not kept (counted as dropped, like a ring's) while the logs'
// file system has less than MinFree free.
//
// A process's record is written to disk with its first output, at its
// exit, or when its writer asks (Save), whichever comes first, not when
// it starts: most processes end before there is anything else to keep.
// Until then the record lives in memory, where List and Find see it.
// Records are lines of one file rather than a file each: on ext4 making a
// file costs 0.2-0.4 ms of CPU (the inode allocator looks past recently
// deleted inodes), an append a few microseconds. The records file is
// rewritten without its stale lines once they outnumber the live ones by
// MaxProcesses.
package execlog

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/durable"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/reqcheck"
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
	Seq       uint64          `json:"seq"`
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

	mu    sync.Mutex
	boxes map[string]*sandbox

	space spaceCheck
}

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
	dir     string
	loaded  bool
	next    uint64
	procs   []*proc // by seq
	bytes   int64   // of every segment on disk
	removed bool
	dirMade bool // dir exists (made by saveRecord)
	lines   int  // in the records file
}

type proc struct {
	meta    Process
	old     segment
	cur     segment
	f       *os.File // the current segment, while a Writer writes it
	writer  bool     // a Writer holds it
	saved   bool     // its record is on disk
	changed chan struct{}
}

type segment struct {
	exists bool
	start  int64 // offset of its first byte
	size   int64 // file size
}

const hdrSize = 16

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
	return &Store{cfg: cfg, log: cfg.Logger, boxes: map[string]*sandbox{}}, nil
}

// box returns sandbox id's state, loaded from disk, locked.
func (s *Store) box(id string) (*sandbox, error) {
	if err := reqcheck.SandboxID("id", id); err != nil {
		return nil, err
	}
	s.mu.Lock()
	b := s.boxes[id]
	if b == nil {
		b = &sandbox{dir: filepath.Join(s.cfg.Dir, id), next: 1}
		s.boxes[id] = b
	}
	s.mu.Unlock()
	b.mu.Lock()
	if !b.loaded {
		if err := s.load(b); err != nil {
			b.mu.Unlock()
			return nil, fmt.Errorf("loading exec log of %s: %w", id, err)
		}
	}
	return b, nil
}

// paths are process seq's output segments.
func (b *sandbox) paths(seq uint64) (cur, old string) {
	n := filepath.Join(b.dir, strconv.FormatUint(seq, 10))
	return n + ".log", n + ".old.log"
}

func (b *sandbox) recordsPath() string { return filepath.Join(b.dir, "records") }

// load reads the records and segments a previous daemon left. Records
// of a daemon from before the records file, one <seq>.json each, are
// moved into it.
func (s *Store) load(b *sandbox) error {
	data, err := jsonl.ReadWhole(b.recordsPath(), true)
	if err != nil {
		return err
	}
	entries, err := os.ReadDir(b.dir)
	if errors.Is(err, os.ErrNotExist) {
		b.loaded = true
		return nil
	}
	if err != nil {
		return err
	}
	b.dirMade = true
	records := map[uint64]Process{}
	for line := range bytes.Lines(data) {
		var m Process
		if json.Unmarshal(line, &m) == nil && m.Seq > 0 {
			records[m.Seq] = m
		}
		b.lines++
	}
	var legacy []string
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		path := filepath.Join(b.dir, e.Name())
		legacy = append(legacy, path)
		var m Process
		data, err := os.ReadFile(path)
		if seq, perr := strconv.ParseUint(name, 10, 64); perr != nil || err != nil || json.Unmarshal(data, &m) != nil || m.Seq != seq {
			continue // a record cut by a crash
		}
		if _, ok := records[m.Seq]; !ok {
			records[m.Seq] = m
		}
	}
	for seq, meta := range records {
		p := &proc{meta: meta, changed: make(chan struct{}), saved: true}
		cur, old := b.paths(seq)
		var oldEnd, curEnd int64
		p.old, oldEnd = scanSegment(old, false)
		p.cur, curEnd = scanSegment(cur, true)
		// The record has End only once finished (or Skip went past the
		// last byte kept); the segments know it otherwise.
		p.meta.End = max(p.meta.End, oldEnd, curEnd)
		switch {
		case p.old.size > 0:
			p.meta.Start = p.old.start
		case p.cur.size > 0:
			p.meta.Start = p.cur.start
		default:
			p.meta.Start = p.meta.End
		}
		b.procs = append(b.procs, p)
		b.bytes += p.old.size + p.cur.size
		b.next = max(b.next, seq+1)
	}
	sort.Slice(b.procs, func(i, j int) bool { return b.procs[i].meta.Seq < b.procs[j].meta.Seq })
	b.loaded = true
	// The records file still has the lines of processes dropped for
	// MaxProcesses: drop them again. Unfinished ones stay, as they did.
	s.trimRecords(b, func(p *proc) bool { return p.meta.Exit == nil })
	if len(legacy) > 0 {
		if err := s.compact(b); err != nil {
			return err
		}
		for _, path := range legacy {
			s.remove(path)
		}
	}
	return nil
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
		if pos+hdrSize+n > info.Size() {
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

// Start records a new process of sandbox id and returns its Writer.
func (s *Store) Start(id string, pid int, cmd []string, started time.Time) (*Writer, error) {
	b, err := s.box(id)
	if err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	p := &proc{
		meta:    Process{Seq: b.next, PID: pid, Cmd: cmd, StartedAt: started.UTC()},
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
	if !w.p.old.exists && w.p.cur.size == 0 {
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
			cur, _ := b.paths(p.meta.Seq)
			f, err := os.OpenFile(cur, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
			if err != nil {
				return fmt.Errorf("writing exec log: %w", err)
			}
			p.f = f
			if !p.cur.exists || p.cur.size == 0 {
				p.cur = segment{exists: true, start: p.meta.End}
			}
		}
		var hdr [hdrSize]byte
		hdr[0] = byte(stream)
		binary.BigEndian.PutUint32(hdr[4:8], uint32(n))
		binary.BigEndian.PutUint64(hdr[8:], uint64(p.meta.End))
		w.buf = append(append(w.buf[:0], hdr[:]...), chunk...)
		if _, err := p.f.Write(w.buf); err != nil {
			return fmt.Errorf("writing exec log: %w", err)
		}
		if !p.old.exists && p.cur.size == 0 {
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

// rotate makes the current segment the old one; the caller holds b.mu.
func (w *Writer) rotate() error {
	b, p := w.b, w.p
	cur, old := b.paths(p.meta.Seq)
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

// saveRecord appends p's record to the records file, and rewrites the
// file when its stale lines outnumber the live ones by MaxProcesses. The
// caller holds b.mu.
func (s *Store) saveRecord(b *sandbox, p *proc) error {
	line, err := json.Marshal(p.meta)
	if err != nil {
		return err
	}
	// The directory is made with the first record, not at Start: making
	// it costs 0.2-0.7 ms on this host's ext4, and Start is on the path
	// of a sandbox's first output.
	if !b.dirMade {
		if err := os.MkdirAll(b.dir, 0o700); err != nil {
			return err
		}
		b.dirMade = true
	}
	if err := jsonl.Append(b.recordsPath(), append(line, '\n')); err != nil {
		return err
	}
	b.lines++
	if b.lines > 2*len(b.procs)+s.cfg.MaxProcesses {
		return s.compact(b)
	}
	return nil
}

// compact rewrites the records file with a line for each saved record:
// temp file and rename, so that it is whole. The caller holds b.mu.
func (s *Store) compact(b *sandbox) error {
	var data []byte
	lines := 0
	for _, p := range b.procs {
		if !p.saved {
			continue
		}
		line, err := json.Marshal(p.meta)
		if err != nil {
			return err
		}
		data = append(append(data, line...), '\n')
		lines++
	}
	if err := durable.Replace(b.recordsPath(), data, 0o600); err != nil {
		return fmt.Errorf("compacting exec log records: %w", err)
	}
	b.lines = lines
	return nil
}

// trimBytes drops the oldest output until the sandbox is within its cap:
// oldest process first, its old segment and then, if it has finished,
// its current one. The caller holds b.mu.
func (s *Store) trimBytes(b *sandbox) {
	for _, p := range b.procs {
		if b.bytes <= s.cfg.MaxSandboxBytes {
			return
		}
		cur, old := b.paths(p.meta.Seq)
		if p.old.exists {
			s.remove(old)
			b.bytes -= p.old.size
			p.old = segment{}
			p.meta.Start = p.cur.start
			if p.cur.size == 0 {
				p.meta.Start = p.meta.End
			}
		}
		if b.bytes > s.cfg.MaxSandboxBytes && !p.writer && p.cur.exists {
			s.remove(cur)
			b.bytes -= p.cur.size
			p.cur = segment{}
			p.meta.Start = p.meta.End
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
		cur, old := b.paths(p.meta.Seq)
		if p.cur.exists {
			s.remove(cur)
		}
		if p.old.exists {
			s.remove(old)
		}
		b.bytes -= p.old.size + p.cur.size
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

// Find returns the newest process of sandbox id with pid.
func (s *Store) Find(id string, pid int) (Process, error) {
	b, err := s.box(id)
	if err != nil {
		return Process{}, err
	}
	defer b.mu.Unlock()
	for i := len(b.procs) - 1; i >= 0; i-- {
		if b.procs[i].meta.PID == pid {
			return b.procs[i].meta, nil
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
		cur, old := b.paths(seq)
		fo, _ := os.Open(old)
		fc, _ := os.Open(cur)
		changed, finished := p.changed, p.meta.Exit != nil
		b.mu.Unlock()

		before := from
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

// readSegment calls fn with the records of f from offset from on and
// returns the offset after the last one it gave.
func readSegment(f *os.File, from int64, buf []byte, fn func(Chunk) error) (int64, []byte, error) {
	var (
		hdr [hdrSize]byte
		pos int64
	)
	for {
		if _, err := f.ReadAt(hdr[:], pos); err != nil {
			return from, buf, nil // the end, or a record being written
		}
		n, off := int64(binary.BigEndian.Uint32(hdr[4:8])), int64(binary.BigEndian.Uint64(hdr[8:]))
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
	}
	s.mu.Unlock()
	if err := os.RemoveAll(b.dir); err != nil {
		return fmt.Errorf("removing exec log: %w", err)
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
		if e.IsDir() && api.IsSandboxID(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
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
