package server

import (
	"bufio"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
)

// TestOpenAPICoversRoutes keeps api/openapi.yaml true to the router: every
// route is documented, and every documented operation is routed.
func TestOpenAPICoversRoutes(t *testing.T) {
	f, err := os.Open("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	documented := map[string]bool{}
	pathRE := regexp.MustCompile(`^  (/\S*):\s*$`)
	methodRE := regexp.MustCompile(`^    (get|post|put|patch|delete|options):\s*$`)
	var path string
	sc := bufio.NewScanner(f)
	inPaths := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "paths:":
			inPaths = true
		case inPaths && len(line) > 0 && line[0] != ' ':
			inPaths = false
		case !inPaths:
		case pathRE.MatchString(line):
			path = pathRE.FindStringSubmatch(line)[1]
		case methodRE.MatchString(line):
			documented[strings.ToUpper(methodRE.FindStringSubmatch(line)[1])+" "+path] = true
		}
	}
	s := New(nil, api.VersionInfo{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	routed := map[string]bool{}
	for _, r := range s.routes {
		pattern := strings.ReplaceAll(r.pattern, "...}", "}")
		routed[pattern] = true
		if !documented[pattern] {
			t.Errorf("route %s is not in api/openapi.yaml", pattern)
		}
	}
	for op := range documented {
		if !routed[op] {
			t.Errorf("api/openapi.yaml documents %s, which is not routed", op)
		}
	}
}
