package cli

import (
	"context"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"golang.org/x/term"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/wire"
)

// localSize is the local terminal's size, or 80x24.
func localSize() *api.TTY {
	if cols, rows, err := term.GetSize(int(os.Stdout.Fd())); err == nil && cols > 0 && rows > 0 {
		return &api.TTY{Cols: uint16(cols), Rows: uint16(rows)}
	}
	return &api.TTY{Cols: 80, Rows: 24}
}

// follow copies a process's stream to the local terminal until it exits.
// With input, local stdin goes to the process; with a terminal, the local
// one is put in raw mode (restored on the way out) and size changes are
// passed on. Without a terminal, a local interrupt is passed to the
// process, and a second one detaches (the process keeps running).
func (g *globals) follow(ctx context.Context, s *client.ExecStream, input, tty bool) error {
	stdinFD := int(os.Stdin.Fd())
	if tty && term.IsTerminal(stdinFD) {
		old, err := term.MakeRaw(stdinFD)
		if err == nil {
			defer term.Restore(stdinFD, old)
		}
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				sz := localSize()
				s.Resize(sz.Cols, sz.Rows)
			}
		}()
	}
	if input {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := os.Stdin.Read(buf)
				if n > 0 && s.Send(wire.Stdin, buf[:n]) != nil {
					return
				}
				if err != nil {
					if err == io.EOF {
						s.Send(wire.CloseStdin, nil)
					}
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	defer close(done)
	var detached atomic.Bool
	if !tty {
		sigs := make(chan os.Signal, 2)
		signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
		defer signal.Stop(sigs)
		go func() {
			first := true
			for {
				select {
				case sig := <-sigs:
					if first && input {
						first = false
						s.Signal(signalName(sig))
						continue
					}
					detached.Store(true)
					s.Close()
					return
				case <-done:
					return
				}
			}
		}()
	}
	go func() {
		select {
		case <-ctx.Done():
			s.Close()
		case <-done:
		}
	}()
	st, err := s.Wait(g.stdout, g.stderr)
	if err != nil {
		if ctx.Err() != nil || detached.Load() {
			return exitError{130}
		}
		return err
	}
	return g.exitCode(st)
}

func signalName(sig os.Signal) string {
	if sig == syscall.SIGTERM {
		return "TERM"
	}
	return "INT"
}
