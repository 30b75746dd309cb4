package test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/examples/postgres"
)

// postgresExample is the worked sandbox.yaml of a harness, its tools and
// a PostgreSQL service; the test runs it as written.
const postgresExample = "../examples/postgres/sandbox.yaml"

// psql runs a query in container name of sandbox id as postgres over
// localhost and returns its unaligned output.
func (d *Daemon) psql(id, name, query string) string {
	d.t.Helper()
	r := d.groupExec(id, name, "psql", "-h", "127.0.0.1", "-U", "postgres", "-qAt", "-v", "ON_ERROR_STOP=1", "-c", query)
	if r.ExitCode != 0 {
		d.t.Fatalf("psql %q in %s/%s: %s", query, id, name, r)
	}
	return strings.TrimSpace(r.Stdout)
}

// acked is how many rows the inserter of sandbox id saw committed.
func (d *Daemon) acked(id string) int {
	d.t.Helper()
	r := d.groupExec(id, "harness", "sh", "-c", "cat /root/acked 2>/dev/null | wc -l")
	n, err := strconv.Atoi(strings.TrimSpace(r.Stdout))
	if err != nil {
		d.t.Fatalf("%s: counting acknowledged rows: %s", id, r)
	}
	return n
}

// postgresLog returns the output of the db container's postgres in
// sandbox id up to its line saying it accepts connections.
func (d *Daemon) postgresLog(id string) string {
	d.t.Helper()
	db := d.get(id).Containers[2]
	if db.Name != "db" || db.PID == 0 {
		d.t.Fatalf("%s: container 2 is %s with pid %d, want db's postgres", id, db.Name, db.PID)
	}
	log, err := postgres.Log(context.Background(), d.Client(), id, db.PID)
	if err != nil {
		d.t.Fatalf("%s: %v", id, err)
	}
	return log
}

// TestContainersPostgres runs the postgres example: create answers once
// postgres is ready, the harness reaches it on localhost; then a snapshot
// while the harness inserts rows, and a sandbox from it whose postgres
// recovers its WAL cleanly onto a prefix of the rows written that holds
// every row the harness saw committed.
func TestContainersPostgres(t *testing.T) {
	if _, err := os.Stat(postgres.Server); err != nil {
		t.Skip("needs Debian's postgresql (apt-get install postgresql)")
	}
	t.Parallel()
	d := newDaemon(t)
	id := d.createCLI("-f", postgresExample)
	sb := d.get(id)
	if len(sb.Containers) != 3 {
		t.Fatalf("sandbox has %d containers, want 3", len(sb.Containers))
	}
	for _, c := range sb.Containers {
		if c.State != api.StateRunning {
			t.Fatalf("container %s is %s: %s", c.Name, c.State, c.Error)
		}
	}
	// Ready when create answered: no retry here.
	if v := d.psql(id, "harness", "show server_version"); !strings.HasPrefix(v, "15") {
		t.Fatalf("postgres's version %q", v)
	}
	// The tools container shares localhost too, and not db's files.
	if r := d.groupExec(id, "tools", "python3", "-c", "import socket; socket.create_connection(('127.0.0.1', 5432), 5).close()"); r.ExitCode != 0 {
		t.Fatalf("tools cannot reach postgres on localhost: %s", r)
	}
	if r := d.groupExec(id, "tools", "test", "-e", "/var/lib/postgresql/data/PG_VERSION"); r.ExitCode == 0 {
		t.Fatal("the tools container sees db's data directory")
	}
	d.psql(id, "harness", "create table t (n bigint primary key, at timestamptz not null default now())")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := d.Client()
	if _, err := c.StartProcess(ctx, id, api.StartRequest{Cmd: []string{"sh", "-c", postgres.Inserter}}); err != nil {
		t.Fatal(err)
	}
	if !waitFor(60*time.Second, 50*time.Millisecond, func() bool { return d.acked(id) >= 300 }) {
		t.Fatal("the inserter did not commit 300 rows")
	}
	snap, err := c.Snapshot(ctx, id, api.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot %s: frozen %.1f ms, total %.1f ms", snap.ID, snap.FrozenMS, snap.TotalMS)
	if snap.FrozenMS <= 0 || len(snap.Containers) != 3 {
		t.Fatalf("snapshot: frozen %.1f ms, containers %+v", snap.FrozenMS, snap.Containers)
	}
	// The source writes on.
	n := d.acked(id)
	if !waitFor(30*time.Second, 50*time.Millisecond, func() bool { return d.acked(id) > n }) {
		t.Fatal("the source stopped inserting after the snapshot")
	}

	copyID := d.createCLI("--from", snap.ID)
	if err := postgres.CheckRecovery(d.postgresLog(copyID)); err != nil {
		t.Fatalf("the copy's postgres: %v", err)
	}
	// Rows 1..count, every acknowledged one among them. The inserter is
	// not the copy's (it was an exec), so both counts stay put.
	got := strings.Split(d.psql(copyID, "harness", "select count(*), coalesce(min(n), 0), coalesce(max(n), 0) from t"), "|")
	count, _ := strconv.Atoi(got[0])
	lo, _ := strconv.Atoi(got[1])
	hi, _ := strconv.Atoi(got[2])
	acked := d.acked(copyID)
	t.Logf("copy %s: %d rows (%d..%d), %d acknowledged", copyID, count, lo, hi, acked)
	if count == 0 || lo != 1 || hi != count {
		t.Fatalf("the copy's rows are %d..%d, %d of them: not a prefix of 1, 2, 3...", lo, hi, count)
	}
	if acked > count {
		t.Fatalf("the copy holds %d rows, but the harness saw %d committed", count, acked)
	}
	// Every page's checksum and every index against its heap.
	if r := d.groupExec(copyID, "harness", filepath.Join(filepath.Dir(postgres.Server), "pg_amcheck"), "-h", "127.0.0.1", "-U", "postgres", "--install-missing", "--heapallindexed", "-d", "postgres"); r.ExitCode != 0 {
		t.Fatalf("pg_amcheck of the copy: %s", r)
	}
	// The copy writes on its own.
	d.psql(copyID, "harness", "insert into t (n) values (-1)")
	if got := d.psql(id, "harness", "select count(*) from t where n = -1"); got != "0" {
		t.Fatal("a row inserted in the copy reached the source")
	}
}
