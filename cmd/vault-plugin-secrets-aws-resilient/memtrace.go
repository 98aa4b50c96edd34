//go:build memtrace

// A plugin binary built with -tags memtrace traces its own memory, for
// BENCHMARKS.md's RSS figures under Vault (section f): with
// AWS_RESILIENT_MEMTRACE_DIR set (e.g. through the bench driver's
// -scale-plugin-env), it appends one line a second to memtrace.tsv there
// (RSS and the Go runtime's memory classes, the live heap, the soft limit)
// and writes a heap profile, heap-<unix seconds>.pprof, every 20 s. Release
// builds carry none of it.
//
// A file named heapdump.request in that directory asks for a full heap
// dump (runtime/debug.WriteHeapDump after a GC, every live object with its
// address, size and contents): the plugin writes heap.dump there and removes
// the request. It shows which pages of which size class hold how little,
// what the heap profile's sampled sizes cannot.
//
//	go build -tags memtrace -ldflags "-X main.version=v0.1.0-dev" -o plugin ./cmd/vault-plugin-secrets-aws-resilient
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

func init() {
	dir := os.Getenv("AWS_RESILIENT_MEMTRACE_DIR")
	if dir == "" {
		return
	}
	// Sample every 64 KiB allocated (default 512 KiB): per-key structures
	// of a few dozen bytes then show at 100 000 keys.
	runtime.MemProfileRate = 64 << 10
	go memtrace(dir)
}

var memtraceMetrics = []string{
	"/gc/heap/live:bytes",
	"/gc/gomemlimit:bytes",
	"/memory/classes/total:bytes",
	"/memory/classes/heap/released:bytes",
	"/memory/classes/heap/free:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes",
	"/memory/classes/heap/stacks:bytes",
	"/memory/classes/metadata/other:bytes",
	"/gc/heap/goal:bytes",
	"/gc/cycles/total:gc-cycles",
	"/sched/goroutines:goroutines",
}

func memtrace(dir string) {
	f, err := os.OpenFile(filepath.Join(dir, "memtrace.tsv"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	cols := []string{"unix", "rss_kib", "anon_kib"}
	for _, m := range memtraceMetrics {
		cols = append(cols, strings.TrimSuffix(strings.TrimPrefix(m, "/"), ":bytes"))
	}
	fmt.Fprintln(f, strings.Join(cols, "\t"))
	s := make([]rtmetrics.Sample, len(memtraceMetrics))
	for i, m := range memtraceMetrics {
		s[i].Name = m
	}
	lastProfile := time.Now()
	for now := range time.Tick(time.Second) {
		rtmetrics.Read(s)
		rss, anon := procRSS()
		row := []string{strconv.FormatInt(now.Unix(), 10), strconv.FormatInt(rss, 10), strconv.FormatInt(anon, 10)}
		for i := range s {
			var v uint64
			if s[i].Value.Kind() == rtmetrics.KindUint64 {
				v = s[i].Value.Uint64()
			}
			row = append(row, strconv.FormatUint(v, 10))
		}
		fmt.Fprintln(f, strings.Join(row, "\t"))
		if _, err := os.Stat(filepath.Join(dir, "heapdump.request")); err == nil {
			heapDump(dir)
		}
		if now.Sub(lastProfile) >= 20*time.Second {
			lastProfile = now
			if p, err := os.Create(filepath.Join(dir, fmt.Sprintf("heap-%d.pprof", now.Unix()))); err == nil {
				_ = pprof.Lookup("heap").WriteTo(p, 0)
				p.Close()
			}
		}
	}
}

// heapDump writes heap.dump in dir (through a temporary name, so a reader
// never sees half of it) and removes the request.
func heapDump(dir string) {
	_ = os.Remove(filepath.Join(dir, "heapdump.request"))
	tmp := filepath.Join(dir, "heap.dump.tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return
	}
	runtime.GC()
	debug.WriteHeapDump(f.Fd())
	if f.Close() == nil {
		_ = os.Rename(tmp, filepath.Join(dir, "heap.dump"))
	}
}

// procRSS reads VmRSS and RssAnon, in KiB.
func procRSS() (rss, anon int64) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(fs[0], 10, 64)
		switch k {
		case "VmRSS":
			rss = n
		case "RssAnon":
			anon = n
		}
	}
	return rss, anon
}
