package client_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// Start a web server inside a sandbox and reach it three ways: through a
// host forward, through the daemon's HTTP proxy, and as a raw connection.
// It needs a running daemon ($PADDOCK_HOST), so it has no Output line.
func Example_ports() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	sb, err := c.Create(ctx, api.CreateRequest{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Delete(context.Background(), sb.ID, true)

	// A server in the background, listening on the sandbox's loopback.
	_, err = c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sh", "-c",
		"nohup python3 -m http.server 3000 --bind 127.0.0.1 >/tmp/http.log 2>&1 & " +
			"for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 3000))' 2>/dev/null && exit 0; sleep 0.1; done; exit 1"}},
		client.ExecIO{})
	if err != nil {
		log.Fatal(err)
	}

	// 1. A host forward: any local program can use the address.
	addr, err := c.ForwardPort(ctx, sb.ID, 3000)
	if err != nil {
		log.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println("forward:", addr, resp.Status)

	// 2. The daemon's proxy, authenticated like the rest of the API.
	resp, err = c.PortHTTPClient().Get(c.PortURL(sb.ID, 3000, "/?q=1"))
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println("proxy:", resp.Status)

	// 3. A raw connection over the API connection; no host port involved.
	conn, err := c.DialPort(ctx, sb.ID, 3000)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "HEAD / HTTP/1.0\r\n\r\n")
	status := make([]byte, 12)
	io.ReadFull(conn, status)
	fmt.Printf("raw: %s\n", status) // HTTP/1.0 200

	if err := c.ClosePort(ctx, sb.ID, 3000); err != nil {
		log.Fatal(err)
	}
}
