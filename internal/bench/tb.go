// Package bench holds the pieces of cmd/aws-resilient-bench: a testing.TB
// for running internal/vaulttest outside `go test`, a closed-loop HTTP load
// generator, the baseline refresh policies the herd is compared with,
// /proc readings, the result table and the PNG charts.
package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
)

// TB lets the benchmark driver use internal/vaulttest, which is written
// against testing.TB. Fatal panics with a value Run recovers, so a failed
// set-up step unwinds to the driver, which then runs every cleanup (stopping
// Vault, the plugin and the emulators) before it exits.
//
// testing.TB has an unexported method so that only package testing can
// implement it; embedding the interface (left nil) provides that method,
// and every exported method is defined here, so the nil value is never used.
type TB struct {
	testing.TB

	name string
	out  io.Writer
	// Keep leaves the temporary directory (server logs) in place.
	Keep bool

	mu       sync.Mutex // guards cleanups, failed, tmp and closing
	cleanups []func()
	failed   bool
	tmp      string
	// closing is set by the first Close and closed when its cleanups are
	// done; a later Close waits for it.
	closing chan struct{}
}

// NewTB returns a TB that logs to out.
func NewTB(name string, out io.Writer) *TB { return &TB{name: name, out: out} }

// fatal is the panic value of Fatal and FailNow.
type fatal struct{ msg string }

// Run calls fn and turns a Fatal inside it into an error.
func (t *TB) Run(fn func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if f, ok := r.(fatal); ok {
				err = fmt.Errorf("%s", f.msg)
				return
			}
			panic(r)
		}
	}()
	fn()
	return nil
}

// Close runs the cleanups, newest first, and removes the temporary
// directory. It is safe to call more than once and from a signal handler: a
// second call returns when the first one has finished, so the driver's main
// goroutine, whose work fails as the handler stops the servers under it,
// cannot exit the process while the handler is still stopping them.
func (t *TB) Close() {
	t.mu.Lock()
	if t.closing != nil {
		done := t.closing
		t.mu.Unlock()
		<-done
		return
	}
	t.closing = make(chan struct{})
	defer close(t.closing)
	fns := t.cleanups
	t.cleanups = nil
	tmp := t.tmp
	t.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		func() {
			defer func() {
				if r := recover(); r != nil {
					fmt.Fprintf(t.out, "cleanup: %v\n", r)
				}
			}()
			fns[i]()
		}()
	}
	if tmp != "" && !t.Keep {
		os.RemoveAll(tmp)
	} else if tmp != "" {
		fmt.Fprintf(t.out, "kept %s\n", tmp)
	}
}

func (t *TB) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

func (t *TB) Error(args ...any) { t.Log(args...); t.Fail() }
func (t *TB) Errorf(format string, args ...any) {
	t.Logf(format, args...)
	t.Fail()
}
func (t *TB) Fail() {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
}
func (t *TB) FailNow() { t.Fail(); panic(fatal{"FailNow"}) }
func (t *TB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}
func (t *TB) Fatal(args ...any) { t.Fail(); panic(fatal{fmt.Sprint(args...)}) }
func (t *TB) Fatalf(format string, args ...any) {
	t.Fail()
	panic(fatal{fmt.Sprintf(format, args...)})
}
func (t *TB) Helper()                          {}
func (t *TB) Log(args ...any)                  { fmt.Fprintln(t.out, args...) }
func (t *TB) Logf(format string, args ...any)  { fmt.Fprintf(t.out, format+"\n", args...) }
func (t *TB) Name() string                     { return t.name }
func (t *TB) Setenv(key, value string)         { os.Setenv(key, value) }
func (t *TB) Chdir(dir string)                 { _ = os.Chdir(dir) }
func (t *TB) Skip(args ...any)                 { t.Fatal(append([]any{"skip: "}, args...)...) }
func (t *TB) SkipNow()                         { t.Fatal("skip") }
func (t *TB) Skipf(format string, args ...any) { t.Fatalf("skip: "+format, args...) }
func (t *TB) Skipped() bool                    { return false }
func (t *TB) Context() context.Context         { return context.Background() }
func (t *TB) Output() io.Writer                { return t.out }
func (t *TB) Attr(key, value string)           {}
func (t *TB) ArtifactDir() string              { return t.TempDir() }

// TempDir returns a new directory under the TB's own temporary directory.
func (t *TB) TempDir() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.tmp == "" {
		d, err := os.MkdirTemp("", "aws-resilient-bench-")
		if err != nil {
			panic(fatal{err.Error()})
		}
		t.tmp = d
	}
	d, err := os.MkdirTemp(t.tmp, "")
	if err != nil {
		panic(fatal{err.Error()})
	}
	return d
}
