package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// Files of a sandbox: write, watch, read, list, stat and copy a tree in
// and out as tar streams. Every body is streamed: a 1 GiB file goes
// through an io.Reader without being held in memory.
func Example_files() {
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

	// Watch the workspace; the watch is in place when Watch returns.
	w, err := c.Watch(ctx, sb.ID, "/workspace", true)
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close()

	// Write a file from any io.Reader: atomically, with a mode and an
	// owner known to the sandbox.
	_, err = c.WriteFile(ctx, sb.ID, "/workspace/src/hello.sh",
		strings.NewReader("#!/bin/sh\necho hello\n"), client.WriteOptions{Mode: 0o755, Owner: "root"})
	if err != nil {
		log.Fatal(err)
	}
	ev := <-w.Events
	fmt.Println(ev.Type, ev.Path)

	// Read it back as a stream.
	rc, err := c.ReadFile(ctx, sb.ID, "/workspace/src/hello.sh")
	if err != nil {
		log.Fatal(err)
	}
	io.Copy(os.Stdout, rc)
	rc.Close()

	// List two levels of the workspace.
	entries, err := c.ListFiles(ctx, sb.ID, "/workspace", 2)
	if err != nil {
		log.Fatal(err)
	}
	for _, fi := range entries {
		fmt.Println(fi.Mode, fi.User, fi.Size, fi.Path)
	}

	// Errors carry a category.
	if _, err := c.Stat(ctx, sb.ID, "/workspace/missing"); errors.Is(err, client.ErrNotFound) {
		fmt.Println("missing:", err)
	}

	// Copy the tree out as a tar, and into another directory.
	tr, err := c.DownloadTar(ctx, sb.ID, "/workspace/src")
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	res, err := c.UploadTar(ctx, sb.ID, "/workspace/copy", tr, client.UploadOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Entries, "entries copied")
}
