package vaulttest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is a child process started in its own process group, with its
// stdout and stderr going to LogPath.
type Process struct {
	Name    string
	LogPath string

	bin  string
	args []string
	env  []string
	dir  string

	mu      sync.Mutex // guards cmd, done and waitErr across restarts
	cmd     *exec.Cmd
	done    chan struct{} // closed when the current cmd has exited
	waitErr error
}

// StartProcess starts bin with args in its own process group. Output goes to
// <logDir>/<name>.log (appended, so a restarted process keeps one log). The
// process group is stopped in tb.Cleanup, and the log tail is printed there
// if the test failed.
func StartProcess(tb testing.TB, name, logDir string, env []string, bin string, args ...string) *Process {
	tb.Helper()
	p := &Process{
		Name:    name,
		LogPath: filepath.Join(logDir, name+".log"),
		bin:     bin,
		args:    args,
		env:     env,
		dir:     logDir,
	}
	if err := p.start(); err != nil {
		tb.Fatalf("starting %s: %v", name, err)
	}
	tb.Cleanup(func() {
		p.Stop(10 * time.Second)
		if tb.Failed() {
			tb.Logf("--- last lines of %s (%s) ---\n%s", name, p.LogPath, Tail(p.LogPath, 60))
		}
	})
	return p
}

func (p *Process) start() error {
	f, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = p.env
	cmd.Dir = p.dir
	cmd.Stdout = f
	cmd.Stderr = f
	// Own process group: Vault's plugin processes are its children and
	// inherit the group, so one kill of the group leaves nothing behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return err
	}
	// The group, for whoever cleans up after a test process that died
	// before its cleanups (state.go).
	notePgrp(cmd.Process.Pid)
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done, p.waitErr = cmd, done, nil
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		f.Close()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// Restart starts the process again with the same command line. It must have
// been stopped first.
func (p *Process) Restart(tb testing.TB) {
	tb.Helper()
	if p.Running() {
		tb.Fatalf("restart %s: still running", p.Name)
	}
	if err := p.start(); err != nil {
		tb.Fatalf("restarting %s: %v", p.Name, err)
	}
}

// PID returns the current process id.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// Running reports whether the process has not exited yet.
func (p *Process) Running() bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Done is closed when the process exits.
func (p *Process) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Err returns the process's exit error once it has exited.
func (p *Process) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

// Signal sends sig to the whole process group.
func (p *Process) Signal(sig syscall.Signal) error {
	return syscall.Kill(-p.PID(), sig)
}

// Stop sends SIGTERM to the process group, waits up to grace for the process
// to exit, then SIGKILLs the group. Safe to call on an exited process.
func (p *Process) Stop(grace time.Duration) {
	if !p.Running() {
		// The leader is gone but children (plugins) may linger.
		_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
		return
	}
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-p.Done():
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	<-p.Done()
}

// Kill SIGKILLs the process group and waits for the leader to exit.
func (p *Process) Kill() {
	_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	<-p.Done()
}

// WaitLog waits until a line of the log matches re and returns the first
// submatch (or the whole match when re has no group).
func (p *Process) WaitLog(tb testing.TB, re *regexp.Regexp, timeout time.Duration) string {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if b, err := os.ReadFile(p.LogPath); err == nil {
			if m := re.FindSubmatch(b); m != nil {
				if len(m) > 1 {
					return string(m[1])
				}
				return string(m[0])
			}
		}
		if !p.Running() {
			tb.Fatalf("%s exited (%v) before logging %q; log:\n%s", p.Name, p.Err(), re, Tail(p.LogPath, 40))
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s did not log %q within %s; log:\n%s", p.Name, re, timeout, Tail(p.LogPath, 40))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// secretLine matches the lines of a Vault log that carry a credential: the
// dev server's banner prints the root token and unseal key.
var secretLine = regexp.MustCompile(`(?i)(root token|unseal key|initial root token)`)

// Tail returns the last n lines of a log file with credential lines blanked.
func Tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	for i, l := range lines {
		if secretLine.MatchString(l) {
			lines[i] = "<line with a Vault credential removed>"
		}
	}
	return strings.Join(lines, "\n")
}

// Descendants returns the pids of every process below pid in the process tree.
func Descendants(pid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	children := map[int][]int{}
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// The command name in field 2 may contain spaces and parentheses:
		// the fields after the last ')' are unambiguous.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		children[ppid] = append(children[ppid], child)
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out, nil
}

// ExeName returns the base name of the executable of a running process.
func ExeName(pid int) (string, error) {
	p, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		return "", err
	}
	return filepath.Base(strings.TrimSuffix(p, " (deleted)")), nil
}
