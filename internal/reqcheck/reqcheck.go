// Package reqcheck decodes and checks what an API caller sends that both
// the daemon and the guest read: exec requests (the guest serves exec
// lanes handed to it), environments and paths inside a sandbox. One
// implementation, so that a request is refused the same way, with the same
// words, whichever side reads it.
package reqcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"path"
	"strings"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// MaxBody caps a JSON request body or lane request frame.
const MaxBody = 1 << 20

// Bounds on a request's environment.
const (
	maxEnv      = 1024
	maxEnvBytes = 128 << 10
)

// validEnvKey reports whether k is [A-Za-z_][A-Za-z0-9_]*.
func validEnvKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// Env checks environment keys and values.
func Env(field string, env map[string]string) error {
	if len(env) > maxEnv {
		return errdefs.Invalid(field, "more than %d variables", maxEnv)
	}
	size := 0
	for k, v := range env {
		if !validEnvKey(k) {
			return errdefs.Invalid(field, "%q is not a valid variable name", k)
		}
		if strings.ContainsRune(v, 0) {
			return errdefs.Invalid(field, "value of %s contains a NUL byte", k)
		}
		size += len(k) + len(v) + 2
	}
	if size > maxEnvBytes {
		return errdefs.Invalid(field, "larger than %d bytes", maxEnvBytes)
	}
	return nil
}

// SandboxID checks that id, sent as field, has the form of a sandbox id
// (api.IsSandboxID). Ids name files, directories and cgroups, so every
// reader of one checks it with this before using it.
func SandboxID(field, id string) error {
	if !api.IsSandboxID(id) {
		if len(id) > 80 {
			id = id[:80] + "..."
		}
		return errdefs.Invalid(field, "%q is not a sandbox id (1 to 64 of a-z, 0-9 and '-', not starting with '-')", id)
	}
	return nil
}

// Path checks a path inside the sandbox: absolute, clean, no NUL.
func Path(field, p string) error {
	if p == "" {
		return nil
	}
	if !strings.HasPrefix(p, "/") {
		return errdefs.Invalid(field, "%q must be an absolute path", p)
	}
	if strings.ContainsRune(p, 0) || len(p) > 4096 {
		return errdefs.Invalid(field, "not a valid path")
	}
	if path.Clean(p) != p && path.Clean(p)+"/" != p {
		return errdefs.Invalid(field, "%q is not a clean path", p)
	}
	return nil
}

// TTY checks a terminal size.
func TTY(t *api.TTY) error {
	if t != nil && (t.Cols == 0 || t.Rows == 0) {
		return errdefs.Invalid("tty", "cols and rows must be positive")
	}
	return nil
}

// Exec checks an exec request.
func Exec(req *api.ExecRequest) error {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return errdefs.Invalid("cmd", "must name a command")
	}
	for i, a := range req.Cmd {
		if strings.ContainsRune(a, 0) {
			return errdefs.Invalid("cmd", "argument %d contains a NUL byte", i)
		}
	}
	if err := Env("env", req.Env); err != nil {
		return err
	}
	if err := TTY(req.TTY); err != nil {
		return err
	}
	if req.TimeoutSeconds < 0 {
		return errdefs.Invalid("timeout_seconds", "must not be negative")
	}
	return Path("cwd", req.Cwd)
}

// LaneRequest decodes and checks one request frame of an exec lane. A
// lane runs commands without a terminal: one needs an interactive stream.
// A lane bound to a sandbox (bound is its id) runs commands in that one
// only.
func LaneRequest(payload []byte, bound string) (api.LaneRequest, error) {
	var req api.LaneRequest
	if len(payload) > MaxBody {
		return req, errdefs.New(errdefs.ErrTooLarge, "lane request exceeds %d bytes", MaxBody)
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, DecodeError(err)
	}
	if err := Exec(&req.Exec); err != nil {
		return req, err
	}
	if bound != "" && req.Sandbox != bound {
		return req, errdefs.Invalid("sandbox", "this lane runs commands in sandbox %s, not %q", bound, req.Sandbox)
	}
	if req.Exec.TTY != nil {
		return req, errdefs.Invalid("tty", "a terminal needs an interactive stream: POST /v1/sandboxes/{id}/exec with \"Upgrade: %s\"", api.StreamProtocol)
	}
	return req, nil
}

// DecodeError turns a JSON decoder's error into one that names what was
// wrong with the body, categorized for its status. (A body over the
// daemon's limit is the server's to name: this package does not link
// net/http, which the guest would carry.)
func DecodeError(err error) error {
	var (
		se  *json.SyntaxError
		ute *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &se):
		return errdefs.Invalid("body", "malformed JSON at byte %d: %v", se.Offset, se)
	case errors.As(err, &ute):
		field := ute.Field
		if field == "" {
			field = "body"
		}
		return errdefs.Invalid(field, "expected %s, got JSON %s", ute.Type, ute.Value)
	case errors.Is(err, io.EOF):
		return errdefs.Invalid("body", "empty; expected a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errdefs.Invalid("body", "truncated JSON")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return errdefs.Invalid(name, "unknown field")
	}
	return errdefs.Invalid("body", "%v", err)
}
