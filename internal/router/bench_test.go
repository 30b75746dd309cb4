package router

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/server"
)

// BenchmarkCreate: creates through a Router (its real listener, the
// cluster's TLS to the nodes) to nodes that answer at once, for the
// gateway's own cost per create (go test -bench Create -cpuprofile).
func BenchmarkCreate(b *testing.B) {
	for _, nodes := range []int{1, 100} {
		b.Run(fmt.Sprint(nodes), func(b *testing.B) { benchCreate(b, nodes) })
	}
}

func benchCreate(b *testing.B, count int) {
	nodeTLS, gwTLS := loadTrust(b)
	var recs []api.Node
	for i := range count {
		var seq atomic.Int64
		tag := fmt.Sprintf("s%02d", i)
		addr := serve(b, server.RequireToken(nodeToken, quiet, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":"%s%09s","state":"running"}`, tag, strconv.FormatInt(seq.Add(1), 36))
		})), 0, nodeTLS.ServerConfig())
		recs = append(recs, api.Node{Name: "n" + tag, Tag: tag, Address: "https://" + addr, State: api.NodeReady,
			Capacity: api.NodeResources{CPUs: 1e9, MemoryBytes: 1 << 60, DiskBytes: 1 << 60, Sandboxes: 1 << 40},
			Pools:    map[string]int{"image:host": 4}})
	}
	rt := New(Config{NodeTokens: tokens(b, nodeToken), TLS: gwTLS, Log: quiet, Defaults: api.Resources{CPUs: 2, MemoryBytes: 1 << 30, DiskBytes: 10 << 30}})
	rt.SetNodes(recs)
	// The gateway's goroutines (its server's, and the transport's it
	// starts) carry the label part=gateway: `go tool pprof
	// -tagfocus part=gateway` shows its CPU alone.
	var gw string
	pprof.Do(context.Background(), pprof.Labels("part", "gateway"), func(context.Context) {
		gw = serve(b, rt.Handler(tokens(b, clientToken)), 0, nil)
	})
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
	body := []byte("{}")
	b.SetParallelism(8)
	b.ResetTimer()
	// CPU time, not wall time, is what the gateway's cost is judged by on
	// a shared host: the process's (client, gateway and nodes together;
	// the client and nodes cost the same whatever the gateway does).
	cpu0 := processCPU()
	defer func() { b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op") }()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest(http.MethodPost, "http://"+gw+"/v1/sandboxes", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+clientToken)
			resp, err := c.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			msg, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				b.Errorf("status %d: %s", resp.StatusCode, msg)
				return
			}
		}
	})
}

// processCPU is the CPU time this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPick: placing one create among 100 ready nodes.
func BenchmarkPick(b *testing.B) {
	rt := New(Config{})
	var recs []api.Node
	for i := range 100 {
		recs = append(recs, api.Node{Name: fmt.Sprintf("n%02d", i), Tag: fmt.Sprintf("s%02d", i), Address: "http://127.0.0.1:1", State: api.NodeReady,
			Capacity: api.NodeResources{CPUs: 1e9, MemoryBytes: 1 << 60, DiskBytes: 1 << 60, Sandboxes: 1 << 40},
			Pools:    map[string]int{"image:host": 4}})
	}
	rt.SetNodes(recs)
	d := demand{res: api.NodeResources{CPUs: 2, MemoryBytes: 1 << 30, DiskBytes: 10 << 30, Sandboxes: 1}, pools: []string{"image:host"}}
	tried := map[string]bool{}
	b.ReportAllocs()
	cpu0 := processCPU()
	defer func() { b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op") }()
	for b.Loop() {
		if _, _, err := rt.pick(d, tried); err != nil {
			b.Fatal(err)
		}
	}
}
