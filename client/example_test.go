package client_test

import (
	"context"
	"fmt"
	"os"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// Run a command in a fresh sandbox with live output (needs a running
// daemon; see examples/quickstart for a complete program).
func Example() {
	ctx := context.Background()
	c, err := client.FromEnv()
	if err != nil {
		fmt.Println(err)
		return
	}
	sb, err := c.Create(ctx, api.CreateRequest{Resources: api.Resources{MemoryBytes: 256 << 20}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Delete(ctx, sb.ID, true)
	st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "hello"}}, client.ExecIO{Stdout: os.Stdout})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("exit", st.ExitCode)
}
