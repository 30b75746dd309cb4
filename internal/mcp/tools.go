package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

const (
	// maxOutput caps each of an exec's stdout and stderr kept for the
	// result; streamed progress carries all of it.
	maxOutput = 1 << 20
	// maxRead caps a read_file answer.
	maxRead = 8 << 20
	// defaultExecTimeout applies when the client names none: a tool call
	// should not hang forever.
	defaultExecTimeout = 300
	// progressEvery batches streamed output into notifications.
	progressEvery = 50 * time.Millisecond
)

type tools struct {
	cfg Config
	c   *client.Client
}

// target is the sandbox a call is for: the named one, checked against the
// server's scope, or the scope's own when none is named.
func (t *tools) target(id string) (string, error) {
	id = strings.TrimSpace(id)
	switch {
	case t.cfg.Sandbox != "" && id == "":
		return t.cfg.Sandbox, nil
	case t.cfg.Sandbox != "" && id != t.cfg.Sandbox:
		return "", fmt.Errorf("sandbox %q: %w (it serves only %s)", id, ErrScope, t.cfg.Sandbox)
	case id == "":
		return "", errors.New("sandbox: required (a sandbox id)")
	}
	return id, nil
}

func (t *tools) register(s *sdk.Server) {
	scoped := t.cfg.Sandbox != ""
	if !scoped {
		sdk.AddTool(s, &sdk.Tool{Name: "create", Description: "Create a sandbox from an image, a template or a snapshot, with limits and a network policy preset. Returns its id."}, t.create)
		sdk.AddTool(s, &sdk.Tool{Name: "list", Description: "List sandboxes, optionally those with some labels."}, t.list)
		sdk.AddTool(s, &sdk.Tool{Name: "delete", Description: "Delete a sandbox and everything in it."}, t.delete)
		sdk.AddTool(s, &sdk.Tool{Name: "fork", Description: "Make running copies of a sandbox (its files and memory state as of now)."}, t.fork)
	}
	sdk.AddTool(s, &sdk.Tool{Name: "exec", Description: "Run a command in a sandbox and return its exit code, stdout and stderr. With a progress token, output streams as progress notifications."}, t.exec)
	sdk.AddTool(s, &sdk.Tool{Name: "read_file", Description: "Read a file of a sandbox (UTF-8 text, or base64 for binary)."}, t.readFile)
	sdk.AddTool(s, &sdk.Tool{Name: "write_file", Description: "Write a file in a sandbox (atomically; parent directories are made)."}, t.writeFile)
	sdk.AddTool(s, &sdk.Tool{Name: "list_files", Description: "List a directory of a sandbox."}, t.listFiles)
	sdk.AddTool(s, &sdk.Tool{Name: "search_files", Description: "Find files of a sandbox under a directory by name (a glob) and/or content (a substring; each matching line is a result), with bounded results and bytes read."}, t.searchFiles)
	sdk.AddTool(s, &sdk.Tool{Name: "snapshot", Description: "Snapshot a sandbox's files; a new sandbox can be created from the snapshot id."}, t.snapshot)
	sdk.AddTool(s, &sdk.Tool{Name: "pause", Description: "Pause a sandbox (its processes stop; memory is kept)."}, t.pause)
	sdk.AddTool(s, &sdk.Tool{Name: "resume", Description: "Resume a paused sandbox."}, t.resume)
	sdk.AddTool(s, &sdk.Tool{Name: "logs", Description: "The exec log: the processes run in a sandbox, how they ended, and optionally the tail of one's output."}, t.logs)
	sdk.AddTool(s, &sdk.Tool{Name: "stats", Description: "A sandbox's state and current resource use against its limits."}, t.stats)
	sdk.AddTool(s, &sdk.Tool{Name: "denials", Description: "The network requests the sandbox's egress policy refused, newest last."}, t.denials)
	sdk.AddTool(s, &sdk.Tool{Name: "requests", Description: "Egress requests: hosts a sandbox asked a person for, and the answers (pending, approved, denied, expired). Listing only: a person decides with `paddock requests approve`."}, t.requests)
	if t.cfg.AllowPolicyChanges {
		sdk.AddTool(s, &sdk.Tool{Name: "set_policy", Description: "Replace a sandbox's allow rules and presets (secret bindings and deny rules are kept)."}, t.setPolicy)
	}
}

// SandboxRef names the sandbox a tool acts on.
type SandboxRef struct {
	Sandbox string `json:"sandbox,omitempty" jsonschema:"the sandbox id (optional on a server started for one sandbox)"`
}

// Sandbox is what the tools say about a sandbox. It leaves out the
// environment, which may hold what the creator did not mean to share.
type Sandbox struct {
	ID        string            `json:"id"`
	State     string            `json:"state"`
	Image     string            `json:"image"`
	Labels    map[string]string `json:"labels,omitempty"`
	CPUs      float64           `json:"cpus,omitempty"`
	Memory    int64             `json:"memory_bytes,omitempty"`
	Disk      int64             `json:"disk_bytes,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
}

func sandboxOf(sb *api.Sandbox) Sandbox {
	return Sandbox{
		ID: sb.ID, State: string(sb.State), Image: sb.Image, Labels: sb.Labels,
		CPUs: sb.Resources.CPUs, Memory: sb.Resources.MemoryBytes, Disk: sb.Resources.DiskBytes,
		CreatedAt: sb.CreatedAt,
	}
}

// CreateIn is the create tool's input.
type CreateIn struct {
	Image          string            `json:"image,omitempty" jsonschema:"an image name (default: the daemon's default image)"`
	From           string            `json:"from,omitempty" jsonschema:"a template name or snapshot id to start from instead of a bare image"`
	CPUs           float64           `json:"cpus,omitempty" jsonschema:"CPU quota in cores, e.g. 0.5"`
	MemoryMB       int64             `json:"memory_mb,omitempty" jsonschema:"memory cap in MiB"`
	DiskMB         int64             `json:"disk_mb,omitempty" jsonschema:"writable disk cap in MiB"`
	TimeoutSeconds int64             `json:"timeout_seconds,omitempty" jsonschema:"lifetime; the sandbox is removed when it is up (0: none)"`
	Labels         map[string]string `json:"labels,omitempty"`
	Presets        []string          `json:"presets,omitempty" jsonschema:"network policy presets to allow (e.g. pypi, npm); nothing else is reachable"`
	Allow          []string          `json:"allow,omitempty" jsonschema:"extra allow rules (domains, CIDRs, URLs); only on a server started with --allow-policy-changes"`
}

func (t *tools) create(ctx context.Context, _ *sdk.CallToolRequest, in CreateIn) (*sdk.CallToolResult, Sandbox, error) {
	if in.CPUs < 0 || in.MemoryMB < 0 || in.DiskMB < 0 || in.TimeoutSeconds < 0 {
		return nil, Sandbox{}, errors.New("cpus, memory_mb, disk_mb and timeout_seconds must not be negative")
	}
	if len(in.Allow) > 0 && !t.cfg.AllowPolicyChanges {
		return nil, Sandbox{}, errors.New("allow: this server may not widen policies (start it with --allow-policy-changes); use presets")
	}
	req := api.CreateRequest{
		Image:          in.Image,
		From:           in.From,
		Resources:      api.Resources{CPUs: in.CPUs, MemoryBytes: in.MemoryMB << 20, DiskBytes: in.DiskMB << 20},
		TimeoutSeconds: in.TimeoutSeconds,
		Labels:         in.Labels,
	}
	if len(in.Presets) > 0 || len(in.Allow) > 0 {
		p := &api.Policy{Presets: in.Presets}
		for _, a := range in.Allow {
			p.Allow = append(p.Allow, api.PolicyRule{Match: a})
		}
		req.Policy = p
	}
	sb, err := t.c.Create(ctx, req)
	if err != nil {
		return nil, Sandbox{}, fmt.Errorf("creating sandbox: %w", err)
	}
	return nil, sandboxOf(sb), nil
}

// ListIn is the list tool's input.
type ListIn struct {
	Labels map[string]string `json:"labels,omitempty" jsonschema:"only sandboxes with all these labels"`
}

// ListOut is the list tool's output.
type ListOut struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

func (t *tools) list(ctx context.Context, _ *sdk.CallToolRequest, in ListIn) (*sdk.CallToolResult, ListOut, error) {
	sbs, err := t.c.List(ctx, client.ListOptions{Labels: in.Labels})
	if err != nil {
		return nil, ListOut{}, fmt.Errorf("listing sandboxes: %w", err)
	}
	out := ListOut{Sandboxes: make([]Sandbox, 0, len(sbs))}
	for i := range sbs {
		out.Sandboxes = append(out.Sandboxes, sandboxOf(&sbs[i]))
	}
	return nil, out, nil
}

// Done is the output of tools that only act.
type Done struct {
	Sandbox string `json:"sandbox"`
	State   string `json:"state,omitempty"`
}

func (t *tools) delete(ctx context.Context, _ *sdk.CallToolRequest, in SandboxRef) (*sdk.CallToolResult, Done, error) {
	id, err := t.target(in.Sandbox)
	if err != nil {
		return nil, Done{}, err
	}
	if err := t.c.Delete(ctx, id, true); err != nil {
		return nil, Done{}, fmt.Errorf("deleting %s: %w", id, err)
	}
	return nil, Done{Sandbox: id, State: "deleted"}, nil
}

func (t *tools) pause(ctx context.Context, _ *sdk.CallToolRequest, in SandboxRef) (*sdk.CallToolResult, Done, error) {
	return t.lifecycle(ctx, in, "pausing", t.c.Pause)
}

func (t *tools) resume(ctx context.Context, _ *sdk.CallToolRequest, in SandboxRef) (*sdk.CallToolResult, Done, error) {
	return t.lifecycle(ctx, in, "resuming", t.c.Resume)
}

func (t *tools) lifecycle(ctx context.Context, in SandboxRef, what string, f func(context.Context, string) (*api.Sandbox, error)) (*sdk.CallToolResult, Done, error) {
	id, err := t.target(in.Sandbox)
	if err != nil {
		return nil, Done{}, err
	}
	sb, err := f(ctx, id)
	if err != nil {
		return nil, Done{}, fmt.Errorf("%s %s: %w", what, id, err)
	}
	return nil, Done{Sandbox: id, State: string(sb.State)}, nil
}

// ForkIn is the fork tool's input.
type ForkIn struct {
	SandboxRef
	Count  int               `json:"count,omitempty" jsonschema:"how many copies, 1 to 64 (default 1)"`
	Labels map[string]string `json:"labels,omitempty"`
}

// ForkOut is the fork tool's output.
type ForkOut struct {
	Sandboxes []Sandbox `json:"sandboxes"`
	FrozenMS  float64   `json:"frozen_ms"`
}

func (t *tools) fork(ctx context.Context, _ *sdk.CallToolRequest, in ForkIn) (*sdk.CallToolResult, ForkOut, error) {
	id, err := t.target(in.Sandbox)
	if err != nil {
		return nil, ForkOut{}, err
	}
	res, err := t.c.Fork(ctx, id, api.ForkRequest{Count: in.Count, Labels: in.Labels})
	if err != nil {
		return nil, ForkOut{}, fmt.Errorf("forking %s: %w", id, err)
	}
	out := ForkOut{FrozenMS: res.FrozenMS, Sandboxes: make([]Sandbox, 0, len(res.Sandboxes))}
	for i := range res.Sandboxes {
		out.Sandboxes = append(out.Sandboxes, sandboxOf(&res.Sandboxes[i]))
	}
	return nil, out, nil
}

// SnapshotIn is the snapshot tool's input.
type SnapshotIn struct {
	SandboxRef
	Path   string            `json:"path,omitempty" jsonschema:"capture only this directory"`
	Labels map[string]string `json:"labels,omitempty"`
}

// SnapshotOut is the snapshot tool's output.
type SnapshotOut struct {
	ID      string `json:"id" jsonschema:"the snapshot id; create from it with from"`
	Sandbox string `json:"sandbox"`
	Path    string `json:"path,omitempty"`
}

func (t *tools) snapshot(ctx context.Context, _ *sdk.CallToolRequest, in SnapshotIn) (*sdk.CallToolResult, SnapshotOut, error) {
	id, err := t.target(in.Sandbox)
	if err != nil {
		return nil, SnapshotOut{}, err
	}
	snap, err := t.c.Snapshot(ctx, id, api.SnapshotRequest{Path: in.Path, Labels: in.Labels})
	if err != nil {
		return nil, SnapshotOut{}, fmt.Errorf("snapshotting %s: %w", id, err)
	}
	return nil, SnapshotOut{ID: snap.ID, Sandbox: snap.Sandbox, Path: snap.Path}, nil
}

// ExecIn is the exec tool's input.
type ExecIn struct {
	SandboxRef
	Cmd            []string          `json:"cmd" jsonschema:"the argv; cmd[0] is looked up in PATH. For a shell line use [\"sh\",\"-c\",\"...\"]"`
	Cwd            string            `json:"cwd,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	Stdin          string            `json:"stdin,omitempty"`
	TimeoutSeconds int64             `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this long (default 300)"`
}

// ExecOut is the exec tool's output.
type ExecOut struct {
	ExitCode  int    `json:"exit_code"`
	Signal    string `json:"signal,omitempty"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	OOMKilled bool   `json:"oom_killed,omitempty"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	// Truncated says stdout or stderr was longer than the result keeps.
	Truncated bool `json:"truncated,omitempty"`
}

func (t *tools) exec(ctx context.Context, req *sdk.CallToolRequest, in ExecIn) (*sdk.CallToolResult, ExecOut, error) {
	id, err := t.target(in.Sandbox)
	if err != nil {
		return nil, ExecOut{}, err
	}
	if len(in.Cmd) == 0 || in.Cmd[0] == "" {
		return nil, ExecOut{}, errors.New("cmd: required (an argv such as [\"ls\", \"-l\"])")
	}
	if in.TimeoutSeconds < 0 {
		return nil, ExecOut{}, errors.New("timeout_seconds must not be negative")
	}
	if in.TimeoutSeconds == 0 {
		in.TimeoutSeconds = defaultExecTimeout
	}
	er := api.ExecRequest{Cmd: in.Cmd, Cwd: in.Cwd, Env: in.Env, TimeoutSeconds: in.TimeoutSeconds}
	if in.Stdin != "" {
		er.Stdin = &in.Stdin
	}
	stdout, stderr := &capped{max: maxOutput}, &capped{max: maxOutput}
	eio := client.ExecIO{Stdout: stdout, Stderr: stderr}
	var p *progress
	if tok := req.Params.GetProgressToken(); tok != nil && req.Session != nil {
		p = &progress{ctx: ctx, ss: req.Session, token: tok}
		eio.Stdout = io.MultiWriter(stdout, p.writer("stdout"))
		eio.Stderr = io.MultiWriter(stderr, p.writer("stderr"))
	}
	st, err := t.c.Exec(ctx, id, er, eio)
	if p != nil {
		p.flush()
	}
	if err != nil {
		return nil, ExecOut{}, fmt.Errorf("exec in %s: %w", id, err)
	}
	if st.Error != "" {
		return nil, ExecOut{}, fmt.Errorf("exec in %s: %s", id, st.Error)
	}
	return nil, ExecOut{
		ExitCode: st.ExitCode, Signal: st.Signal, TimedOut: st.TimedOut, OOMKilled: st.OOMKilled,
		Stdout: stdout.String(), Stderr: stderr.String(), Truncated: stdout.over || stderr.over,
	}, nil
}

// capped keeps the first max bytes written to it.
type capped struct {
	bytes.Buffer
	max  int
	over bool
}

func (c *capped) Write(p []byte) (int, error) {
	room := c.max - c.Len()
	if len(p) > room {
		c.over = true
		c.Buffer.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return c.Buffer.Write(p)
}

// String returns the kept bytes as valid UTF-8 (a cut may split a rune).
func (c *capped) String() string { return strings.ToValidUTF8(c.Buffer.String(), "\uFFFD") }

// progress sends an exec's output as progress notifications: Progress
// counts the bytes so far, Message carries the text, batched so that a
// chatty command does not send one message per write.
type progress struct {
	ctx   context.Context
	ss    *sdk.ServerSession
	token any

	mu     sync.Mutex
	buf    bytes.Buffer
	stream string
	total  int64
	last   time.Time
}

type progressWriter struct {
	p      *progress
	stream string
}

func (p *progress) writer(stream string) io.Writer { return progressWriter{p, stream} }

func (w progressWriter) Write(b []byte) (int, error) {
	p := w.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stream != w.stream && p.buf.Len() > 0 {
		p.sendLocked()
	}
	p.stream = w.stream
	p.buf.Write(b)
	p.total += int64(len(b))
	if time.Since(p.last) >= progressEvery || p.buf.Len() >= 64<<10 {
		p.sendLocked()
	}
	return len(b), nil
}

func (p *progress) flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.buf.Len() > 0 {
		p.sendLocked()
	}
}

func (p *progress) sendLocked() {
	msg := strings.ToValidUTF8(p.buf.String(), "\uFFFD")
	p.buf.Reset()
	p.last = time.Now()
	// A client that went away must not stop the command's output from
	// being collected: the error is dropped.
	_ = p.ss.NotifyProgress(p.ctx, &sdk.ProgressNotificationParams{
		ProgressToken: p.token,
		Progress:      float64(p.total),
		Message:       p.stream + ": " + msg,
	})
}

// FileIn names a file of a sandbox.
type FileIn struct {
	SandboxRef
	Path string `json:"path" jsonschema:"an absolute path in the sandbox"`
}

// ReadFileIn is the read_file tool's input.
type ReadFileIn struct {
	FileIn
	MaxBytes int64 `json:"max_bytes,omitempty" jsonschema:"read at most this many bytes (default and cap 8 MiB)"`
}

// ReadFileOut is the read_file tool's output.
type ReadFileOut struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Encoding string `json:"encoding" jsonschema:"utf-8 or base64"`
	Size     int64  `json:"size"`
	// Truncated says the file is longer than what was read.
	Truncated bool `json:"truncated,omitempty"`
}

func checkPath(p string) error {
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("path %q: must be absolute", p)
	}
	return nil
}

func (t *tools) readFile(ctx context.Context, _ *sdk.CallToolRequest, in ReadFileIn) (*sdk.CallToolResult, ReadFileOut, error) {
	id, err := t.target(in.Sandbox)
	if err != nil {
		return nil, ReadFileOut{}, err
	}
	if err := checkPath(in.Path); err != nil {
		return nil, ReadFileOut{}, err
	}
	limit := int64(maxRead)
	if in.MaxBytes < 0 {
		return nil, ReadFileOut{}, errors.New("max_bytes must not be negative")
	}
	if in.MaxBytes > 0 && in.MaxBytes < limit {
		limit = in.MaxBytes
	}
	rc, err := t.c.ReadFileRange(ctx, id, in.Path, 0, limit+1)
	if err != nil {
		return nil, ReadFileOut{}, fmt.Errorf("reading %s in %s: %w", in.Path, id, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, ReadFileOut{}, fmt.Errorf("reading %s in %s: %w", in.Path, id, err)
	}
	out := ReadFileOut{Path: in.Path, Encoding: "utf-8"}
	if int64(len(b)) > limit {
		b, out.Truncated = b[:limit], true
	}
	out.Size = int64(len(b))
	if utf8.Valid(b) {
		out.Content = string(b)
	} else {
		out.Content, out.Encoding = base64.StdEncoding.EncodeToString(b), "base64"
	}
	return nil, out, nil
}

// WriteFileIn is the write_file tool's input.
type WriteFileIn struct {
	FileIn
	Content  string `json:"content"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf-8 (default) or base64"`
	Mode     string `json:"mode,omitempty" jsonschema:"octal permission bits such as 0755 (default: kept, or 0644 for a new file)"`
}

// FileOut describes a file.
type FileOut struct {
	Path    string    `json:"path"`
	Type    string    `json:"type" jsonschema:"file, dir, symlink or other"`
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"`
	ModTime time.Time `json:"mtime"`
}

func fileOf(fi *api.FileInfo) FileOut {
	return FileOut{Path: fi.Path, Type: fi.Type, Size: fi.Size, Mode: fmt.Sprintf("%04o", uint32(fi.Mode)), ModTime: fi.ModTime}
}

func (t *tools) writeFile(ctx context.Context, _ *sdk.CallToolRequest, in WriteFileIn) (*sdk.CallToolResult, FileOut, error) {
	id, err := t.target(in.Sandbox)
	if err != nil {
		return nil, FileOut{}, err
	}
	if err := checkPath(in.Path); err != nil {
		return nil, FileOut{}, err
	}
	data := []byte(in.Content)
	switch in.Encoding {
	case "", "utf-8", "utf8":
	case "base64":
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, FileOut{}, fmt.Errorf("content: not base64: %v", err)
		}
	default:
		return nil, FileOut{}, fmt.Errorf("encoding %q: must be utf-8 or base64", in.Encoding)
	}
	var opts client.WriteOptions
	if in.Mode != "" {
		var m uint32
		if _, err := fmt.Sscanf(in.Mode, "%o", &m); err != nil || m > 0o7777 {
			return nil, FileOut{}, fmt.Errorf("mode %q: must be octal permission bits such as 0644", in.Mode)
		}
		opts.Mode = os.FileMode(m & 0o777)
		if m&0o4000 != 0 {
			opts.Mode |= os.ModeSetuid
		}
		if m&0o2000 != 0 {
			opts.Mode |= os.ModeSetgid
		}
		if m&0o1000 != 0 {
			opts.Mode |= os.ModeSticky
		}
	}
	fi, err := t.c.WriteFile(ctx, id, in.Path, bytes.NewReader(data), opts)
	if err != nil {
		return nil, FileOut{}, fmt.Errorf("writing %s in %s: %w", in.Path, id, err)
	}
	return nil, fileOf(fi), nil
}

// ListFilesIn is the list_files tool's input.
type ListFilesIn struct {
	FileIn
	Depth int `json:"depth,omitempty" jsonschema:"how deep to descend: 1 (default) lists the directory itself"`
}

// ListFilesOut is the list_files tool's output.
type ListFilesOut struct {
	Files []FileOut `json:"files"`
	// Truncated says the listing stopped at its cap.
	Truncated bool `json:"truncated,omitempty"`
}

// maxListed caps a listing, so that a deep tree does not flood a model's
// context.
const maxListed = 5000

var errEnough = errors.New("enough")

func (t *tools) listFiles(ctx context.Context, _ *sdk.CallToolRequest, in ListFilesIn) (*sdk.CallToolResult, ListFilesOut, error) {
	id, err := t.target(in.Sandbox)
	if err != nil {
		return nil, ListFilesOut{}, err
	}
	if err := checkPath(in.Path); err != nil {
		return nil, ListFilesOut{}, err
	}
	if in.Depth < 0 || in.Depth > 32 {
		return nil, ListFilesOut{}, errors.New("depth: must be 1 to 32")
	}
	if in.Depth == 0 {
		in.Depth = 1
	}
	out := ListFilesOut{Files: []FileOut{}}
	err = t.c.ListFilesFunc(ctx, id, in.Path, in.Depth, func(fi client.FileInfo) error {
		if len(out.Files) == maxListed {
			out.Truncated = true
			return errEnough
		}
		out.Files = append(out.Files, fileOf(&fi))
		return nil
	})
	if err != nil && !errors.Is(err, errEnough) {
		return nil, ListFilesOut{}, fmt.Errorf("listing %s in %s: %w", in.Path, id, err)
	}
	return nil, out, nil
}

// LogsIn is the logs tool's input.
type LogsIn struct {
	SandboxRef
	PID       int   `json:"pid,omitempty" jsonschema:"also return the tail of this process's output"`
	TailBytes int64 `json:"tail_bytes,omitempty" jsonschema:"how much of its output (default 64 KiB, at most 1 MiB)"`
}

// Process is one entry of the exec log.
type Process struct {
	Seq       uint64     `json:"seq"`
	PID       int        `json:"pid"`
	Cmd       []string   `json:"cmd"`
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	ExitCode  *int       `json:"exit_code,omitempty"`
	Signal    string     `json:"signal,omitempty"`
	Bytes     int64      `json:"output_bytes"`
}

// LogsOut is the logs tool's output.
type LogsOut struct {
	Processes []Process `json:"processes"`
	Output    string    `json:"output,omitempty" jsonschema:"the tail of pid's output, stdout and stderr interleaved"`
}

func (t *tools) logs(ctx context.Context, _ *sdk.CallToolRequest, in LogsIn) (*sdk.CallToolResult, LogsOut, error) {
	id, err := t.target(in.Sandbox)
	if err != nil {
		return nil, LogsOut{}, err
	}
	if in.TailBytes < 0 || in.PID < 0 {
		return nil, LogsOut{}, errors.New("pid and tail_bytes must not be negative")
	}
	logs, err := t.c.Logs(ctx, id)
	if err != nil {
		return nil, LogsOut{}, fmt.Errorf("reading the exec log of %s: %w", id, err)
	}
	out := LogsOut{Processes: make([]Process, 0, len(logs))}
	var want *api.ExecLog
	for i := range logs {
		l := &logs[i]
		p := Process{Seq: l.Seq, PID: l.PID, Cmd: l.Cmd, StartedAt: l.StartedAt, EndedAt: l.EndedAt, Bytes: l.End}
		if l.Exit != nil {
			code := l.Exit.ExitCode
			p.ExitCode, p.Signal = &code, l.Exit.Signal
		}
		out.Processes = append(out.Processes, p)
		if in.PID != 0 && l.PID == in.PID {
			want = l
		}
	}
	if in.PID == 0 {
		return nil, out, nil
	}
	if want == nil {
		return nil, LogsOut{}, fmt.Errorf("pid %d: no such process in the exec log of %s", in.PID, id)
	}
	tail := in.TailBytes
	if tail == 0 {
		tail = 64 << 10
	}
	tail = min(tail, maxOutput)
	stream, err := t.c.Log(ctx, id, in.PID, client.LogOptions{From: max(want.Start, want.End-tail)})
	if err != nil {
		return nil, LogsOut{}, fmt.Errorf("reading the output of pid %d: %w", in.PID, err)
	}
	defer stream.Close()
	buf := &capped{max: int(tail)}
	if _, err := stream.Wait(buf, buf); err != nil {
		return nil, LogsOut{}, fmt.Errorf("reading the output of pid %d: %w", in.PID, err)
	}
	out.Output = buf.String()
	return nil, out, nil
}

// StatsOut is the stats tool's output.
type StatsOut struct {
	Sandbox
	CPUPercent     float64 `json:"cpu_percent" jsonschema:"percent of one core"`
	MemoryUsed     int64   `json:"memory_used_bytes"`
	MemoryLimit    int64   `json:"memory_limit_bytes,omitempty"`
	Pids           int64   `json:"pids"`
	DiskUsed       int64   `json:"disk_used_bytes"`
	NetRxBytes     uint64  `json:"net_rx_bytes"`
	NetTxBytes     uint64  `json:"net_tx_bytes"`
	EgressAllowed  uint64  `json:"egress_requests_allowed"`
	EgressDenied   uint64  `json:"egress_requests_denied"`
	OOMKills       uint64  `json:"oom_kills"`
	SampledAt      string  `json:"sampled_at,omitempty"`
	MetricsPending bool    `json:"metrics_pending,omitempty" jsonschema:"no sample yet (a new or stopped sandbox)"`
}

func (t *tools) stats(ctx context.Context, _ *sdk.CallToolRequest, in SandboxRef) (*sdk.CallToolResult, StatsOut, error) {
	id, err := t.target(in.Sandbox)
	if err != nil {
		return nil, StatsOut{}, err
	}
	sb, err := t.c.Get(ctx, id)
	if err != nil {
		return nil, StatsOut{}, fmt.Errorf("getting %s: %w", id, err)
	}
	out := StatsOut{Sandbox: sandboxOf(sb)}
	now := time.Now()
	m, err := t.c.Metrics(ctx, id, client.MetricsOptions{Since: now.Add(-2 * time.Second), Until: now})
	if err != nil {
		return nil, StatsOut{}, fmt.Errorf("getting the metrics of %s: %w", id, err)
	}
	if s := m.Current; s != nil {
		out.CPUPercent, out.MemoryUsed, out.MemoryLimit, out.Pids = s.CPUPercent, s.MemoryBytes, s.MemoryLimitBytes, s.Pids
		out.DiskUsed, out.NetRxBytes, out.NetTxBytes = s.DiskUsedBytes, s.NetRxBytes, s.NetTxBytes
		out.EgressAllowed, out.EgressDenied, out.OOMKills = s.EgressAllowed, s.EgressDenied, s.OOMKills
		out.SampledAt = s.Time.UTC().Format(time.RFC3339Nano)
	} else {
		out.MetricsPending = true
	}
	return nil, out, nil
}

// DenialsIn is the denials tool's input.
type DenialsIn struct {
	SandboxRef
	Limit int `json:"limit,omitempty" jsonschema:"at most this many, newest (default 100, at most 1000)"`
}

// Denial is one refused request.
type Denial struct {
	Time    time.Time `json:"time"`
	Message string    `json:"message" jsonschema:"what was refused and why, e.g. deny http example.com: no rule allows it"`
}

// DenialsOut is the denials tool's output.
type DenialsOut struct {
	Denials []Denial `json:"denials"`
}

func (t *tools) denials(ctx context.Context, _ *sdk.CallToolRequest, in DenialsIn) (*sdk.CallToolResult, DenialsOut, error) {
	id, err := t.target(in.Sandbox)
	if err != nil {
		return nil, DenialsOut{}, err
	}
	if in.Limit < 0 || in.Limit > 1000 {
		return nil, DenialsOut{}, errors.New("limit: must be 1 to 1000")
	}
	if in.Limit == 0 {
		in.Limit = 100
	}
	evs, err := t.c.Events(ctx, id, client.EventOptions{Types: []string{"policy"}, Limit: 1000})
	if err != nil {
		return nil, DenialsOut{}, fmt.Errorf("reading the events of %s: %w", id, err)
	}
	out := DenialsOut{Denials: []Denial{}}
	// Only the message: an event's data may carry a request's path and
	// query, which can hold what the agent should not read back.
	for _, e := range evs {
		if strings.HasPrefix(e.Message, "deny ") {
			out.Denials = append(out.Denials, Denial{Time: e.Time, Message: e.Message})
		}
	}
	if len(out.Denials) > in.Limit {
		out.Denials = out.Denials[len(out.Denials)-in.Limit:]
	}
	return nil, out, nil
}

// RequestsIn is the requests tool's input.
type RequestsIn struct {
	Sandbox string `json:"sandbox,omitempty" jsonschema:"the sandbox id (default: every sandbox, or the server's own)"`
	State   string `json:"state,omitempty" jsonschema:"only requests in this state: pending, approved, denied or expired"`
}

// RequestsOut is the requests tool's output.
type RequestsOut struct {
	Requests []api.EgressRequest `json:"requests"`
}

func (t *tools) requests(ctx context.Context, _ *sdk.CallToolRequest, in RequestsIn) (*sdk.CallToolResult, RequestsOut, error) {
	id := strings.TrimSpace(in.Sandbox)
	if t.cfg.Sandbox != "" || id != "" {
		var err error
		if id, err = t.target(id); err != nil {
			return nil, RequestsOut{}, err
		}
	}
	list, err := t.c.Requests(ctx, id, in.State)
	if err != nil {
		return nil, RequestsOut{}, err
	}
	if list == nil {
		list = []api.EgressRequest{}
	}
	return nil, RequestsOut{Requests: list}, nil
}

// PolicyIn is the set_policy tool's input.
type PolicyIn struct {
	SandboxRef
	Allow   []string `json:"allow,omitempty" jsonschema:"allow rules: domains, *.domain, IPs or CIDRs with an optional :PORT, URLs"`
	Presets []string `json:"presets,omitempty"`
}

// PolicyOut is the set_policy tool's output: the rules, without secret
// bindings.
type PolicyOut struct {
	Allow   []string `json:"allow"`
	Deny    []string `json:"deny"`
	Presets []string `json:"presets"`
}

func (t *tools) setPolicy(ctx context.Context, _ *sdk.CallToolRequest, in PolicyIn) (*sdk.CallToolResult, PolicyOut, error) {
	id, err := t.target(in.Sandbox)
	if err != nil {
		return nil, PolicyOut{}, err
	}
	cur, err := t.c.Policy(ctx, id)
	if err != nil {
		return nil, PolicyOut{}, fmt.Errorf("getting the policy of %s: %w", id, err)
	}
	p := api.Policy{Deny: cur.Deny, Secrets: cur.Secrets, Presets: in.Presets, Precedence: cur.Precedence}
	for _, a := range in.Allow {
		p.Allow = append(p.Allow, api.PolicyRule{Match: a})
	}
	got, err := t.c.SetPolicy(ctx, id, p)
	if err != nil {
		return nil, PolicyOut{}, fmt.Errorf("setting the policy of %s: %w", id, err)
	}
	out := PolicyOut{Allow: []string{}, Deny: []string{}, Presets: append([]string{}, got.Presets...)}
	for _, r := range got.Allow {
		out.Allow = append(out.Allow, r.Match)
	}
	for _, r := range got.Deny {
		out.Deny = append(out.Deny, r.Match)
	}
	return nil, out, nil
}
