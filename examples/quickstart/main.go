// Command quickstart shows the Go SDK end to end against a running
// daemon: create a sandbox, run a command with live output, start a
// background process and re-attach to it, and remove the sandbox.
//
//	go run ./examples/quickstart            # uses $PADDOCK_HOST or the default socket
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	sb, err := c.Create(ctx, api.CreateRequest{
		Resources:      api.Resources{MemoryBytes: 512 << 20, CPUs: 1},
		TimeoutSeconds: 600,
		Labels:         map[string]string{"example": "quickstart"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Delete(context.Background(), sb.ID, true)
	fmt.Println("sandbox", sb.ID)

	// A command with live output; a non-zero exit is not an error.
	st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "uname -a; python3 --version; exit 3"}},
		client.ExecIO{Stdout: os.Stdout, Stderr: os.Stderr})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code", st.ExitCode)

	// A background process, re-attached to after it finished.
	p, err := c.StartProcess(ctx, sb.ID, api.StartRequest{Cmd: []string{"sh", "-c", "for i in 1 2 3; do echo tick $i; sleep 0.1; done"}})
	if err != nil {
		log.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	s, err := c.Attach(ctx, sb.ID, p.PID, client.AttachOptions{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := s.Wait(os.Stdout, os.Stderr); err != nil {
		log.Fatal(err)
	}
	s.Close()

	// Errors are typed.
	if _, err := c.Get(ctx, "no-such-sandbox"); errors.Is(err, client.ErrNotFound) {
		fmt.Println("a missing sandbox is client.ErrNotFound")
	}
}
