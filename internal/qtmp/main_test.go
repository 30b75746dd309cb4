package qt

import (
	"context"
	"io"
	"sort"
	"testing"
	"time"

	"paddock/api"
	"paddock/client"
)

type firstW struct{ t time.Time }

func (f *firstW) Write(b []byte) (int, error) {
	if f.t.IsZero() {
		f.t = time.Now()
	}
	return len(b), nil
}

func TestQuick(t *testing.T) {
	c, _ := client.New("unix:///run/paddock/paddock.sock")
	ctx := context.Background()
	var cold, execs []time.Duration
	for i := 0; i < 15; i++ {
		t0 := time.Now()
		sb, err := c.Create(ctx, api.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		fw := &firstW{}
		if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "hi"}}, client.ExecIO{Stdout: fw}); err != nil {
			t.Fatal(err)
		}
		cold = append(cold, fw.t.Sub(t0))
		t.Logf("create %v first-output %v", t1.Sub(t0), fw.t.Sub(t0))
		for j := 0; j < 20; j++ {
			e0 := time.Now()
			c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}}, client.ExecIO{Stdout: io.Discard})
			execs = append(execs, time.Since(e0))
		}
		c.Delete(ctx, sb.ID, true)
		time.Sleep(300 * time.Millisecond)
	}
	sort.Slice(cold, func(i, j int) bool { return cold[i] < cold[j] })
	sort.Slice(execs, func(i, j int) bool { return execs[i] < execs[j] })
	t.Logf("cold median %v; exec median %v p90 %v", cold[len(cold)/2], execs[len(execs)/2], execs[len(execs)*9/10])
}
