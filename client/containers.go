package client

import (
	"context"
	"net/url"
	"strings"

	"github.com/paddock-dev/paddock/api"
)

// containerKey carries the container WithContainer names.
type containerKey struct{}

// WithContainer makes the calls made with ctx about a sandbox (exec,
// processes, files, ports) address its container name instead of its
// first. Exec then takes the HTTP way, never a lane (a lane serves the
// first container).
func WithContainer(ctx context.Context, name string) context.Context {
	if name == "" {
		return ctx
	}
	return context.WithValue(ctx, containerKey{}, name)
}

// containerOf is the container ctx names, "" for the first.
func containerOf(ctx context.Context) string {
	name, _ := ctx.Value(containerKey{}).(string)
	return name
}

// inContainer adds the container ctx names to a sandbox's path.
func inContainer(ctx context.Context, path string) string {
	name := containerOf(ctx)
	if name == "" || !strings.HasPrefix(path, "/v1/sandboxes/") {
		return path
	}
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	return path + sep + api.ContainerParam + "=" + url.QueryEscape(name)
}
