// Package postgres holds the worked example of a sandbox with a
// PostgreSQL service, sandbox.yaml, and what the end-to-end test and the
// benchmark that run it as written check of it: the inserter they run in
// the harness and how they read a copy's recovery from postgres's log.
package postgres

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/client"
)

// SandboxYAML is sandbox.yaml: a harness, its tools on the base image and
// a postgres from the host's Debian packages, ready when create answers.
//
//go:embed sandbox.yaml
var SandboxYAML []byte

// Server is the postgres the example runs: Debian 12's package.
const Server = "/usr/lib/postgresql/15/bin/postgres"

// Inserter, run with sh -c in the harness, inserts rows 1, 2, 3... into
// table t (n bigint), a transaction each, and appends a row's number to
// /root/acked once postgres has committed it: a copy of the sandbox must
// hold rows 1..count, every acknowledged one among them.
const Inserter = `seq 1 100000000 | sed 's/.*/insert into t (n) values (&) returning n;/' |
	psql -h 127.0.0.1 -U postgres -qAt -v ON_ERROR_STOP=1 >> /root/acked`

// ReadyLine is what postgres logs once it accepts connections.
const ReadyLine = "database system is ready to accept connections"

// Log returns the output of postgres, process pid of the db container of
// sandbox id, up to ReadyLine (once readiness passed, it is there).
func Log(ctx context.Context, c *client.Client, id string, pid int) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := c.Attach(client.WithContainer(ctx, "db"), id, pid, client.AttachOptions{})
	if err != nil {
		return "", fmt.Errorf("attaching to postgres: %w", err)
	}
	defer s.Close()
	w := &untilLine{want: ReadyLine, done: cancel}
	s.Wait(w, w)
	out := w.String()
	if !strings.Contains(out, ReadyLine) {
		return out, fmt.Errorf("postgres's output lacks %q:\n%s", ReadyLine, out)
	}
	return out, nil
}

// untilLine collects output and calls done once it holds want.
type untilLine struct {
	mu   sync.Mutex
	b    strings.Builder
	want string
	done func()
}

func (u *untilLine) Write(p []byte) (int, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.b.Write(p)
	if strings.Contains(u.b.String(), u.want) {
		u.done()
	}
	return len(p), nil
}

func (u *untilLine) String() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.b.String()
}

// CheckRecovery checks the log of a postgres started on a snapshot taken
// while it ran: it recovered from its WAL, and logged no warning, error,
// panic, nor a FATAL but the refusals readiness checks meet while it
// starts.
func CheckRecovery(log string) error {
	for _, want := range []string{"automatic recovery in progress", "redo done at", ReadyLine} {
		if !strings.Contains(log, want) {
			return fmt.Errorf("postgres's log lacks %q:\n%s", want, log)
		}
	}
	var bad []string
	for _, l := range strings.Split(log, "\n") {
		switch {
		case strings.Contains(l, "FATAL:  the database system is starting up"),
			strings.Contains(l, "FATAL:  the database system is not yet accepting connections"):
		case strings.Contains(l, "WARNING:"), strings.Contains(l, "ERROR:"), strings.Contains(l, "PANIC:"), strings.Contains(l, "FATAL:"):
			bad = append(bad, l)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("postgres's log has trouble:\n%s", strings.Join(bad, "\n"))
	}
	return nil
}
