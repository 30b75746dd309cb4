package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"
)

// procTiming is one timed run of a command-line tool.
type procTiming struct {
	First  time.Duration // Start → first byte on its stdout
	Exit   time.Duration // Start → the process has exited and been reaped
	Stdout []byte
}

// timeProcess runs argv with stdout on a pipe and measures, from just
// before fork/exec, the arrival of the first stdout byte and the exit. The
// command is built (and its path resolved) before the clock starts. A
// non-zero exit is an error.
func timeProcess(ctx context.Context, argv []string) (procTiming, error) {
	return timeProcessSince(ctx, argv, nil, time.Time{})
}

// timeProcessSince is timeProcess with the clock started at t0 instead,
// unless t0 is zero: a burst's release, so that building the command and
// its pipe after it are counted too. A nil env keeps the bench's own.
func timeProcessSince(ctx context.Context, argv, env []string, t0 time.Time) (procTiming, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return procTiming{}, fmt.Errorf("making stdout pipe: %w", err)
	}
	defer r.Close()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdout = w
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second

	if t0.IsZero() {
		t0 = time.Now()
	}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return procTiming{}, fmt.Errorf("starting %s: %w", argv[0], err)
	}
	buf := make([]byte, 4096)
	n, rerr := r.Read(buf)
	first := time.Since(t0)
	rest, _ := io.ReadAll(r)
	werr := cmd.Wait()
	exit := time.Since(t0)

	t := procTiming{First: first, Exit: exit, Stdout: append(buf[:n:n], rest...)}
	if werr != nil {
		return t, fmt.Errorf("running %s: %w (stderr: %s)", argv[0], werr, truncate(stderr.String(), 300))
	}
	if n == 0 {
		return t, fmt.Errorf("%s printed nothing (%v; stderr: %s)", argv[0], rerr, truncate(stderr.String(), 300))
	}
	return t, nil
}

// timeRun runs argv with no stdio and measures its wall time to exit.
func timeRun(ctx context.Context, argv []string) (time.Duration, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second
	t0 := time.Now()
	err := cmd.Run()
	d := time.Since(t0)
	if err != nil {
		return d, fmt.Errorf("running %s: %w (stderr: %s)", argv[0], err, truncate(stderr.String(), 300))
	}
	return d, nil
}

// output runs argv untimed and returns its combined output.
func output(ctx context.Context, argv ...string) (string, error) {
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), fmt.Errorf("running %v: %w: %s", argv, err, truncate(string(bytes.TrimSpace(out)), 300))
		}
		return string(out), fmt.Errorf("running %v: %w", argv, err)
	}
	return string(out), nil
}

// wantOutput checks that a tool printed exactly want.
func wantOutput(tool string, got []byte, want string) error {
	if string(got) != want {
		return fmt.Errorf("%s printed %q, want %q", tool, truncate(string(got), 100), want)
	}
	return nil
}
