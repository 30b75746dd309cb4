package server

import (
	"fmt"
	"testing"

	"github.com/paddock-dev/paddock/wire"
)

type recordingTee struct{ frames []string }

func (r *recordingTee) Frame(t wire.Type, payload []byte) {
	r.frames = append(r.frames, fmt.Sprintf("%d:%s", t, payload))
}

func (r *recordingTee) Detach() {}

// TestTeeWhole: the exec log's copy of a stream answered whole gets every
// frame, in order, as the relay would have given it.
func TestTeeWhole(t *testing.T) {
	body := wire.AppendFrame(nil, wire.Stdout, []byte("out"))
	body = wire.AppendFrame(body, wire.Stderr, []byte("err"))
	body = wire.AppendFrame(body, wire.Stdout, nil)
	body = wire.AppendFrame(body, wire.Exit, []byte(`{"exit_code":4}`))
	var tee recordingTee
	teeWhole(&tee, body)
	want := []string{"1:out", "2:err", "1:", `3:{"exit_code":4}`}
	if fmt.Sprint(tee.frames) != fmt.Sprint(want) {
		t.Errorf("frames %q, want %q", tee.frames, want)
	}
}
